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
