"""Calibrate the tolerance model (ci/grading/tolerance.py): false alarms of correct kernels, and the spread of err/tol.

Runs our kernels over every decay regime x gate regime x configuration (shapes and dtypes of
``strategies.CORE``, optionally more seeds), judges each result with ``ci.grading.tolerance.compare``, and
reports

* the false-alarm count and rate per kernel and dtype (a "false alarm" is a failed verdict of a
  kernel we believe correct; each one is listed with its rule, the regime and a one-line repro, so
  it can be classified as an unfair rule or a kernel defect);
* the distribution of ``ratio = max(err_ratio / tol_ratio, max_err / tol_max)`` per result
  (quantiles; ``ratio > 1`` fails);
* the agreement of the two kernels, ``max(metric(pairwise - factorized) / bound)`` per result, with
  ``bound`` the property suite's tight agreement bound (``rule.agreement_tolerance``);
* with ``--variants``, the same agreement for other chunk sizes / split points.

Usage (from a clone, after ``make test``'s editable install)::

    .venv/bin/python -m gdn2_oracle.ci.benchmarks.calibrate_tolerance [--seeds N] [--kernels pairwise,factorized]
        [--configs all|f32|bf16] [--variants] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import zlib
from collections import defaultdict

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading import references, tolerance
from gdn2_oracle.ci.running import harness
from gdn2_oracle.oracle import RESULTS, Recipe
from gdn2_oracle.property_tests.strategies import CORE

QUANTILES = (0.5, 0.9, 0.99, 1.0)


def ratio(v):
    """How close a verdict is to failing: max of its two metrics over their tolerances (inf if non-finite)."""
    return max(v.err_ratio / v.tol_ratio, v.max_err / v.tol_max)


def agreement_ratios(problem, a, b, ref, base, dtype):
    """Per result: error / the property suite's tight agreement bound (``tolerance.agreement``); <= 1 passes."""
    report = tolerance.agreement(problem, a, b, ref, base, dtype)
    return {v.name: max(v.err_ratio / v.tol_ratio, v.max_err / v.tol_max) for v in report.verdicts}


def examples(configs, seeds):
    """(recipe) for every config x decay x gates x seed; qk and initial state vary with the seed."""
    for config, decay, gates, s in itertools.product(configs, oracle.DECAYS, oracle.GATES, range(seeds)):
        seed = zlib.crc32(repr((tuple(config), decay, gates, s)).encode())
        yield Recipe(*config.shape, decay=decay, gates=gates, qk=oracle.QK_MODES[(seed >> 3) & 1],
                     initial_state=bool(seed & 1), precision=config.dtype, seed=seed, cot_seed=seed ^ 0x5A5A)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=1, help="examples per (config, decay, gates)")
    ap.add_argument("--kernels", default="pairwise,factorized")
    ap.add_argument("--configs", default="all", choices=("all", "f32", "bf16"))
    ap.add_argument("--variants", action="store_true", help="also chunk_size 16/32 and split 1/48 (factorized)")
    ap.add_argument("--json", help="write every ratio to this file")
    return ap


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def kernels_under_test(args):
    """``(names, {name: fn}, {variant label: fn})``: the kernels, and with ``--variants`` their option variants."""
    from gdn2_oracle import kernels
    names = [n.strip() for n in args.kernels.split(",") if n.strip()]
    fns = {n: kernels.get(n) for n in names}
    variants = {}
    if args.variants:
        variants = {"pairwise[C=16]": kernels.get("pairwise", chunk_size=16),
                    "factorized[C=32]": kernels.get("factorized", chunk_size=32),
                    "factorized[split=1]": kernels.get("factorized", split=1),
                    "factorized[split=48]": kernels.get("factorized", split=48)}
    return names, fns, variants


class Calibration:
    """What a run collects: ratios per (kernel, dtype, result), agreement ratios per (pair, dtype,
    result), the false alarms ``(kernel, recipe, verdict)`` and the calls judged per (kernel, dtype)."""

    def __init__(self):
        self.ratios = defaultdict(list)
        self.agree = defaultdict(list)
        self.alarms = []
        self.counts = defaultdict(int)

    def judge(self, recipe, names, fns, variants):
        """Run every kernel and variant on one recipe; judge each against the oracle and each pair's agreement."""
        p, do, dfs = recipe.build()
        ref = references.reference_results(p, do, dfs)
        got = {n: harness.kernel_results(fn, p, do, dfs, dtype=recipe.dtype) for n, fn in {**fns, **variants}.items()}
        base = tolerance.baseline(p, do, dfs, {r: tolerance.dtype_name(got[names[0]][r]) for r in RESULTS})
        for n in [*names, *variants]:  # every kernel and option variant against the oracle
            rep = tolerance.compare(p, do, dfs, got[n], ref, dtype=recipe.dtype, base=base)
            self.counts[(n, recipe.dtype)] += 1
            for v in rep.verdicts:
                self.ratios[(n, recipe.dtype, v.name)].append(ratio(v))
                if not v.passed:
                    self.alarms.append((n, recipe, v))
        pairs = [("pairwise", "factorized")] if "pairwise" in got and "factorized" in got else []
        pairs += [(vn, vn.split("[")[0]) for vn in variants]
        for a, b in pairs:  # tight agreement: kernel vs kernel, variant vs its default
            for r, x in agreement_ratios(p, got[a], got[b], ref, base, recipe.dtype).items():
                self.agree[(f"{a}~{b}", recipe.dtype, r)].append(x)


