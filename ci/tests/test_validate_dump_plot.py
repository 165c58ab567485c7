"""``validate --dump DIR`` and ``validate --plot PATH`` (ci/commands/dump.py)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from gdn2_oracle.ci.commands.dump import load_dump
from gdn2_oracle.oracle import INPUTS, RESULTS

WRONG = "gdn2_oracle.kernels.testing"
TWO_CASES = ("--cases", "golden", "--case", "len_1", "--case", "decay_moderate", "--dtype", "float32")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """One run of the perturbed kernel on two golden cases with --dump and --plot: (exit, stdout, dump, plot)."""
    from gdn2_oracle.ci.cli import main

    root = tmp_path_factory.mktemp("dump")
    code = main(["validate", "--kernel", f"{WRONG}:perturbed", *TWO_CASES, "--no-progress",
                 "--dump", str(root / "dump"), "--plot", str(root / "plots") + "/"])
    return code, root / "dump", root / "plots" / "validate.png"


def test_dump_writes_a_folder_per_failing_case_with_the_arrays(dumped):
    code, root, _ = dumped
    assert code == 1
    kernel_dir = root / f"{WRONG}_perturbed"
    assert sorted(p.name for p in kernel_dir.iterdir()) == ["decay_moderate", "len_1"]
    for case in ("len_1", "decay_moderate"):
        arrays, record, _ = load_dump(kernel_dir / case)
        assert record["case"] == case and record["grade"] == "FAIL"
        assert {f"input_{n}" for n in INPUTS} | {"input_h0", "input_do", "input_dfinal_state"} <= set(arrays)
        assert {f"got_{n}" for n in RESULTS} <= set(arrays) and {f"ref_{n}" for n in RESULTS} <= set(arrays)
        for v in record["verdicts"]:
            diff = arrays[f"got_{v['name']}"].astype(np.float64) - arrays[f"ref_{v['name']}"]
            assert arrays[f"got_{v['name']}"].shape == arrays[f"ref_{v['name']}"].shape
            if v["grade"] == "FAIL":
                assert np.any(diff != 0), v["name"]
                if f"profile_{v['name']}" in arrays:  # a per-token result: one error per token
                    assert arrays[f"profile_{v['name']}"].shape == (arrays["input_q"].shape[1],)
        assert "profile_o" in arrays


def test_dump_plots_error_per_token_of_each_failing_per_token_result(dumped):
    _, root, _ = dumped
    folder = root / f"{WRONG}_perturbed" / "decay_moderate"
    _, record, _ = load_dump(folder)
    failing = {v["name"] for v in record["verdicts"] if v["grade"] != "PASS"}
    pngs = {p.name.removesuffix("_per_token.png") for p in folder.glob("*_per_token.png")}
    assert "o" in pngs and pngs <= failing and failing - pngs <= {"final_state", "dh0"}  # not per token
    for p in folder.glob("*.png"):
        assert p.read_bytes().startswith(PNG)


def test_dump_reproducer_runs_and_prints_the_failing_grade(dumped):
    _, root, _ = dumped
    _, _, line = load_dump(root / f"{WRONG}_perturbed" / "len_1")
    assert line.startswith('python -c "') and "\n" not in line and "Case.golden('len_1')" in line
    code = line.removeprefix('python -c "').removesuffix('"')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r.split()[0]: r for r in proc.stdout.splitlines() if r.strip()}
    assert rows["o"].split()[6] == "FAIL" and "final_state" in rows


def test_plot_writes_a_png(dumped):
    _, _, plot = dumped
    assert plot.read_bytes().startswith(PNG) and plot.stat().st_size > 5000


def test_a_passing_kernel_dumps_nothing(cli, tmp_path):
    code, out, _ = cli("validate", "--kernel", "pairwise", "--cases", "golden", "--case", "len_1", "--dtype",
                       "float32", "--no-progress", "--dump", tmp_path / "d", "--plot", tmp_path / "v.png")
    assert code == 0 and "dump: 0 case folder(s)" in out
    assert list((tmp_path / "d").iterdir()) == [] and (tmp_path / "v.png").read_bytes().startswith(PNG)


def test_a_raising_kernel_dumps_its_inputs_verdicts_and_reproducer(cli, tmp_path):
    code, _, _ = cli("validate", "--kernel", f"{WRONG}:broken", "--cases", "golden", "--case", "len_1", "--dtype",
                     "float32", "--no-progress", "--dump", tmp_path / "d", "--plot", tmp_path)
    assert code == 1
    arrays, record, line = load_dump(tmp_path / "d" / f"{WRONG}_broken" / "len_1")
    assert record["outcome"] == "error" and "always fails" in record["error"]
    assert "input_q" in arrays and not any(k.startswith(("got_", "ref_")) for k in arrays)
    assert "Case.golden('len_1')" in line and (tmp_path / "validate.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize("option, bad", [
    ("--plot", "report.txt"),          # wrong suffix
    ("--plot", "{file}/x.png"),        # under a file
    ("--dump", "{file}"),              # a file, not a directory
    ("--dump", "{file}/sub"),          # under a file
])
def test_bad_dump_and_plot_paths_exit_2_before_any_work(cli, tmp_path, monkeypatch, option, bad):
    from gdn2_oracle.ci.commands import validate

    def no_work(*a, **k):
        raise AssertionError("validation ran")

    monkeypatch.setattr(validate, "run_validation", no_work)
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = cli("validate", "--kernel", "pairwise", *TWO_CASES, "--no-progress", option,
                       bad.format(file=afile) if "{" in bad else tmp_path / bad)
    assert code == 2 and option in err


# --- a serving case: per-call arrays and the per-call plot -------------------------------------------------------

SERVING_MUTANT = "gdn2_oracle.kernels.testing_decode:mutant[factory=1,name=wrong_slot]"  # reads pool[n], not idx


def _speculative_case():
    from gdn2_oracle.ci.running.serving import serving_cases

    [case] = serving_cases(("float32",), only=("speculative_accept",))
    return case


@pytest.fixture(scope="module")
def serving_dumped(tmp_path_factory):
    """validate --dump of the wrong-slot decode mutant on one speculative session: (exit, case folder, session)."""
    from gdn2_oracle.ci.cli import main
    from gdn2_oracle.oracle.serving import SPECULATIVE_MODE

    case = _speculative_case()
    root = tmp_path_factory.mktemp("serving_dump")
    code = main(["validate", "--kernel", SERVING_MUTANT, "--modes", SPECULATIVE_MODE, "--cases", "quick",
                 "--case", case.name, "--dtype", "float32", "--no-progress", "--dump", str(root)])
    [kernel_dir] = list(root.iterdir())
    return code, kernel_dir / case.name, case.session


def test_a_serving_dump_holds_every_call_s_inputs_results_and_reference(serving_dumped):
    from gdn2_oracle.ci.grading.serving import INPUT_NAMES

    code, folder, session = serving_dumped
    assert code == 1
    arrays, record, line = load_dump(folder)
    assert record["grade"] == "FAIL" and "--case" in line and session.name in line
    assert not any(k.startswith(("input_", "got_", "ref_")) for k in arrays)  # the per-call names only
    n = len(session.calls)
    assert f"call{n - 1}_got_o" in arrays and not any(k.startswith(f"call{n}_") for k in arrays)
    assert np.array_equal(arrays["initial_pool"], session.pool, equal_nan=True)
    for i, call in enumerate(session.calls):
        key = f"call{i}_"
        for name, x in zip(INPUT_NAMES, call.inputs()):
            assert np.array_equal(arrays[key + "input_" + name], x, equal_nan=True), (i, name)
        assert np.array_equal(arrays[key + "state_indices"], call.state_indices)
        for name in ("num_accepted_tokens", "cu_seqlens"):
            x = getattr(call, name)
            assert (key + name in arrays) == (x is not None) and (x is None or np.array_equal(arrays[key + name], x))
        B, T = call.q.shape[:2]
        o_shape = (B, T, call.v.shape[2], call.v.shape[3])
        assert arrays[key + "got_o"].shape == arrays[key + "ref_o"].shape == o_shape, i
        assert arrays[key + "got_pool"].shape == arrays[key + "ref_pool"].shape == session.shape, i
        assert arrays[key + "ratio_o"].shape == (B, T) and arrays[key + "ratio_state"].shape == session.shape[:1]
        assert np.array_equal(arrays[key + "read_slots"], call.plan(session.shape[0]).read_slots)
    assert arrays["per_call_ratio_o"].shape == arrays["per_call_ratio_state"].shape == (n,)


def test_a_serving_dump_s_pools_differ_where_the_mutant_reads_the_wrong_slot(serving_dumped):
    """Call 0 of the session: sequence n must start from slot idx[n, 0]; the mutant starts from slot n, right only for
    sequence 0. The reference pool is the oracle's; the kernel's differs exactly at the wrong sequences' slots."""
    _, folder, session = serving_dumped
    arrays, _, _ = load_dump(folder)
    call = session.calls[0]
    oracle_pool = call.apply(session.pool).pool
    got, ref = arrays["call0_got_pool"].astype(np.float64), arrays["call0_ref_pool"]
    right = wrong = 0
    for seq in call.plan(session.shape[0]).sequences:
        if not seq.live:
            continue
        slots = [s for _, s in seq.writes if np.all(np.isfinite(oracle_pool[s]))]
        assert slots, seq
        np.testing.assert_allclose(ref[slots], oracle_pool[slots], rtol=0, atol=0)
        ratio = arrays["call0_ratio_state"][slots]
        if seq.read == seq.n:  # the mutant's slot is the right one
            np.testing.assert_allclose(got[slots], ref[slots], rtol=1e-4, atol=1e-5)
            assert np.all(ratio <= 1) and np.all(arrays["call0_ratio_o"][seq.row, 0] <= 1), seq
            right += 1
        else:
            assert not np.allclose(got[slots], ref[slots], rtol=1e-2, atol=1e-2, equal_nan=False), seq
            assert np.all(~(ratio <= 1)) and not arrays["call0_ratio_o"][seq.row, 0] <= 1, seq
            wrong += 1
    assert right == 1 and wrong >= 3


