"""Two processes as two hosts (``gdn2-oracle --distributed`` on this CPU: a local coordinator, 4 host devices
each, Gloo collectives): ``validate --mesh`` across both, and the float64 oracle split over the hosts
(ci/running/multihost.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from gdn2_oracle.ci.commands.validate import GEN

# One host's run: `gdn2-oracle --distributed ... validate --mesh data=2,seq=4` on a mesh spanning both hosts
# (T=130 does not divide by 4: identity-token padding), then the oracle split over the hosts against the
# one-process oracle. argv: coordinator address, process id, JSON report path.
HOST = """
import json, sys
import numpy as np
from gdn2_oracle.ci.running import harness, multihost
from gdn2_oracle.ci.grading import references
from gdn2_oracle.ci.cli import main
from gdn2_oracle.oracle import make_problem, random_cotangents

asked, oracle_share = [], references.reference_results
references.reference_results = lambda p, *a, **k: (asked.append(list(p.shape)), oracle_share(p, *a, **k))[1]
out = {"validate": main(["--distributed", "--coordinator", sys.argv[1], "--num-processes", "2",
                         "--process-id", sys.argv[2], "validate", "--mesh", "data=2,seq=4",
                         "--kernel", "cp-factorized[chunk_size=16,leaf=4]", "--cases", "quick",
                         "--case", "gen_resets_T130", "--dtype", "float32", "--no-progress", "--json", sys.argv[3]])}
out["asked_by_validate"], asked[:] = list(asked), []
import jax
out["devices"], out["identical"] = [jax.device_count(), jax.local_device_count()], {}
for shape in [(3, 24, 2, 4, 4), (1, 24, 3, 4, 4)]:  # split over the batch; over the heads
    p = make_problem(*shape, decay="resets", initial_state=True, seed=2)
    do, dfs = random_cotangents(p, seed=1)
    got, want = multihost.reference_results(p, do, dfs), oracle_share(p, do, dfs)
    out["identical"][str(shape)] = sorted(got) == sorted(want) and all(np.array_equal(got[n], want[n]) for n in want)
out["asked"] = list(asked)
print("RESULT", json.dumps(out), flush=True)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Each host's RESULT dict and JSON report."""
    tmp = tmp_path_factory.mktemp("hosts")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_", "XLA_"))},
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    address = f"localhost:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", HOST, address, str(i), str(tmp / f"host{i}.json")], cwd=tmp,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=600)[0])
        finally:
            proc.kill()
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0 and "RESULT" in out, out[-4000:]
    return [(json.loads(out.rsplit("RESULT", 1)[1]), json.loads((tmp / f"host{i}.json").read_text()))
            for i, out in enumerate(outs)]


def test_each_host_sees_the_global_devices(two_hosts):
    assert [r["devices"] for r, _ in two_hosts] == [[8, 4], [8, 4]]


def test_split_oracle_is_the_one_process_oracle_bit_for_bit(two_hosts):
    for result, _ in two_hosts:
        assert result["identical"] == {"(3, 24, 2, 4, 4)": True, "(1, 24, 3, 4, 4)": True}


def test_each_host_computes_only_its_share(two_hosts):
    # B=3 over two hosts: batch entries [0, 2) and [2, 3); B=1, H=3: heads [0, 2) and [2, 3)
    assert two_hosts[0][0]["asked"] == [[2, 24, 2, 4, 4], [1, 24, 2, 4, 4]]
    assert two_hosts[1][0]["asked"] == [[1, 24, 2, 4, 4], [1, 24, 1, 4, 4]]
    # validate's generated case (B = 2 of validate.GEN): one batch entry a host, not the whole twice
    B, *rest = GEN
    assert B == 2 and [r["asked_by_validate"] for r, _ in two_hosts] == [[[1, *rest]]] * 2


def test_validate_on_a_mesh_across_hosts_passes_with_identical_reports(two_hosts):
    assert [r["validate"] for r, _ in two_hosts] == [0, 0]
    reports = [report for _, report in two_hosts]
    assert reports[0]["mesh"] == "data=2,seq=4"
    assert _untimed(reports[0]) == _untimed(reports[1])  # the same verdicts, errors and ratios on both hosts


