"""``gdn2-oracle validate``: every kernel on the golden corpus and on generated, oracle-checked problems.

A *case* (a :class:`Trial`) is one problem -- a golden, or an :class:`oracle.Recipe` -- with its
cotangents and exact reference, fed to the kernels in one input dtype. Sources:

* ``golden`` -- every case of the golden corpus (256-bit mpmath references), in its own precision;
* ``quick``  -- the golden corpus plus a handful of generated problems per dtype (float64 oracle);
* ``full``   -- the golden corpus plus every decay x gate regime at several lengths per dtype.

Each kernel result (forward output, final state, seven gradients) is judged by the tolerance model
(:mod:`ci.tolerance`) and graded PASS / PRECISION / FAIL; the oracle reference and the working-precision
baselines are computed once per case and shared by all kernels. A kernel that raises on a case fails
that case (rule ``error``). Every non-PASS case carries a diagnosis (:mod:`ci.diagnose`), and each
kernel one across its cases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


from gdn2_oracle import oracle
from gdn2_oracle.oracle import KERNEL_DTYPES, RESULTS, Recipe

from . import harness
from .report import UsageError, environment, fmt_err, kernel_notes, progress, source_sha256, table
from .diagnose import diagnose_kernel
from . import multihost
from .mesh import format_mesh
from .tolerance import FAIL, PASS, PRECISION, baseline, compare, cumulative_baseline, dtype_name, worst_grade

CASE_SETS = ("golden", "quick", "full")
SCHEMA = "gdn2-oracle/validate/1"

# quick: a handful of regimes on two shapes (two compilations per kernel and dtype).
QUICK = (
    # name, (B, T, H, K, V), decay, gates, initial_state
    ("gen_moderate_T100", (1, 100, 2, 32, 32), "moderate", "uniform", True),
    ("gen_strong_negative_T100", (1, 100, 2, 32, 32), "strong", "negative", False),
    ("gen_mixed_write_one_T100", (1, 100, 2, 32, 32), "mixed", "write_one", True),
    ("gen_extreme_h0_T130", (2, 130, 1, 16, 32), "extreme", "uniform", True),
    ("gen_resets_T130", (2, 130, 1, 16, 32), "resets", "erase_one", False),
    # long sequences (past 128/256/512-token blocks; 1000 is a multiple of none of them), weak or no decay
    # so the state carries information across the whole length: a block-boundary bug fails here
    ("gen_weak_erase_zero_T1024", (1, 1024, 1, 8, 8), "weak", "erase_zero", True),
    ("gen_none_uniform_T1000", (1, 1000, 1, 16, 16), "none", "uniform", False),
)
FULL_LENGTHS = (1, 63, 65, 200)
FULL_SHAPE = (1, None, 2, 32, 32)


@dataclass
class Trial:
    """One recipe or golden run in one dtype: its problem built lazily, reference and baselines cached.

    ``_build()`` returns ``((problem, do, dfinal_state), reference or None)``.
    """

    name: str
    source: str  # "golden" | "generated"
    dtype: str
    shape: tuple
    regime: dict = field(default_factory=dict)
    _build: object = None
    _data: tuple | None = None
    _ref: dict | None = None
    _base: dict = field(default_factory=dict)
    _cum: dict = field(default_factory=dict)

    def data(self):
        """``(problem, do, dfinal_state)``."""
        if self._data is None:
            self._data, self._ref = self._build()
        return self._data

    def reference(self):
        if self._ref is None:
            problem, do, dfs = self.data()
            if self._ref is None:
                self._ref = multihost.reference_results(problem, do, dfs)
        return self._ref

    def baseline(self, result_dtypes):
        key = tuple(result_dtypes[n] for n in RESULTS)
        if key not in self._base:
            self._base[key] = baseline(*self.data(), result_dtypes)
        return self._base[key]

    def cum_baseline(self, result_dtypes):
        """The cumulative-sum-exponent chunked baseline (``tolerance.cumulative_baseline``), cached."""
        key = tuple(result_dtypes[n] for n in RESULTS)
        if key not in self._cum:
            self._cum[key] = cumulative_baseline(*self.data(), result_dtypes)
        return self._cum[key]

    def release(self):
        """Drop cached arrays (kept small when many cases run)."""
        self._data = self._ref = None
        self._base, self._cum = {}, {}

    def describe(self):
        return {"case": self.name, "source": self.source, "dtype": self.dtype, "shape": list(self.shape),
                **({"regime": self.regime} if self.regime else {})}


def golden_trial(name):
    """The golden case ``name`` (loaded and hash-checked when first used), in its own precision."""
    from gdn2_oracle import golden  # noqa: PLC0415

    def build():
        g = golden.load(name)
        return (g.problem(), *g.cotangents()), g.reference()

    c = golden.catalogue.get(name)
    r = c.recipe
    regime = {"decay": r.decay, "gates": r.gates, "qk": r.qk, "initial_state": r.initial_state,
              "reduction": r.reduction, "purpose": c.purpose}
    return Trial(name, "golden", r.precision, r.shape, regime, build)


def recipe_trial(name, recipe: Recipe):
    """A generated problem from ``recipe``, in the recipe's precision (reference: the float64 oracle)."""

    def build():
        return recipe.build(), None

    regime = {"decay": recipe.decay, "gates": recipe.gates, "initial_state": recipe.initial_state,
              "seed": recipe.seed}
    return Trial(name if recipe.precision == "float32" else f"{name}_bf16", "generated", recipe.precision,
                 recipe.shape, regime, build)


