"""``gdn2-oracle domain``: the sweep finds a planted boundary and writes heat maps, JSON and the summary.

The CLI runs once (module fixture) on a tiny grid put in place of ``quick``, with the test kernel
``clipped_log_decay[limit=0.5]`` (kernels/testing.py: the pairwise kernel with every per-token
log-decay clipped at -0.5), which is exact while every ``|g_t| <= 0.5`` and wrong beyond.
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from gdn2_oracle.ci import cli
from gdn2_oracle.ci.commands import domain
from gdn2_oracle.ci.commands.domain import Axis, Grid, Point
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION
from gdn2_oracle.oracle import RESULTS
from gdn2_oracle.oracle.mode_recipes import ModeRecipe

CLIPPED = "gdn2_oracle.kernels.testing:clipped_log_decay[limit=0.5]"
# g = -s U(0.5, 1.5): |g| < 0.45 for s <= 0.3 (exact), up to 1.5 for s = 1 (clipped).
STRENGTHS = (0.01, 0.1, 0.3, 1.0, 3.0, domain.RESETS)
TINY = Grid("quick", (Axis("strength", "log-decay strength s", STRENGTHS),
                      Axis("erase", "erase gate b", (0.5, 2.0))),
            seeds=1, base=Point(T=64), shape=(1, 1, 8, 8))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``gdn2-oracle domain --kernel CLIPPED --out DIR`` on the tiny grid: (exit code, stdout, DIR)."""
    out = tmp_path_factory.mktemp("domain")
    mp = pytest.MonkeyPatch()
    mp.setitem(domain.GRIDS, "quick", TINY)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = cli.main(["domain", "--kernel", CLIPPED, "--grid", "quick", "--out", str(out), "--no-progress"])
    finally:
        mp.undo()
    return code, buf.getvalue(), out


def _panel(report, field):
    return next(p for p in report["panels"] if p["field"] == field)


