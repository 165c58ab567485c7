"""The ``gdn2-oracle`` CLI: exit codes, JSON report schema, validation-gated benchmarks.

Everything runs in-process (``ci.cli.main([...])``) at tiny shapes; the deliberately wrong kernels
live in the test-support module ``gdn2_oracle.kernels.testing`` and are named by their import path.
"""

from __future__ import annotations

import json
import math

import pytest

from gdn2_oracle.ci.cli import build_parser
from gdn2_oracle.ci.commands import bench
from gdn2_oracle.ci.commands.output import UsageError, jsonable
from gdn2_oracle.ci.running.fingerprint import source_sha256
from gdn2_oracle.kernels import KernelSpec
from gdn2_oracle.oracle import RESULTS

WRONG = "gdn2_oracle.kernels.testing"
TINY_BENCH = ["--batch", "1", "--seq", "32", "--heads", "1", "--dim", "16", "--repeats", "2", "--no-progress"]
ONE_CASE = ["--cases", "golden", "--case", "decay_moderate", "--dtype", "float32", "--no-progress"]



# --- exit codes -----------------------------------------------------------------------------

def test_validate_passing_kernel_exits_0(cli, tmp_path):
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", f"{WRONG}:correct", *ONE_CASE, "--json", str(path))
    assert code == 0, out
    assert "overall: PASS" in out
    assert path.exists()


def test_validate_perturbed_kernel_exits_1(cli, tmp_path):
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", f"{WRONG}:perturbed", *ONE_CASE, "--json", str(path))
    assert code == 1, out
    assert "FAIL" in out and "decay_moderate" in out
    report = json.loads(path.read_text())
    assert report["passed"] is False
    [k] = report["kernels"]
    verdicts = {v["name"]: v for v in k["cases"][0]["verdicts"]}
    assert not verdicts["o"]["passed"]
    assert verdicts["o"]["err_ratio"] > 5e-4  # the 1e-3 perturbation is seen, not hidden


def test_validate_raising_kernel_exits_1_with_the_error(cli):
    code, out, _ = cli("validate", "--kernel", f"{WRONG}:broken", *ONE_CASE)
    assert code == 1
    assert "this kernel always fails" in out