def test_a_serving_dump_plots_the_calls_and_names_the_first_wrong_sequence_and_slot(serving_dumped):
    from gdn2_oracle.ci.commands.serving_dump import first_wrong, serving_grids

    _, folder, session = serving_dumped
    png = folder / "serving_per_call.png"
    assert png.read_bytes().startswith(PNG) and png.stat().st_size > 5000
    assert not list(folder.glob("*_per_token.png"))
    arrays, _, _ = load_dump(folder)
    o_grid, state_grid, plans, offsets, marks = serving_grids(arrays)
    assert len(plans) == len(session.calls) and state_grid.shape == (session.shape[0], len(session.calls))
    seq1 = plans[0].sequences[1]
    assert o_grid[0, 0] < 0 < o_grid[1, 0] and state_grid[seq1.read, 0] > 0  # sequence 0 right, sequence 1 wrong
    assert (0, seq1.read) in marks["read"] and marks["padding"]  # the mutant's padding row outputs nonzero
    line = first_wrong(arrays, plans)
    assert line.startswith(f"first over tolerance: call 0, o of sequence(s) 1 (must read slot {seq1.read}, a=1)"), line


def test_a_serving_case_keeps_no_arrays_when_it_passes_and_the_inputs_when_the_kernel_raises():
    from gdn2_oracle.kernels import KernelSpec

    case = _speculative_case()
    assert case.run(KernelSpec.parse("decode").build(), capture=True).arrays == {}

    def raises(q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None,
               scale=None):
        raise RuntimeError("always fails")

    result = case.run(raises, capture=True)
    assert result.outcome == "error"
    calls = result.arrays["serving"]
    assert {f"call{i}_input_q" for i in range(len(case.session.calls))} <= set(calls)
    assert not any("got" in k or "ref" in k for k in calls)