def generated(kind):
    """``(name, shape, decay, gates, initial_state)`` of the generated problems of a case set."""
    if kind == "quick":
        return list(QUICK)
    if kind != "full":
        return []
    gen = []
    B, _, H, K, V = FULL_SHAPE
    for T in FULL_LENGTHS:
        for decay in oracle.DECAYS:
            for gates in oracle.GATES:
                gen.append((f"gen_{decay}_{gates}_T{T}", (B, T, H, K, V), decay, gates, len(gen) % 2 == 1))
    return gen


def build_trials(kind="quick", dtypes=KERNEL_DTYPES, *, seed=0, only=None):
    """The trials of a case set, restricted to ``dtypes`` (and to the names in ``only``, if given)."""
    if kind not in CASE_SETS:
        raise ValueError(f"cases: {kind!r} not one of {CASE_SETS}")
    from gdn2_oracle import golden  # noqa: PLC0415

    cases = [c for c in (golden_trial(n) for n in golden.names()) if c.dtype in dtypes]
    for dtype in dtypes:
        for j, (n, s, d, g, h) in enumerate(generated(kind)):
            recipe = Recipe(*s, decay=d, gates=g, initial_state=h, precision=dtype, seed=seed + 1000 + j)
            cases.append(recipe_trial(n, recipe))
    if only:
        unknown = sorted(set(only) - {c.name for c in cases})
        if unknown:
            raise UsageError(f"--case: unknown case(s) {unknown} in set {kind!r} with dtypes {list(dtypes)}")
        cases = [c for c in cases if c.name in set(only)]
    return cases