@pytest.mark.parametrize("argv, needle", [
    (["validate", "--kernel", "no-such-kernel"], "unknown kernel 'no-such-kernel'"),
    (["validate", "--kernel", "no_such_module_xyz:fn"], "cannot import module 'no_such_module_xyz'"),
    (["validate", "--kernel", f"{WRONG}:missing"], "has no attribute 'missing'"),
    (["validate", "--kernel", "pairwise[bogus=1]"], "does not accept"),
    (["validate", "--dtype", "float16"], "unknown dtype"),
    (["validate", "--cases", "huge"], "invalid choice"),
    (["validate", "--case", "no_such_case", "--cases", "golden"], "unknown case"),
    (["bench", "--kernel", "no-such-kernel"], "unknown kernel"),
    (["bench", "--batch", "0"], "positive"),
    (["bench", "--tiles", "chunk_size"], "key=v1,v2"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_usage_errors_exit_2_with_a_clear_message(cli, argv, needle):
    code, _, err = cli(*argv)
    assert code == 2
    assert needle in err
    assert "error:" in err
    assert "Traceback" not in err


def test_help_exits_0(cli):
    code, out, _ = cli("validate", "--help")
    assert code == 0 and "--kernel" in out


# --- the JSON report ------------------------------------------------------------------------

def test_validate_json_schema(cli, tmp_path):
    path = tmp_path / "v.json"
    code, _, _ = cli("validate", "--kernel", "pairwise", "--kernel", f"{WRONG}:perturbed",
                     "--cases", "golden", "--case", "decay_moderate", "--case", "bf16_moderate",
                     "--dtype", "float32,bfloat16", "--no-progress", "--json", str(path))
    assert code == 1
    report = json.loads(path.read_text())  # plain JSON: no NaN/Infinity literals
    assert report["schema"] == "gdn2-oracle/validate/5"
    for key in ("device_kind", "platform", "jax_version", "git", "created"):
        assert key in report["environment"]
    assert report["cases"] == "golden" and report["dtypes"] == ["float32", "bfloat16"]
    assert report["n_cases"] == 2
    assert [k["name"] for k in report["kernels"]] == ["pairwise", f"{WRONG}:perturbed"]
    good, bad = report["kernels"]
    assert good["passed"] is True and bad["passed"] is False
    assert good["source"]["sha256"] and "gdn2_oracle.kernels.chunked" in good["source"]["modules"]
    for k in report["kernels"]:
        assert {c["case"] for c in k["cases"]} == {"decay_moderate", "bf16_moderate"}
        for c in k["cases"]:
            assert c["source"] == "golden" and c["dtype"] in ("float32", "bfloat16")
            assert [v["name"] for v in c["verdicts"]] == list(RESULTS)
            for v in c["verdicts"]:
                assert set(v) >= {"name", "err_ratio", "max_err", "tol_ratio", "tol_max", "rule", "passed", "note"}
        assert set(k["summary"]) == {"float32", "bfloat16"}
        for per in k["summary"].values():
            for name in RESULTS:
                assert per[name]["worst"]["case"] in ("decay_moderate", "bf16_moderate")


def test_jsonable_maps_non_finite_to_strings():
    assert jsonable({"a": [math.inf, -math.inf, math.nan, 1.5]}) == {"a": ["inf", "-inf", "nan", 1.5]}


def test_generated_quick_cases_are_oracle_checked():
    from gdn2_oracle import kernels
    from gdn2_oracle.ci.commands.validate import build_cases, run_case

    [case] = build_cases("quick", ("float32",), only=["gen_strong_negative_T130"])
    assert case.source == "generated" and case.regime["decay"] == "strong"
    res = run_case(kernels.get("factorized"), case)
    assert res.passed and res.outcome == "pass", res


# --- bench ----------------------------------------------------------------------------------

def test_bench_refuses_to_time_a_failing_kernel(cli, tmp_path):
    path = tmp_path / "b.json"
    code, out, _ = cli("bench", "--kernel", "pairwise[chunk_size=16]", "--kernel", f"{WRONG}:perturbed",
                       *TINY_BENCH, "--json", str(path))
    assert code == 1
    assert "REJECTED" in out and "Rejected (not timed)" in out
    report = json.loads(path.read_text())
    good, bad = report["results"]
    assert good["status"] == "ok" and good["median_s"] > 0
    assert bad["status"] == "rejected"
    assert "failed validation" in bad["reason"] and "FAIL" in bad["reason"] and "x the tolerance" in bad["reason"]
    assert "systematic" in bad["reason"]  # the case's diagnosis travels with the rejection
    assert "median_s" not in bad and all("median_s" not in e for e in bad["sweep"])


def test_bench_records_metadata_and_speedup(cli, tmp_path):
    path, png = tmp_path / "b.json", tmp_path / "b.png"
    code, out, _ = cli("bench", "--kernel", "pairwise[chunk_size=16]", "--kernel", "factorized[chunk_size=16,leaf=8]",
                       *TINY_BENCH, "--json", str(path), "--plot", str(png))
    assert code == 0, out
    report = json.loads(path.read_text())
    assert report["schema"] == "gdn2-oracle/bench/2"
    env = report["environment"]
    for key in ("device_kind", "platform", "jax_version", "jaxlib_version", "git", "created"):
        assert key in env
    assert set(env["git"]) == {"commit", "dirty"}
    first, second = report["results"]
    for r in report["results"]:
        assert r["status"] == "ok"
        assert r["shape"] == dict(B=1, T=32, H=1, K=16, V=16) and r["dtype"] == "float32"
        assert r["compile_s"] > 0 and r["median_s"] > 0 and len(r["times_s"]) == 2
        assert len(r["source"]["sha256"]) == 64 and r["source"]["modules"]
        assert r["validation"]["passed"] and r["validation"]["shape"] == [1, 32, 1, 16, 16]
        assert r["baseline_kernel"] == "pairwise[chunk_size=16]"
    assert first["speedup_vs_baseline"] == 1.0
    assert math.isclose(second["speedup_vs_baseline"], first["median_s"] / second["median_s"])
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "speedup" in out and "validated" in out


def test_bench_tile_sweep_validates_each_config_and_keeps_a_valid_one(cli, tmp_path):
    path = tmp_path / "b.json"
    code, out, _ = cli("bench", "--kernel", "factorized", "--tiles", "chunk_size=16,32;leaf=8,16",
                       *TINY_BENCH, "--json", str(path))
    assert code == 0, out
    [r] = json.loads(path.read_text())["results"]
    labels = [e["label"] for e in r["sweep"]]
    assert len(labels) == 4  # (a key no kernel accepts is a usage error: test_hardening.py)
    rejected = [e for e in r["sweep"] if e["status"] == "rejected"]
    assert all("invalid configuration" in e["reason"] for e in rejected)  # leaf=16 with chunk_size=16
    timed = [e for e in r["sweep"] if e.get("median_s") is not None]
    assert timed and all(e["small_validation"]["passed"] for e in timed)
    [chosen] = [e for e in r["sweep"] if e["status"] == "chosen"]
    assert chosen["full_validation"]["passed"]
    assert chosen["median_s"] == min(e["median_s"] for e in timed)
    assert r["options"] == chosen["options"]


def test_tile_spec_parsing():
    assert bench.parse_tiles("chunk_size=32,64;leaf=8") == {"chunk_size": [32, 64], "leaf": [8]}
    assert bench.configurations(KernelSpec.parse("pairwise"), "chunk_size=32,64;leaf=8") == [
        {"chunk_size": 32}, {"chunk_size": 64}]
    assert bench.configurations(KernelSpec.parse("pairwise"), None) == [{}]
    with pytest.raises(UsageError):
        bench.parse_tiles("leaf")


def test_source_hash_covers_the_kernel_modules():
    from gdn2_oracle import kernels

    src = source_sha256(kernels.get("factorized"))
    assert {"gdn2_oracle.kernels.chunked", "gdn2_oracle.kernels.decay", "gdn2_oracle.kernels.wy"} <= set(src["modules"])
    assert source_sha256(kernels.get("factorized"))["sha256"] == src["sha256"]


# --- golden wrapper -------------------------------------------------------------------------

def test_golden_list_and_bad_case(cli):
    code, out, _ = cli("golden", "list")
    assert code == 0 and "decay_moderate" in out
    code, _, err = cli("golden", "check", "--case", "no_such_case")
    assert code == 2


def test_kernel_lists_with_bracketed_options_are_two_kernels(cli, tmp_path):
    """``--kernel 'factorized[chunk_size=32,leaf=8],pairwise'``: the spec grammar the plugin's GDN2_KERNEL uses."""
    path = tmp_path / "v.json"
    code, out, err = cli("validate", "--kernel", "factorized[chunk_size=32,leaf=8],pairwise", "--cases", "golden",
                         "--case", "decay_moderate", "--dtype", "float32", "--no-progress", "--json", path)
    assert code == 0, out + err
    report = json.loads(path.read_text())
    assert [(k["name"], k["options"]) for k in report["kernels"]] == [
        ("factorized[chunk_size=32,leaf=8]", {"chunk_size": 32, "leaf": 8}), ("pairwise", {})]
    code, _, err = cli("validate", "--kernel", "factorized[chunk_size=32,chunk_size=64]", "--no-progress")
    assert code == 2 and "'chunk_size' is given twice" in err, err


@pytest.mark.parametrize("command, rest", [("validate", []), ("bench", []), ("golden", ["check"]),
                                           ("domain", ["--kernel", "pairwise"]), ("hunt", ["--kernel", "pairwise"]),
                                           ("cost", [])])
def test_global_options_are_in_every_subcommands_help_and_work_after_its_name(cli, command, rest):
    code, out, _ = cli(command, "--help")
    assert code == 0 and "--no-compile-cache" in out and "--distributed" in out and "--init-timeout" in out, out
    args = build_parser().parse_args([command, "--no-compile-cache", *rest])
    assert args.no_compile_cache is True and args.distributed is False
    assert build_parser().parse_args(["--no-compile-cache", command, *rest]).no_compile_cache is True


@pytest.mark.parametrize("command, rest", [("validate", ["--kernel", "pairwise", "--cases", "golden"]),
                                           ("golden", ["check"]), ("hunt", ["--kernel", "pairwise"]), ("cost", [])])
def test_a_command_line_builds_only_the_commands_it_names_and_parses_as_with_all(command, rest):
    """``build_parser(argv)``: the named commands' subparsers are the full ones (the same help, the same parse as
    with every command built); the others are empty, still choices; help before any command name builds them all."""
    argv = [command, *rest]
    lazy, full = build_parser(argv), build_parser()

    def subparsers(parser):
        return next(a for a in parser._actions if a.dest == "command").choices

    assert vars(lazy.parse_args(argv)) == vars(full.parse_args(argv))
    named = set(argv) & set(subparsers(full))  # "golden" is a command and a --cases value
    for name, sub in subparsers(lazy).items():
        want = subparsers(full)[name].format_help()
        assert (sub.format_help() == want) == (name in named), name
    assert list(subparsers(lazy)) == list(subparsers(full))
    assert build_parser(["--help", *argv]).format_help() == full.format_help()


def test_a_console_run_imports_only_its_own_command():
    """``gdn2-oracle validate --help`` in a fresh process: neither hunt's module (with Hypothesis) nor cost's
    (the cost model) is imported; ``gdn2-oracle --help`` lists every command with its help line."""
    import subprocess
    import sys

    code = ("import sys; from gdn2_oracle.ci import cli; cli.main(['validate', '--help']); "
            "print(sorted(m for m in ('gdn2_oracle.ci.commands.hunt', 'gdn2_oracle.ci.commands.cost', 'hypothesis') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert out.splitlines()[-1] == "[]", out
    out = subprocess.run([sys.executable, "-c", "from gdn2_oracle.ci import cli; cli.main(['--help'])"],
                         capture_output=True, text=True, timeout=300).stdout
    assert "Hypothesis search for a FAIL" in out and "roofline TPU time ESTIMATE" in out, out


def test_max_failures_counts_cases_and_json_counts_match_the_table(cli, tmp_path):
    """--max-failures 1 prints one whole case (with its diagnosis); n_failed counts FAIL only (PRECISION apart)."""
    path = tmp_path / "v.json"
    code, out, _ = cli("validate", "--kernel", f"{WRONG}:perturbed", "--cases", "golden", "--case", "len_1",
                       "--case", "decay_moderate", "--dtype", "float32", "--no-progress", "--max-failures", "1",
                       "--json", path)
    assert code == 1
    block = out.split("Cases not graded PASS (2):", 1)[1].split("more case(s) in the JSON report")[0]
    assert block.count("FAIL:") == 1 and "diagnosis" in block and "... 1 more case(s)" in out, out
    k = json.loads(path.read_text())["kernels"][0]
    assert k["n_failed"] == 2 and k["n_precision"] == 0 and "(0/2 cases pass, 2 FAIL)" in out
    code, _, err = cli("validate", "--max-failures", "-1")
    assert code == 2 and "--max-failures must be >= 0" in err


@pytest.mark.parametrize("command", ["validate", "bench", "domain", "hunt"])
def test_every_command_refuses_a_negative_seed_before_any_work(cli, command):
    code, _, err = cli(command, "--kernel", "pairwise", "--seed", "-1")
    assert code == 2 and "--seed" in err and "expected an integer >= 0" in err, err


def test_cases_failing_alike_are_one_block(cli):
    """Golden cases that fail alike (same grade, same results over tolerance, same primary diagnosis) are shown as
    one block: the worst whole, the others by name; the count and --max-failures count cases."""
    cases = ["decay_weak", "decay_moderate", "decay_strong", "gates_one"]
    args = ["validate", "--kernel", f"{WRONG}:perturbed", "--cases", "golden", "--dtype", "float32", "--no-progress"]
    code, out, _ = cli(*args, *(a for c in cases for a in ("--case", c)))
    assert code == 1
    block = out.split(f"Cases not graded PASS ({len(cases)}):", 1)[1].split("Diagnosis (across cases)")[0]
    assert f"{len(cases)} cases FAIL alike; the worst:" in block and block.count("FAIL: ") == 1, out
    alike = next(line for line in block.splitlines() if line.strip().startswith("alike:"))
    assert sorted(n.strip() for n in alike.split(":", 1)[1].split(",")) == sorted(
        c for c in cases if c not in block.split("the worst:")[1].splitlines()[1]), alike
