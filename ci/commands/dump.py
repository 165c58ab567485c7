"""``validate --dump DIR`` and ``validate --plot PATH``: what a failing validation leaves behind to look at.

* :class:`Dumper` writes, for every case not graded PASS, ``DIR/<kernel>/<case>/``: ``arrays.npz`` (the
  inputs ``input_*``, the kernel's results ``got_*``, the reference ``ref_*``, the per-token error profiles
  ``profile_*``; whatever the run had), ``verdicts.json`` (the case's record as in the JSON report), one PNG of
  error / tolerance per token for each failing per-token result, and ``reproduce.txt`` (a one-line
  ``python -c`` that runs the kernel on the case again and prints its verdicts). A serving case's arrays are named
  per call (``call0_input_q``, ``call0_state_indices``, ``call0_got_o``, ``call0_ref_o``, ``call0_got_pool``,
  ``call0_ref_pool``, ``call0_ratio_o``, ...: ``ci/running/serving.py``, ``SessionRun.arrays``) and its one PNG,
  ``serving_per_call.png``, is error / tolerance of ``o`` per sequence and token and of the state per slot, call by
  call (``serving_dump.plot_serving``).
* :func:`plot_validation`: the heat map of a report, cases x results, colour log10(error / tolerance).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from gdn2_oracle.kernels.spec import python_c, runnable
from gdn2_oracle.oracle import call_modes

from ..grading.case import Case
from ..grading.grades import FAIL, PASS, PRECISION, Verdict
from .output import write_json
from .serving_dump import n_calls, plot_serving

# Colour range of the heat map and of the per-token plots, in log10(error / tolerance).
LOG_RANGE = 3.0
MARK = {FAIL: "x", PRECISION: "~"}
SERVING_PLOT = "serving_per_call.png"  # a serving case's plot (serving_dump.plot_serving)


def safe_name(text):
    """A file-system-safe folder name for a kernel label or case name."""
    return re.sub(r"[^\w.,=+\-\[\]]+", "_", str(text)).strip("._") or "_"


def _npz_array(x):
    """``x`` as a NumPy array npz can store and load back (bfloat16 and other extension dtypes as float32)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiub" or a.dtype.name not in np.sctypeDict:
        a = a.astype(np.float32)
    return a


def reproducer(case, spec, *, case_set=None, seed=0):
    """:func:`one_liner`, prefixed with the ``PYTHONPATH`` the kernel's module needs (``kernels.spec.runnable``)."""
    return runnable(one_liner(case, spec, case_set=case_set, seed=seed), spec)


def one_liner(case, spec, *, case_set=None, seed=0):
    """The one-line shell command that runs kernel ``spec`` (a spec string) on ``case`` and prints its verdicts.

    A dense GDN-2 golden case: ``Case.golden(name)``; a generated dense case: its :class:`oracle.Recipe`
    (``case.recipe``, set by ``validate``), like ``property_tests.strategies.repro``; any other (a training-call,
    family or serving case, a mode or family golden among them):
    the ``gdn2-oracle validate`` run of that one case through ``ci.cli.main``.
    """
    head = ("from gdn2_oracle import oracle; from gdn2_oracle.kernels import KernelSpec; "
            "from gdn2_oracle.ci.grading.case import Case; from gdn2_oracle.ci.running.harness import kernel_results; ")
    tail = (f"fn = KernelSpec.parse({spec!r}).build(); "
            f"print(c.judge(kernel_results(fn, *c.data(), dtype={case.dtype!r})).format())")
    if isinstance(case, Case) and case.source == "golden":  # a GDN-2 golden (a family or mode one: validate, below)
        return python_c(head + f"c = Case.golden({case.name!r}); " + tail)
    recipe = getattr(case, "recipe", None)
    if recipe is not None and hasattr(recipe, "call"):
        return python_c(head + f"p = {recipe.call()}; do, dfs = {recipe.cotangents_call('p')}; "
                        f"c = Case.of(p, do, dfs, dtype={case.dtype!r}, name={case.name!r}); " + tail)
    argv = ["validate", "--kernel", spec, "--cases", case_set or "full", "--case", case.name, "--dtype", case.dtype,
            "--seed", str(seed), "--no-progress"]
    if case.modes:
        argv += ["--modes", ",".join(dict.fromkeys((call_modes.BASE.name, *case.modes)))]
    return python_c(f"import sys; from gdn2_oracle.ci.cli import main; sys.exit(main({argv!r}))")