def test_domain_writes_png_json_and_summary(run):
    code, stdout, out = run
    assert code == 1 and "domain: FAIL in" in stdout, stdout  # the clipped kernel FAILs in some cells
    assert (out / "domain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "domain.json").read_text())
    assert report["schema"] == domain.SCHEMA and report["kernel"] == CLIPPED
    assert [len(p["cells"]) for p in report["panels"]] == [len(STRENGTHS), 2]
    summary = (out / "summary.txt").read_text().strip()
    assert summary == report["summary"]
    assert "where they leave PASS" in stdout and len(stdout.splitlines()) < 20, stdout  # a short table


def test_domain_finds_the_planted_decay_boundary(run):
    _, _, out = run
    report = json.loads((out / "domain.json").read_text())
    cells = _panel(report, "strength")["cells"]
    grades = [{n: c["results"][n]["grade"] for n in RESULTS} for c in cells]
    assert all(g == PASS for row in grades[:3] for g in row.values())  # |g| <= 0.45: exact
    assert all(g["o"] == FAIL for g in grades[3:])  # clipped at 1.0, 3.0 and under resets
    assert all(c["results"]["o"]["ratio"] > 100 for c in cells[3:])
    [b] = [b for b in report["boundaries"] if b["panel"] == "strength" and "o" in b["results"]]
    span = cells[2]["span"]
    assert 0.3 * 0.5 * 64 < span < 0.3 * 1.5 * 64  # the 64-token span of the last clean strength
    boundary = f"every result leaves PASS once the 64-token log-decay span exceeds ~{span:.3g} (s = 0.3): FAIL from "
    assert boundary in report["summary"]
    assert b["text"].endswith("; FAIL under resets")
    assert "Every result is PASS along erase gate b 0.5 and 2." in report["summary"]


def test_points_are_validated_and_share_their_draws():
    for bad, field in ((dict(strength=-1.0), "strength"), (dict(strength="extreme"), "strength"),
                       (dict(erase=float("nan")), "erase"), (dict(qk="raw"), "qk"), (dict(T=0), "T"),
                       (dict(dtype="float16"), "dtype")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            Point(**bad)
    a, _, _ = domain.build(Point(strength=0.1, T=8, dtype="float32"), seed=3, shape=(1, 1, 4, 4))
    b, _, _ = domain.build(Point(strength=0.2, T=8, dtype="float32"), seed=3, shape=(1, 1, 4, 4))
    np.testing.assert_allclose(b.g, 2 * a.g, rtol=1e-6)  # one jitter draw, scaled
    np.testing.assert_array_equal(a.q, b.q)
    assert np.allclose(np.linalg.norm(a.q, axis=-1), 1, atol=1e-6)


def _graded(field, values, grades):
    """A panel whose cells carry only result ``o``'s grade (the boundary sentences read nothing else)."""
    return {"field": field, "label": field, "cells": [
        {"value": v, "label": str(v), "span": 10.0 * i, "results": {"o": {"grade": g}}}
        for i, (v, g) in enumerate(zip(values, grades))]}


@pytest.mark.parametrize("field, grades, text", [
    ("erase", "PPFF", "{leaves} PASS once erase exceeds ~1: FAIL from 2"),
    ("erase", "PMMF", f"{{leaves}} PASS once erase exceeds ~0: {PRECISION} from 1, FAIL from 3"),
    ("strength", "PMPP", f"{{leaves}} PASS once the 64-token log-decay span exceeds ~0 (s = 0): {PRECISION} "
                         "from 10 (s = 1), PASS again from 20 (s = 2)"),
    ("erase", "FFPP", "{is} FAIL along erase up to 1, PASS from 2"),
    ("erase", "MFFF", f"{{is}} {PRECISION} at erase 0, FAIL from 1"),
    ("erase", "FFFF", "{is} FAIL at every erase (0-3)"),
    ("qk", "PFPF", "{is} not PASS along qk: FAIL at 1, 3"),
    ("erase", "PPPP", None),
])
def test_boundary_sentences(field, grades, text):
    names = {"P": PASS, "M": PRECISION, "F": FAIL}
    panel = _graded(field, (0, 1, 2, 3), [names[g] for g in grades])
    assert domain.result_boundary(panel, "o", 64) == text


def test_decay_span_is_the_largest_chunk_sum():
    g = np.full((1, 130, 1, 2), -0.5)
    g[..., 1] = -0.25
    assert domain.decay_span(g, 64) == 32.0  # chunks of 64, 64 and 2 tokens; channel 0
    assert domain.decay_span(g, 16) == 8.0


@pytest.mark.parametrize("argv, needle", [
    (["domain"], "--kernel"),
    (["domain", "--kernel", "pairwise", "--grid", "huge"], "invalid choice"),
    (["domain", "--kernel", "no-such-kernel"], "unknown kernel"),
    (["domain", "--kernel", "pairwise,factorized"], "expected one kernel"),
])
def test_domain_usage_errors_exit_2(capsys, argv, needle):
    assert cli.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_an_interrupted_domain_writes_the_cells_it_finished(cli, tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) during the sweep: the finished cells are mapped and written, marked interrupted, exit 130."""
    monkeypatch.setitem(domain.GRIDS, "quick", TINY)
    calls, evaluate = [], domain.evaluate

    def interrupted_on_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(domain, "evaluate", interrupted_on_the_fourth)
    code, out, err = cli("domain", "--kernel", CLIPPED, "--out", tmp_path, "--no-progress")
    assert code == 130 and "interrupted" in err, out + err
    report = json.loads((tmp_path / "domain.json").read_text())
    assert report["interrupted"] is True and [len(p["cells"]) for p in report["panels"]] == [3]
    assert "INTERRUPTED" in report["summary"] and (tmp_path / "domain.png").stat().st_size > 0


@pytest.mark.parametrize("argv, needle", [
    (["--out", "/proc/gdn2-domain"], "--out /proc/gdn2-domain: cannot write"),
    (["--seed", "-1"], "expected an integer >= 0"),
])
def test_domain_usage_errors_come_before_any_work(cli, monkeypatch, argv, needle):
    monkeypatch.setattr(domain, "evaluate", lambda *a, **k: pytest.fail("a cell was evaluated"))
    code, _, err = cli("domain", "--kernel", CLIPPED, *argv, "--no-progress")
    assert code == 2 and needle in err and "Traceback" not in err, err


# --- training-call modes: domain --modes (sweeps judged by the modes judge) ------------------------------------

MUTANTS = "gdn2_oracle.kernels.testing_modes"
# Two cells a sweep (each new static call compiles once), no dense sweep: seconds per kernel.
MODE_GRID = Grid("quick", (), seeds=1, mode_values={"varlen.length": (1, 64), "gate.A_log": (1.0, 16.0),
                                                     "l2norm.qk_norm": (1.0, 1e-3)})


def _mode_run(cli, monkeypatch, tmp_path, kernel, modes):
    monkeypatch.setitem(domain.GRIDS, "quick", MODE_GRID)
    code, out, err = cli("domain", "--kernel", kernel, "--modes", modes, "--out", tmp_path, "--no-progress")
    return code, out + err, json.loads((tmp_path / "domain.json").read_text())


def test_domain_mode_sweeps_of_a_correct_kernel_pass_with_the_mode_results(cli, tmp_path, monkeypatch):
    code, out, report = _mode_run(cli, monkeypatch, tmp_path, "pairwise", "gate,l2norm")
    assert code == 0 and "domain: no FAIL" in out, out
    assert report["modes"] == ["gate", "l2norm"] and report["not_accepted_modes"] == []
    gate, l2 = report["panels"]
    assert (gate["field"], gate["mode"], l2["field"]) == ("gate.A_log", "gate", "l2norm.qk_norm")
    assert {"dA_log", "ddt_bias"} <= set(gate["cells"][0]["results"]) and "dA_log" not in l2["cells"][0]["results"]
    assert all(r["grade"] == PASS for p in report["panels"] for c in p["cells"] for r in c["results"].values())
    # each cell names the call that rebuilds it
    cell = l2["cells"][1]
    point = domain.ModePoint(ModeRecipe(**{**cell["point"]["recipe"],
                                           "lengths": tuple(cell["point"]["recipe"]["lengths"])}),
                             qk_norm=cell["point"]["qk_norm"])
    call, _, _ = domain.build_mode(point, report["seeds"][0])
    assert call.qk_l2norm and np.allclose(np.linalg.norm(call.q, axis=-1), 1e-3, rtol=1e-2)
    assert "mode sweeps gate, l2norm" in report["summary"] and "every result is PASS" in report["summary"]


def test_domain_mode_sweeps_show_a_mutants_fail_cells_and_exit_1(cli, tmp_path, monkeypatch):
    """leaky_state (a packed sequence starts from the previous one's final state) FAILs in every packed cell; the
    bounded gate with exp(A_log) outside the sigmoid FAILs where exp(A_log) != 1 (at 1 only dA_log differs)."""
    code, out, report = _mode_run(cli, monkeypatch, tmp_path / "leaky", f"{MUTANTS}:leaky_state", "varlen")
    assert code == 1 and "domain: FAIL in 2 of 2 cells" in out, out
    [panel] = report["panels"]
    assert all(c["results"]["final_state"]["grade"] == FAIL for c in panel["cells"])
    code, out, report = _mode_run(cli, monkeypatch, tmp_path / "gate", f"{MUTANTS}:lower_bound_outside", "gate")
    assert code == 1, out
    at_1, at_16 = _panel(report, "gate.A_log")["cells"]
    assert at_1["results"]["o"]["grade"] == PASS and at_1["results"]["dA_log"]["grade"] == FAIL
    assert all(r["grade"] == FAIL for r in at_16["results"].values())
    assert "FAIL from 16" in report["summary"], report["summary"]


def test_domain_names_the_modes_a_kernel_does_not_accept_without_failing(cli, tmp_path, monkeypatch):
    code, out, report = _mode_run(cli, monkeypatch, tmp_path, "gdn2_oracle.kernels.testing:correct", "varlen,gate")
    assert code == 4 and "not swept: varlen, gate" in out, out  # no cell judged: EMPTY, not a pass
    assert report["not_accepted_modes"] == ["varlen", "gate"] and report["panels"] == []
    assert "Not swept: varlen, gate" in report["summary"] and (tmp_path / "domain.png").stat().st_size > 0


def test_domain_modes_argument(capsys):
    from gdn2_oracle.ci.commands.args import call_modes

    assert call_modes("all") == ("dense", *domain.MODES) and call_modes("gate,varlen") == ("varlen", "gate")
    assert cli.main(["domain", "--kernel", "pairwise", "--modes", "decode"]) == 2
    assert "decode not among dense, varlen" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["domain", "hunt"])
def test_a_modes_option_naming_an_unknown_mode_is_a_usage_error(cli, command):
    """The spec option ``modes=`` is checked before any work, as validate checks it: a formatted usage error naming
    ``--kernel``, not a traceback."""
    code, out, err = cli(command, "--kernel", "pairwise[modes=bogus]")
    assert code == 2 and "--kernel pairwise[modes=bogus]" in out + err and "unknown call mode" in out + err, out + err
    assert "Traceback" not in out + err