def run_trial(fn, case: Trial, mesh=None):
    """Judge kernel ``fn`` on one trial: ``{"passed", "outcome", "verdicts", "error", "seconds"}``.

    ``outcome``: ``pass``, ``fail`` (over tolerance), ``error`` (the kernel raised) or ``input-error``
    (the case's own data could not be loaded, e.g. a missing or damaged golden file: nothing is
    known about the kernel; the message names the file and how to restore it).
    """
    t0 = time.perf_counter()
    try:
        problem, do, dfs = case.data()
    except Exception as exc:  # noqa: BLE001 - a bad input is reported for this case; the others are judged
        return {"passed": False, "outcome": "input-error", "verdicts": [], "seconds": time.perf_counter() - t0,
                "error": f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:1000]}
    try:
        harness.check_representable(problem, case.dtype)
        got = harness.kernel_results(fn, problem, do, dfs, dtype=case.dtype, mesh=mesh)
    except Exception as exc:  # noqa: BLE001 - any kernel failure is a failed case, reported by name
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        return {"passed": False, "outcome": "error", "verdicts": [], "error": msg,
                "seconds": time.perf_counter() - t0}
    result_dtypes = {n: dtype_name(got[n]) for n in RESULTS}
    report = compare(problem, do, dfs, got, case.reference(), dtype=case.dtype, base=case.baseline(result_dtypes),
                     cum=lambda: case.cum_baseline(result_dtypes))
    return {"passed": report.passed, "outcome": GRADE_OUTCOME[report.grade], "grade": report.grade,
            "verdicts": [v.as_dict() for v in report.verdicts], "error": None,
            "diagnosis": [f.as_dict() for f in report.diagnosis], "seconds": time.perf_counter() - t0}


# A judged case's outcome by its grade (PRECISION: over tolerance, within the precision-loss bound).
GRADE_OUTCOME = {PASS: "pass", PRECISION: "precision", FAIL: "fail"}


def case_grade(c):
    """A case dict's grade: its own; else None for an input error (not judged), FAIL for a kernel error."""
    if "grade" in c:
        return c["grade"]
    return None if c.get("outcome") == "input-error" else (PASS if c["passed"] else FAIL)


def severity(v):
    """How far a verdict is from its tolerance (>1 fails): max of the two metric ratios."""
    def ratio(err, tol):
        if err != err or err == float("inf"):
            return float("inf")
        return err / tol if tol > 0 else (0.0 if err == 0 else float("inf"))
    return max(ratio(v["err_ratio"], v["tol_ratio"]), ratio(v["max_err"], v["tol_max"]))


def summarize(case_results):
    """``{dtype: {result: worst verdict (+ case, cases, failed, precision)}}`` and per-dtype error counts
    (``failed``: graded FAIL; ``precision``: graded PRECISION)."""
    out = {}
    for cr in case_results:
        per = out.setdefault(cr["dtype"], {})
        if cr.get("outcome") == "input-error":
            per.setdefault("_input_errors", []).append(cr["case"])
            continue
        if cr["error"]:
            per.setdefault("_errors", []).append(cr["case"])
            continue
        for v in cr["verdicts"]:
            s = per.setdefault(v["name"], {"cases": 0, "failed": 0, "precision": 0, "worst": None})
            s["cases"] += 1
            grade = v.get("grade") or (PASS if v["passed"] else FAIL)
            s["failed"] += grade == FAIL
            s["precision"] += grade == PRECISION
            if s["worst"] is None or severity(v) > severity(s["worst"]):
                s["worst"] = {**v, "case": cr["case"], "severity": severity(v)}
    return out