class Dumper:
    """Writes the dump folder of each case not graded PASS (``write``), right after the case is judged."""

    def __init__(self, root, *, case_set=None, seed=0):
        self.root = Path(root)
        self.case_set, self.seed = case_set, seed
        self.written = []  # the folders written
        self._used = set()

    def folder(self, kernel_label, case):
        base = self.root / safe_name(kernel_label) / safe_name(case.name)
        path, n = base, 1
        while path in self._used:  # one case name in two dtypes (or kernels of one label)
            n += 1
            path = base.with_name(f"{base.name}_{safe_name(case.dtype)}" + (f"_{n}" if n > 2 else ""))
        self._used.add(path)
        return path

    def write(self, kernel_label, spec, case, record, arrays=None):
        """The dump of one judged case (``record``: its dict in the report; ``arrays``: what ``run_case``
        captured, or None). Nothing for a case graded PASS. Returns the folder, or None."""
        if record.get("passed"):
            return None
        path = self.folder(kernel_label, case)
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / "verdicts.json", {"kernel": kernel_label, "spec": spec, **record})
        (path / "reproduce.txt").write_text(reproducer(case, spec, case_set=self.case_set, seed=self.seed) + "\n",
                                            encoding="utf-8")
        arrays = arrays or {}
        named = {}
        for prefix in ("input", "got", "ref", "profile"):
            for name, x in (arrays.get(prefix) or {}).items():
                if x is not None:
                    named[f"{prefix}_{name}"] = _npz_array(x)
        calls = arrays.get("serving") or {}  # a serving case's arrays, already named per call (call0_got_o, ...)
        named.update({name: _npz_array(x) for name, x in calls.items() if x is not None})
        if named:
            np.savez_compressed(path / "arrays.npz", **named)
        title = f"{kernel_label} on {case.name} ({case.dtype})"
        profiles = arrays.get("profile") or {}
        for v in record.get("verdicts") or []:
            if v.get("grade", PASS if v.get("passed") else FAIL) != PASS and v["name"] in profiles:
                plot_token_profile(path / f"{safe_name(v['name'])}_per_token.png", profiles[v["name"]], v,
                                   title=title)
        if n_calls(calls):
            plot_serving(path / SERVING_PLOT, calls, record.get("verdicts") or [], title=title, log_range=LOG_RANGE)
        self.written.append(path)
        return path


