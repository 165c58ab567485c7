"""``gdn2-oracle validate``: every kernel on the golden corpus and on generated, oracle-checked problems.

A *case* (a :class:`Trial`) is one problem -- a golden, or an :class:`oracle.Recipe` -- with its
cotangents and exact reference, fed to the kernels in one input dtype. Sources:

* ``golden`` -- every case of the golden corpus (256-bit mpmath references), in its own precision;
* ``quick``  -- the golden corpus plus a handful of generated problems per dtype (float64 oracle);
* ``full``   -- the golden corpus plus every decay x gate regime at several lengths per dtype.

Each kernel result (forward output, final state, seven gradients) is judged by the tolerance model
(:mod:`ci.tolerance`); the oracle reference and the working-precision baseline are computed once per
case and shared by all kernels. A kernel that raises on a case fails that case (rule ``error``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


from gdn2_oracle import oracle
from gdn2_oracle.oracle import KERNEL_DTYPES, RESULTS, Recipe

from . import harness
from .report import UsageError, environment, fmt_err, kernel_notes, progress, source_sha256, table
from .tolerance import baseline, compare, dtype_name

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

    def data(self):
        """``(problem, do, dfinal_state)``."""
        if self._data is None:
            self._data, self._ref = self._build()
        return self._data

    def reference(self):
        if self._ref is None:
            problem, do, dfs = self.data()
            if self._ref is None:
                self._ref = harness.reference_results(problem, do, dfs)
        return self._ref

    def baseline(self, result_dtypes):
        key = tuple(result_dtypes[n] for n in RESULTS)
        if key not in self._base:
            self._base[key] = baseline(*self.data(), result_dtypes)
        return self._base[key]

    def release(self):
        """Drop cached arrays (kept small when many cases run)."""
        self._data = self._ref = None
        self._base = {}

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


def run_trial(fn, case: Trial):
    """Judge kernel ``fn`` on one trial: ``{"passed", "verdicts", "error", "seconds"}``."""
    t0 = time.perf_counter()
    problem, do, dfs = case.data()
    try:
        harness.check_representable(problem, case.dtype)
        got = harness.kernel_results(fn, problem, do, dfs, dtype=case.dtype)
    except Exception as exc:  # noqa: BLE001 - any kernel failure is a failed case, reported by name
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        return {"passed": False, "verdicts": [], "error": msg, "seconds": time.perf_counter() - t0}
    base = case.baseline({n: dtype_name(got[n]) for n in RESULTS})
    report = compare(problem, do, dfs, got, case.reference(), dtype=case.dtype, base=base)
    return {"passed": report.passed, "verdicts": [v.as_dict() for v in report.verdicts], "error": None,
            "seconds": time.perf_counter() - t0}


def severity(v):
    """How far a verdict is from its tolerance (>1 fails): max of the two metric ratios."""
    def ratio(err, tol):
        if err != err or err == float("inf"):
            return float("inf")
        return err / tol if tol > 0 else (0.0 if err == 0 else float("inf"))
    return max(ratio(v["err_ratio"], v["tol_ratio"]), ratio(v["max_err"], v["tol_max"]))


def summarize(case_results):
    """``{dtype: {result: worst verdict (+ case, cases, failed)}}`` and per-dtype error counts."""
    out = {}
    for cr in case_results:
        per = out.setdefault(cr["dtype"], {})
        if cr["error"]:
            per.setdefault("_errors", []).append(cr["case"])
            continue
        for v in cr["verdicts"]:
            s = per.setdefault(v["name"], {"cases": 0, "failed": 0, "worst": None})
            s["cases"] += 1
            s["failed"] += 0 if v["passed"] else 1
            if s["worst"] is None or severity(v) > severity(s["worst"]):
                s["worst"] = {**v, "case": cr["case"], "severity": severity(v)}
    return out


def run_validation(specs, *, dtypes=KERNEL_DTYPES, cases="quick", seed=0, only=None,
                   show_progress=True, env=None):
    """Validate every kernel spec (:class:`ci.report.KernelSpec`); returns the JSON-ready report.

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
    for case in case_list:
        for (spec, fn), kout in zip(built, kernels_out):
            if bar is not None:
                bar.set_postfix_str(f"{spec.label()} {case.name}")
            res = run_trial(fn, case)
            kout["cases"].append({**case.describe(), **res})
            if bar is not None:
                bar.update(1)
        case.release()
    if bar is not None:
        bar.close()
    for kout in kernels_out:
        kout["passed"] = all(c["passed"] for c in kout["cases"])
        kout["n_cases"] = len(kout["cases"])
        kout["n_failed"] = sum(not c["passed"] for c in kout["cases"])
        kout["summary"] = summarize(kout["cases"])
    return {
        "schema": SCHEMA,
        "command": "validate",
        "cases": cases,
        "dtypes": list(dtypes),
        "seed": seed,
        "only": list(only) if only else None,
        "environment": env or environment(),
        "n_cases": len(case_list),
        "seconds": time.perf_counter() - t0,
        "passed": all(k["passed"] for k in kernels_out),
        "kernels": kernels_out,
    }