def run_validation(specs, *, dtypes=KERNEL_DTYPES, cases="quick", seed=0, only=None,
                   show_progress=True, env=None, mesh=None):
    """Validate every kernel spec (:class:`ci.report.KernelSpec`); returns the JSON-ready report.

    With a ``mesh`` (a ``jax.sharding.Mesh``, ci/mesh.py) every kernel runs inside it on sharded inputs.

    Kernels are built first, so an unknown name or import failure raises ``UsageError`` before any work.
    """
    built = [(spec, spec.build()) for spec in specs]
    case_list = build_trials(cases, dtypes, seed=seed, only=only)
    # Group by shape and dtype so each kernel compiles once per group while the arrays are warm.
    case_list.sort(key=lambda c: (c.dtype, c.shape))
    kernels_out = [{"name": spec.label(), "spec": spec.spec, "options": spec.options,
                    "source": source_sha256(fn), "notes": kernel_notes(fn), "cases": []}
                   for spec, fn in built]
    bar = progress(total=len(built) * len(case_list), desc="validate", unit="case") if show_progress else None
    t0 = time.perf_counter()
    interrupted = False
    try:
        for case in case_list:
            for (spec, fn), kout in zip(built, kernels_out):
                if bar is not None:
                    bar.set_postfix_str(f"{spec.label()} {case.name}")
                res = run_trial(fn, case, mesh)
                res.setdefault("grade", case_grade(res))
                res.setdefault("diagnosis", [{"kind": res["outcome"], "text": res["error"], "token": None}]
                               if res["error"] else [])
                kout["cases"].append({**case.describe(), **res})
                if bar is not None:
                    bar.update(1)
            case.release()
    except KeyboardInterrupt:  # Ctrl-C: report the cases finished so far, marked interrupted
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    for kout in kernels_out:
        kout["passed"] = not interrupted and all(c["passed"] for c in kout["cases"])
        kout["n_cases"] = len(kout["cases"])
        kout["n_failed"] = sum(not c["passed"] for c in kout["cases"])
        kout["n_input_errors"] = sum(c.get("outcome") == "input-error" for c in kout["cases"])
        kout["n_precision"] = sum(case_grade(c) == PRECISION for c in kout["cases"])
        kout["grade"] = worst_grade(g for g in map(case_grade, kout["cases"]) if g is not None)
        kout["summary"] = summarize(kout["cases"])
        kout["diagnosis"] = [f.as_dict() for f in diagnose_kernel(kout["cases"])]
    return {
        "schema": SCHEMA,
        "command": "validate",
        "cases": cases,
        "dtypes": list(dtypes),
        "seed": seed,
        "only": list(only) if only else None,
        "mesh": format_mesh(mesh) if mesh is not None else None,
        "environment": env or environment(),
        "n_cases": len(case_list),
        "seconds": time.perf_counter() - t0,
        "passed": not interrupted and all(k["passed"] for k in kernels_out),
        "interrupted": interrupted,
        "outcome": outcome(kernels_out, interrupted),
        "grade": worst_grade(k["grade"] for k in kernels_out),
        "kernels": kernels_out,
    }


def outcome(kernels_out, interrupted=False):
    """The run's outcome: ``interrupted``, else ``fail`` if any judged case failed or a kernel raised,
    else ``input-error`` if some case could not be loaded, else ``precision`` if some case was graded
    PRECISION, else ``pass`` (``ci.cli.EXIT`` maps it)."""
    cases = [c for k in kernels_out for c in k["cases"]]
    if interrupted:
        return "interrupted"
    if any(c.get("outcome", "pass" if c["passed"] else "fail") in ("fail", "error") for c in cases):
        return "fail"
    if any(c.get("outcome") == "input-error" for c in cases):
        return "input-error"
    return "precision" if any(case_grade(c) == PRECISION for c in cases) else "pass"


