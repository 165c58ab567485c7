"""Which of the suite's deliberately wrong kernels the smoke and quick sets catch (a script, not a test).

Each mutant of ``kernels/testing*.py`` (:data:`MUTANTS`) runs ``validate --cases quick`` in a fresh process through the
console script, as a user runs it; all runs share one cache home (the reference cache: the oracle's values do not
depend on the kernel; every mutant's programs are its own). The smoke set is a part of the quick set
(``validate.in_smoke``), so one quick run per mutant says both: a set *catches* a mutant when one of its cases is
graded FAIL (``fail`` or ``error``: what makes ``validate`` exit 1). Prints one row per mutant -- caught by smoke,
caught by quick, FAIL cases / cases of each -- and, with ``--json``, the case names, so two runs (before and after a
change of the case sets) can be compared name by name.

    python -m gdn2_oracle.ci.benchmarks.bench_catches --jobs 2 --json catches.json
    python -m gdn2_oracle.ci.benchmarks.bench_catches --mutant narrow --mutant gdn_gva_modulo
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gdn2_oracle.ci.benchmarks.bench_estimates import run_validate
from gdn2_oracle.kernels import testing_families, testing_modes

# The wrong kernels, by module (``module:attr`` under gdn2_oracle.kernels): the lists of the modules that keep one,
# the others named here.
MUTANTS = {
    "testing": ("perturbed", "broken", "restarting", "clipped_log_decay", "cumsum_difference", "narrow"),
    "testing_diagnose": ("skip_erase_every_64", "transposed_erase", "h0_decayed_twice", "final_state_early",
                         "h0_in_bf16", "bf16_log_decay", "bf16_operands", "bf16_solve", "damped_solve",
                         "clipped_exponent"),
    "testing_modes": tuple(testing_modes.MUTANTS),
    "testing_families": tuple(f"{family}_{bug}" for family in ("gdn", "kda") for bug in testing_families.MUTANTS),
}
CAUGHT = ("fail", "error")


def specs(only=()):
    """``[(name, spec)]`` of :data:`MUTANTS` (those named in ``only``, when given)."""
    every = [(attr, f"gdn2_oracle.kernels.{module}:{attr}") for module, attrs in MUTANTS.items() for attr in attrs]
    unknown = sorted(set(only) - {name for name, _ in every})
    if unknown:
        raise ValueError(f"mutant: unknown {unknown}")
    return [(name, spec) for name, spec in every if not only or name in only]


def smoke_names():
    """The names of the smoke set's cases, over every family (the smoke set is a part of the quick set)."""
    from gdn2_oracle.ci.commands import validate

    return {c.name for c in validate.build_cases("smoke", families=validate.FAMILIES)}


def run_quick(spec, home):
    """One ``validate --cases quick`` of ``spec`` in a fresh process (``bench_estimates.run_validate``): ``(exit code,
    wall seconds, cases)``, ``cases`` the report's ``[(name, dtype, outcome)]``."""
    _, wall, report, code = run_validate(spec, "quick", None, home)
    if report is None:
        raise RuntimeError(f"{spec}: validate wrote no report (exit {code})")
    [kernel] = report["kernels"]
    return code, wall, [(c["case"], c.get("dtype"), c["outcome"]) for c in kernel["cases"]]


def row(name, code, wall, cases, smoke):
    """One mutant's figures: caught by each set, its FAIL cases and cases, the names of the FAIL cases."""
    out = {"mutant": name, "exit": code, "seconds": round(wall, 1)}
    for label, chosen in (("smoke", [c for c in cases if c[0] in smoke]), ("quick", cases)):
        failed = sorted({f"{n}[{d}]" for n, d, o in chosen if o in CAUGHT})
        out[label] = {"caught": bool(failed), "failed": len(failed), "cases": len(chosen), "failed_cases": failed}
    return out


def build_parser():
    """The script's arguments."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutant", action="append", default=[], help="only this mutant (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run side by side (default 1)")
    ap.add_argument("--json", help="write the rows here")
    return ap


def main(argv=None):
    """Run every mutant (``--mutant``: those), print the table (and ``--json``)."""
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        raise SystemExit("--jobs: expected an integer >= 1")
    chosen, smoke = specs(args.mutant), smoke_names()
    with tempfile.TemporaryDirectory() as home, ThreadPoolExecutor(args.jobs) as pool:
        runs = pool.map(lambda ns: (ns[0], *run_quick(ns[1], home)), chosen)
        rows = []
        print(f"{'mutant':32} {'smoke':>12} {'quick':>12} {'exit':>4} {'s':>6}", flush=True)
        for name, code, wall, cases in runs:
            r = row(name, code, wall, cases, smoke)
            rows.append(r)
            cell = {k: f"{'yes' if r[k]['caught'] else 'no'} {r[k]['failed']}/{r[k]['cases']}" for k in ("smoke",
                                                                                                           "quick")}
            print(f"{name:32} {cell['smoke']:>12} {cell['quick']:>12} {code:>4} {wall:6.1f}", flush=True)
    caught = {k: sum(r[k]["caught"] for r in rows) for k in ("smoke", "quick")}
    print(f"caught: smoke {caught['smoke']} of {len(rows)}, quick {caught['quick']} of {len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