def format_validation(report, *, max_failures=60):
    """The verdict table (kernel x dtype x result: worst case), per-case failures and the verdict line."""
    env = report["environment"]
    n_gold = sum(1 for c in report["kernels"][0]["cases"] if c["source"] == "golden") if report["kernels"] else 0
    lines = [f"gdn2-oracle validate: {report['n_cases']} cases ({n_gold} golden, {report['n_cases'] - n_gold} generated; "
             f"set {report['cases']!r}), dtypes {','.join(report['dtypes'])}; device {env['device_kind']} "
             f"({env['platform']}), jax {env['jax_version']}", ""]
    rows = []
    for k in report["kernels"]:
        for dtype, per in k["summary"].items():
            for name in RESULTS:
                s = per.get(name)
                if s is None:
                    continue
                w = s["worst"]
                rows.append([k["name"], dtype, name, fmt_err(w["err_ratio"]), f"{w['tol_ratio']:.1e}",
                             fmt_err(w["max_err"]), f"{w['tol_max']:.1e}", w["rule"], w["case"],
                             f"{s['failed']}/{s['cases']}", "PASS" if s["failed"] == 0 else "FAIL"])
            if per.get("_errors"):
                rows.append([k["name"], dtype, "(error)", "-", "-", "-", "-", "error",
                             f"{len(per['_errors'])} case(s)", f"{len(per['_errors'])}", "FAIL"])
    lines.append(table(["kernel", "dtype", "result", "err_ratio", "tol", "max_err", "tol", "rule",
                        "worst case", "failed", "verdict"], rows, "<<<>>>><<><"))
    failures = []
    for k in report["kernels"]:
        for c in k["cases"]:
            if c["passed"]:
                continue
            if c["error"]:
                failures.append(f"  {k['name']:<14} {c['dtype']:<8} {c['case']:<28} error: {c['error']}")
            else:
                bad = [v for v in c["verdicts"] if not v["passed"]]
                desc = ", ".join(f"{v['name']} x{severity(v):.3g}" for v in sorted(bad, key=severity, reverse=True))
                failures.append(f"  {k['name']:<14} {c['dtype']:<8} {c['case']:<28} {len(bad)}/9 over tolerance "
                                f"(error/tolerance): {desc}")
    if failures:
        lines += ["", f"Failing cases ({len(failures)}):"]
        lines += failures[:max_failures]
        if len(failures) > max_failures:
            lines.append(f"  ... {len(failures) - max_failures} more in the JSON report")
    notes = [(k["name"], n) for k in report["kernels"] for n in k["notes"]]
    if notes:
        lines += ["", "Notes:"] + [f"  {name}: {n}" for name, n in notes]
    lines.append("")
    for k in report["kernels"]:
        lines.append(f"{k['name']}: {'PASS' if k['passed'] else 'FAIL'} "
                     f"({k['n_cases'] - k['n_failed']}/{k['n_cases']} cases pass)")
    lines.append(f"overall: {'PASS' if report['passed'] else 'FAIL'} ({report['seconds']:.0f} s)")
    return "\n".join(lines)