def _quantiles(x):
    x = np.array(x)
    return " ".join(f"{np.quantile(x, q):9.2e}" for q in QUANTILES)


def print_summary(cal):
    """False-alarm rates per kernel and dtype, then the ratio and agreement quantiles."""
    print("## false alarms (failed results / results judged; failed calls / calls)")
    by_call = defaultdict(set)
    for n, recipe, _ in cal.alarms:
        by_call[(n, recipe.dtype)].add(recipe)
    for (n, dt), c in sorted(cal.counts.items()):
        nf = sum(1 for a in cal.alarms if a[0] == n and a[1].dtype == dt)
        print(f"{n:<22} {dt:<9} results {nf:>4}/{c * len(RESULTS):<5} ({nf / (c * len(RESULTS)):.2%})   "
              f"calls {len(by_call[(n, dt)]):>3}/{c} ({len(by_call[(n, dt)]) / c:.1%})")
    quantiles = ", ".join(f"q{q:g}" for q in QUANTILES)
    print("\n## ratio = max(err_ratio/tol_ratio, max_err/tol_max): quantiles " + quantiles)
    for key in sorted(cal.ratios):
        print(f"{key[0]:<22} {key[1]:<9} {key[2]:<12} " + _quantiles(cal.ratios[key]))
    if cal.agree:
        print("\n## agreement: max(metric(a - b)/bound) per result (bound = rule.agreement_tolerance): quantiles "
              + quantiles)
        for key in sorted(cal.agree):
            print(f"{key[0]:<38} {key[1]:<9} {key[2]:<12} " + _quantiles(cal.agree[key]))


def print_alarms(cal):
    """Every false alarm by regime, then the first 40 with their verdicts and recipes."""
    print(f"\n## false alarms in detail ({len(cal.alarms)})")
    by_regime = defaultdict(int)
    for n, recipe, v in cal.alarms:
        by_regime[(n, recipe.dtype, recipe.decay, recipe.gates, v.name)] += 1
    for (n, dt, d, gt, r), c in sorted(by_regime.items()):
        print(f"{n:<22} {dt:<9} decay={d:<9} gates={gt:<11} {r:<12} x{c}")
    for n, recipe, v in cal.alarms[:40]:
        print(f"- {n} {v.name}: err_ratio {v.err_ratio:.2e} (tol {v.tol_ratio:.1e}) max_err {v.max_err:.2e} "
              f"(tol {v.tol_max:.1e}) rule={v.rule} {v.note}\n    {recipe.call()}  cot_seed={recipe.cot_seed}")


def write_json(path, cal):
    def spec(recipe):  # the make_problem arguments, shape included
        return {**dict(zip("BTHKV", recipe.shape)), **recipe.kwargs()}

    with open(path, "w") as f:
        json.dump({"ratios": {"|".join(k): v for k, v in cal.ratios.items()},
                   "agreement": {"|".join(k): v for k, v in cal.agree.items()},
                   "alarms": [dict(kernel=n, spec=spec(recipe), cot_seed=recipe.cot_seed, verdict=v.as_dict())
                              for n, recipe, v in cal.alarms]}, f)


def main(argv=None):
    args = parse_args(argv)
    names, fns, variants = kernels_under_test(args)
    configs = [c for c in CORE if args.configs == "all" or (c.dtype == "float32") == (args.configs == "f32")]
    cal = Calibration()
    t0 = time.time()
    for recipe in examples(configs, args.seeds):
        cal.judge(recipe, names, fns, variants)
    elapsed = time.time() - t0
    print(f"# tolerance calibration: {len(configs)} configs x {len(oracle.DECAYS)} decays x "
          f"{len(oracle.GATES)} gate regimes x {args.seeds} seed(s); {elapsed:.0f} s\n")
    print_summary(cal)
    print_alarms(cal)
    if args.json:
        write_json(args.json, cal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