def format_validation(report, *, max_failures=60):
    """The verdict table (kernel x dtype x result: worst case), per-case failures and the verdict line."""
    env = report["environment"]
    n_gold = sum(1 for c in report["kernels"][0]["cases"] if c["source"] == "golden") if report["kernels"] else 0
    lines = [f"gdn2-oracle validate: {report['n_cases']} cases ({n_gold} golden, {report['n_cases'] - n_gold} generated; "
             f"set {report['cases']!r}), dtypes {','.join(report['dtypes'])}; device {env['device_kind']} "
             f"({env['platform']}), jax {env['jax_version']}"
             + (f"; mesh {report['mesh']}" if report.get("mesh") else ""), ""]
    rows = []
    for k in report["kernels"]:
        for dtype, per in k["summary"].items():
            for name in RESULTS:
                s = per.get(name)
                if s is None:
                    continue
                w = s["worst"]
                grade = FAIL if s["failed"] else (f"{PRECISION} ({s['precision']})" if s.get("precision") else PASS)
                rows.append([k["name"], dtype, name, fmt_err(w["err_ratio"]), f"{w['tol_ratio']:.1e}",
                             fmt_err(w["max_err"]), f"{w['tol_max']:.1e}", w["rule"], w["case"],
                             f"{s['failed']}/{s['cases']}", grade])
            if per.get("_errors"):
                rows.append([k["name"], dtype, "(error)", "-", "-", "-", "-", "error",
                             f"{len(per['_errors'])} case(s)", f"{len(per['_errors'])}", "FAIL"])
            if per.get("_input_errors"):
                rows.append([k["name"], dtype, "(input error)", "-", "-", "-", "-", "input-error",
                             f"{len(per['_input_errors'])} case(s)", f"{len(per['_input_errors'])}", "NOT JUDGED"])
    lines.append(table(["kernel", "dtype", "result", "err_ratio", "tol", "max_err", "tol", "rule",
                        "worst case", "failed", "verdict"], rows, "<<<>>>><<><"))
    failures = []
    for k in report["kernels"]:
        for c in k["cases"]:
            if c["passed"]:
                continue
            if c.get("outcome") == "input-error":
                failures.append(f"  {k['name']:<14} {c['dtype']:<8} {c['case']:<28} input error (not judged): "
                                f"{c['error']}")
            elif c["error"]:
                failures.append(f"  {k['name']:<14} {c['dtype']:<8} {c['case']:<28} error: {c['error']}")
            else:
                bad = [v for v in c["verdicts"] if not v["passed"]]
                desc = ", ".join(f"{v['name']} x{severity(v):.3g}" for v in sorted(bad, key=severity, reverse=True))
                failures.append(f"  {k['name']:<14} {c['dtype']:<8} {c['case']:<28} {case_grade(c)}: {len(bad)}/9 "
                                f"over tolerance (error/tolerance): {desc}")
                failures += [f"      diagnosis {f['kind']}: {f['text']}" for f in c.get("diagnosis") or []]
    if failures:
        n_bad = sum(not c["passed"] for k in report["kernels"] for c in k["cases"])
        lines += ["", f"Cases not graded PASS ({n_bad}):"]
        lines += failures[:max_failures]
        if len(failures) > max_failures:
            lines.append(f"  ... {len(failures) - max_failures} more lines in the JSON report")
    diagnoses = [(k["name"], f) for k in report["kernels"] for f in k.get("diagnosis") or []]
    if diagnoses:
        lines += ["", "Diagnosis (across cases):"] + [f"  {name}: {f['kind']}: {f['text']}" for name, f in diagnoses]
    n_prec = sum(k.get("n_precision", 0) for k in report["kernels"])
    if n_prec:
        lines += ["", f"WARNING: {n_prec} case(s) graded PRECISION: over the working-precision tolerance but within "
                      "the precision-loss bound (docs/DESIGN.md §4): the algorithm is right, precision is lost of a "
                      "known kind. Not a failure (exit 0) unless --strict."]
    notes = [(k["name"], n) for k in report["kernels"] for n in k["notes"]]
    if notes:
        lines += ["", "Notes:"] + [f"  {name}: {n}" for name, n in notes]
    lines.append("")
    verdict = {"pass": "PASS", "fail": "FAIL", "input-error": "INPUT ERROR", "interrupted": "INTERRUPTED",
               "precision": "PRECISION (warning)"}
    for k in report["kernels"]:
        kinds = outcome([k])
        n_in = k.get("n_input_errors", 0)
        lines.append(f"{k['name']}: {'PASS' if k['passed'] else verdict[kinds]}"
                     f"{' so far' if report.get('interrupted') else ''} "
                     f"({k['n_cases'] - k['n_failed']}/{k['n_cases']} cases pass"
                     f"{f', {n_p} graded PRECISION' if (n_p := k.get('n_precision', 0)) else ''}"
                     f"{f', {n_in} not judged: input error' if n_in else ''})")
    what = report.get("outcome", "pass" if report["passed"] else "fail")
    why = {"input-error": "; some cases could not be loaded (see above), every other case passed",
           "interrupted": f"; {max((k['n_cases'] for k in report['kernels']), default=0)} of {report['n_cases']} "
                          "cases were run"}.get(what, "")
    lines.append(f"overall: {verdict[what]}{why} ({report['seconds']:.0f} s)")
    return "\n".join(lines)