def plot_token_profile(path, profile, verdict, *, title=""):
    """A PNG of error / tolerance per token of one result (log y axis), the tolerance line at 1 and the first
    token over it marked; tokens with a non-finite value drawn as red marks at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = Verdict.from_dict(verdict)
    tol = v.tol_ratio if v.tol_ratio > 0 else 1.0
    r = np.asarray(profile, np.float64) / tol
    t = np.arange(r.size)
    finite = np.isfinite(r)
    positive = r[finite & (r > 0)]
    lo = max(float(positive.min()) / 2, 1e-6) if positive.size else 1e-3
    hi = max(float(r[finite].max()) * 2 if finite.any() else 10.0, 10.0)
    lo = min(lo, 0.1)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    y = np.where(finite, np.maximum(r, lo), np.nan)
    if r.size == 1:
        ax.plot(t, y, "o", color="#1f4e9c", label=f"{v.name}: error / tolerance")
    else:
        ax.plot(t, y, "-", lw=1.2, color="#1f4e9c", label=f"{v.name}: error / tolerance")
    if (~finite).any():
        ax.plot(t[~finite], np.full((~finite).sum(), hi), "v", color="#c00000", label="NaN or inf")
    ax.axhline(1.0, color="#c00000", ls="--", lw=1, label="tolerance (1)")
    over = np.flatnonzero(~finite | (r > 1))
    if over.size:
        t0 = int(over[0])
        ax.axvline(t0, color="#e08000", lw=1, ls=":")
        ax.plot([t0], [y[t0] if finite[t0] else hi], "o", ms=7, mfc="none", mec="#e08000", mew=1.5,
                label=f"first token over the tolerance: {t0}")
    ax.set_yscale("log")
    ax.set_ylim(lo, hi * 1.5)
    ax.set_xlim(-0.5, max(r.size - 0.5, 0.5))
    ax.set_xlabel("token")
    ax.set_ylabel("error / tolerance (log)")
    ax.set_title(f"{title}\n{v.name}: {v.grade}, overall x{v.ratio:.3g} of tolerance (rms {v.err_ratio:.2e} "
                 f"vs {v.tol_ratio:.1e})", fontsize=9)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _result_order(kernel, preferred):
    seen = dict.fromkeys(n for n in preferred)
    names = dict.fromkeys(v["name"] for c in kernel["cases"] for v in c.get("verdicts") or [])
    return [n for n in seen if n in names] + [n for n in names if n not in seen]


def plot_validation(report, path, *, preferred=()):
    """The heat map of a validation report: one panel per kernel, cases (rows) x results (columns), colour
    log10(error / tolerance) (clipped to +-LOG_RANGE; 0 = at the tolerance), x FAIL, ~ PRECISION; cases where the
    kernel raised or the case could not be loaded are grey rows with a label; results a case does not have
    are blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    kernels = [k for k in report.kernels if k["cases"]] or report.kernels[:1]
    cols = [_result_order(k, preferred) for k in kernels]
    rows = [max(1, len(k["cases"])) for k in kernels]
    width = max(7.0, 0.75 * max((len(c) for c in cols), default=1) + 4.5)
    height = sum(0.28 * r + 1.6 for r in rows) + 0.6
    fig, axes = plt.subplots(len(kernels), 1, figsize=(width, height), squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": [r + 5 for r in rows]})
    cmap = plt.get_cmap("RdYlGn_r").with_extremes(bad="#ffffff")
    norm = TwoSlopeNorm(vmin=-LOG_RANGE, vcenter=0.0, vmax=LOG_RANGE)
    im = None
    for ax, k, names in zip(axes[:, 0], kernels, cols):
        im = ax.imshow(_log_ratios(k["cases"], names), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        _mark_cases(ax, k["cases"], names)
        _label_panel(ax, k, names)
    if im is not None:
        cb = fig.colorbar(im, ax=list(axes[:, 0]), fraction=0.04, pad=0.02)
        cb.set_label("log10(error / tolerance)   (>0: over; x FAIL, ~ PRECISION)", fontsize=8)
        cb.ax.tick_params(labelsize=7)
    env = getattr(report, "environment", {}) or {}
    fig.suptitle(f"gdn2-oracle validate ({report.cases} set, {','.join(report.dtypes)}; "
                 f"{env.get('device_kind', '?')}): {report.outcome.upper()}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log_ratios(cases, names):
    """The panel's colours: log10(error / tolerance) of each case (row) and result (column), clipped to +-LOG_RANGE;
    NaN where the case has no such result."""
    grid = np.full((max(1, len(cases)), max(1, len(names))), np.nan)
    for i, c in enumerate(cases):
        by = {v["name"]: v for v in c.get("verdicts") or []}
        for j, n in enumerate(names):
            if n in by:
                ratio = Verdict.from_dict(by[n]).ratio
                grid[i, j] = LOG_RANGE if not math.isfinite(ratio) else (
                    -LOG_RANGE if ratio <= 0 else float(np.clip(math.log10(ratio), -LOG_RANGE, LOG_RANGE)))
    return grid


def _mark_cases(ax, cases, names):
    """Grey out and label the rows of cases in error (kernel or input), and mark each FAIL x and PRECISION ~."""
    for i, c in enumerate(cases):
        if c.get("error") or c.get("outcome") in ("error", "input-error"):
            ax.axhspan(i - 0.5, i + 0.5, color="#b0b0b0", zorder=2)
            kind = "input error (not judged)" if c.get("outcome") == "input-error" else "kernel error"
            msg = str(c.get("error") or "")
            msg = msg if len(msg) <= 70 else msg[:67] + "..."
            ax.text((max(len(names), 1) - 1) / 2, i, f"{kind}: {msg}", ha="center", va="center", fontsize=7,
                    color="#202020", zorder=3, clip_on=True)
            continue
        for j, n in enumerate(names):
            v = next((v for v in c.get("verdicts") or [] if v["name"] == n), None)
            mark = MARK.get(v.get("grade") if v else None)
            if mark:
                ax.text(j, i, mark, ha="center", va="center", fontsize=9, fontweight="bold", color="#000000")


def _label_panel(ax, k, names):
    """The panel's ticks (results, cases), cell grid lines and title (kernel, grade, counts)."""
    cases = k["cases"]
    ax.set_xticks(range(max(len(names), 1)), names or ["(no result judged)"], rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(cases)), [f"{c['case']} ({c['dtype']})" for c in cases], fontsize=7)
    ax.set_xticks(np.arange(-0.5, max(len(names), 1), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(cases), 1), minor=True)
    ax.grid(which="minor", color="#ffffff", lw=0.6)
    ax.tick_params(which="minor", length=0)
    n_f, n_p = k.get("n_failed", 0), k.get("n_precision", 0)
    ax.set_title(f"{k['name']}: {k.get('grade', '')} ({len(cases)} cases, {n_f} FAIL, {n_p} PRECISION)",
                 fontsize=9, loc="left")


def load_dump(folder):
    """``(arrays, verdicts record, reproducer line)`` of a dump folder (for tests and scripts)."""
    folder = Path(folder)
    npz = folder / "arrays.npz"
    arrays = dict(np.load(npz)) if npz.exists() else {}
    record = json.loads((folder / "verdicts.json").read_text(encoding="utf-8"))
    return arrays, record, (folder / "reproduce.txt").read_text(encoding="utf-8").strip()


__all__ = ["Dumper", "plot_validation", "plot_token_profile", "reproducer", "load_dump"]