def _untimed(x):
    """A report without its timings and creation stamps (which differ between hosts)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if "second" not in k and "time" not in k and k != "created"}
    return [_untimed(v) for v in x] if isinstance(x, list) else x


@pytest.mark.parametrize(("argv", "named"), [
    (["--coordinator", "localhost:1"], "--distributed"),
    (["--distributed", "--num-processes", "2"], "--process-id"),
    (["--distributed", "--num-processes", "0", "--process-id", "0"], "--num-processes"),
    (["--distributed", "--num-processes", "2", "--process-id", "2"], "--process-id"),
])
def test_bad_distributed_options_name_the_option(argv, named, capsys):
    from gdn2_oracle.ci.cli import main

    assert main([*argv, "validate", "--cases", "quick", "--case", "len_1"]) == 2
    assert named in capsys.readouterr().err


# --- start-up: every argument checked before JAX is called, a time limit, a message for each mistake ---------

@pytest.fixture
def jax_not_called(monkeypatch):
    import jax

    def refuse(**kwargs):
        raise AssertionError(f"jax.distributed.initialize was called with {kwargs}")

    monkeypatch.setattr(jax.distributed, "initialize", refuse)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)


@pytest.mark.parametrize("argv, needle", [
    (["--coordinator", "notaport", "--num-processes", "2", "--process-id", "0"], "expected HOST:PORT"),
    (["--coordinator", "host:99999", "--num-processes", "2", "--process-id", "0"], "a port 1..65535"),
    (["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "2"], "0 <= process_id < 2"),
    (["--coordinator", "localhost:1234", "--num-processes", "2"], "go together"),
    (["--num-processes", "2", "--process-id", "1"], "need --coordinator"),
    (["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "1", "--init-timeout", "0"],
     "positive number of seconds"),
])
def test_bad_distributed_options_are_usage_errors_before_jax(cli, jax_not_called, argv, needle):
    code, _, err = cli("--distributed", *argv, "validate", "--cases", "golden", "--case", "len_1")
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_a_second_process_0_is_refused_with_a_message(cli, jax_not_called):
    with socket.socket() as server:  # the first process 0's coordinator
        server.bind(("localhost", 0))
        server.listen()
        port = server.getsockname()[1]
        code, _, err = cli("--distributed", "--coordinator", f"localhost:{port}", "--num-processes", "2",
                           "--process-id", "0", "validate", "--cases", "golden", "--case", "len_1")
    assert code == 2 and "already served" in err and "--process-id 0" in err, err


def test_distributed_alone_without_a_cluster_says_what_to_give(cli, monkeypatch):
    import jax

    def no_cluster(**kwargs):
        raise ValueError("coordinator_address should be defined.")

    monkeypatch.setattr(jax.distributed, "initialize", no_cluster)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    code, _, err = cli("--distributed", "validate", "--cases", "golden", "--case", "len_1")
    assert code == 2 and "no cluster was detected" in err and "--coordinator HOST:PORT" in err, err
    assert "--coordinator-address" not in err


def test_a_coordinator_nobody_serves_times_out_with_a_message_not_an_abort():
    port = _free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))}, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "gdn2_oracle.ci.cli", "--distributed", "--coordinator",
                           f"localhost:{port}", "--num-processes", "2", "--process-id", "1", "--init-timeout", "2",
                           "validate", "--cases", "golden", "--case", "len_1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "did not join within 2 s" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_ctrl_c_is_honoured_while_waiting_for_the_other_processes():
    from gdn2_oracle.ci.testing import interrupt_after

    argv = ["gdn2_oracle.ci.cli", "--distributed", "--coordinator", f"localhost:{_free_port()}", "--num-processes",
            "2", "--process-id", "1", "validate", "--cases", "golden", "--case", "len_1"]
    t0 = time.monotonic()
    code, out, err, _ = interrupt_after(argv, "joining the distributed run")
    assert code == 130 and "interrupted" in err and "Traceback" not in err, out + err
    assert time.monotonic() - t0 < 60
