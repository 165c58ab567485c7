"""``gdn2-oracle hunt``: a Hypothesis search for the problems on which a kernel is furthest from the oracle.

Recipes come from the conformance suite's generator (:mod:`property_tests.strategies`: its ``CORE``
shapes, or with ``shapes="all"`` the full cross product of its small sets; every decay and gate regime,
q/k mode, initial state, dtype and data seed). Each is judged by the tolerance model and error /
tolerance of every result (or of the one named) goes to ``hypothesis.target``, so the search climbs
towards the regimes where the kernel is worst. The first FAIL is shrunk to a minimal recipe and
reported with the one-line reproducer and the ``@example`` line that pins it.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from gdn2_oracle.oracle import RESULTS
from gdn2_oracle.property_tests import strategies

from ..grading.grades import FAIL, grade_rank
from ..running import harness
from . import args as cli_args
from .output import EXIT, progress

SHAPES = ("core", "all")
DEFAULT_BUDGET = 500  # recipes drawn (shrinking a FAIL comes on top); half of them go to targeting


class Found(Exception):
    """A recipe with a FAIL (raised inside the search so that Hypothesis shrinks it)."""


def recipes(shapes="core"):
    """The recipes searched: the conformance suite's CORE configs, or (``"all"``) also any config of its small sets."""
    if shapes not in SHAPES:
        raise ValueError(f"shapes: {shapes!r} not one of {SHAPES}")
    core = st.sampled_from(strategies.CORE).flatmap(strategies.specs)
    return core if shapes == "core" else st.one_of(core, strategies.any_spec())


def hunt(fn, kernel, *, budget=DEFAULT_BUDGET, result=None, seed=0, shapes="core", show_progress=True):
    """Search up to ``budget`` recipes for a FAIL of kernel ``fn`` (spec ``kernel``, used in the reproducer).

    Returns a :class:`HuntReport` (``worst``: {ratio, result, grade, recipe}; ``found``: None or
    {recipe, report, failed, repro, example}): ``first_fail`` counts the recipes run up to the first FAIL
    (before shrinking), ``found`` holds the shrunk (minimal) failing recipe.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget: expected a positive integer, got {budget!r}")
    if result is not None and result not in RESULTS:
        raise ValueError(f"result: {result!r} not one of {RESULTS}")
    space = recipes(shapes)
    state = {"examples": 0, "worst": None, "found": None, "first_fail": None, "interrupted": False}
    bar = progress(total=budget, desc=f"hunt {kernel}", unit="example") if show_progress else None

    def check(spec):
        problem, do, dfs = spec.build()
        state["examples"] += 1
        if bar is not None:
            bar.update(1)
        try:
            report = harness.validate(fn, problem, do, dfs, dtype=spec.dtype)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises fails the recipe
            state["found"] = {"recipe": spec, "report": None, "failed": [f"error: {type(exc).__name__}: {exc}"]}
            state["first_fail"] = state["first_fail"] or state["examples"]
            raise Found(str(exc)) from None
        ratios = strategies.target_ratios(report, result)
        name = max(ratios, key=ratios.get)
        grade = report[name].grade
        if state["worst"] is None or (grade_rank(grade), ratios[name]) > (grade_rank(state["worst"]["grade"]),
                                                                          state["worst"]["ratio"]):
            state["worst"] = {"ratio": ratios[name], "result": name, "grade": grade, "recipe": spec}
        failed = [n for n in ratios if report[n].grade == FAIL]
        if failed:
            state["found"] = {"recipe": spec, "report": report, "failed": failed}
            state["first_fail"] = state["first_fail"] or state["examples"]
            if bar is not None:
                bar.set_postfix_str("shrinking a FAIL")
            raise Found(", ".join(failed))

    search = settings(max_examples=budget, deadline=None, database=None, derandomize=False,
                      phases=(Phase.generate, Phase.target, Phase.shrink), verbosity=Verbosity.quiet,
                      suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                      print_blob=False)(given(spec=space)(check))
    start = time.perf_counter()
    try:
        hypothesis_seed(seed)(search)()
    except Found:
        pass  # Hypothesis replays the minimal failing recipe last, so state["found"] holds it
    except Flaky:  # the replay did not fail again: a non-deterministic kernel; keep the last failing recipe
        state["found"]["failed"].append("flaky: the same recipe passed when replayed")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: report the seed and the worst recipe so far
        state["interrupted"] = True
    finally:
        if bar is not None:
            bar.close()
    found = state["found"]
    if found is not None:
        found["repro"] = strategies.repro(found["recipe"], kernel)
        found["example"] = strategies.example(found["recipe"])
    return HuntReport(kernel=kernel, budget=budget, seed=seed, shapes=shapes, result=result,
                      examples=state["examples"], first_fail=state["first_fail"], seconds=time.perf_counter() - start,
                      worst=state["worst"], found=found, interrupted=state["interrupted"])


@dataclass
class HuntReport:
    """A search: its budget and seed, the worst error / tolerance reached and the shrunk FAIL, if any
    (``found``: recipe, report, failed results, reproducer, ``@example`` line)."""

    kernel: str
    budget: int
    seed: int
    shapes: str
    result: str | None
    examples: int
    first_fail: int | None
    seconds: float
    worst: dict | None
    found: dict | None
    interrupted: bool = False


def format_hunt(out):
    """What the CLI prints: the search, the shrunk FAIL with its reproducer (if any), the worst ratio reached."""
    what = f"result {out.result}" if out.result else "every result"
    lines = [f"gdn2-oracle hunt: {out.kernel}, {out.examples} recipes run (budget {out.budget}, seed "
             f"{out.seed}, {out.shapes} shapes, targeting {what}) in {out.seconds:.0f} s"]
    found = out.found
    if found is not None:
        lines += ["", f"FAIL ({', '.join(found['failed'])}) first at recipe {out.first_fail}, shrunk to "
                      f"{found['recipe']!r}"]
        if found["report"] is not None:
            lines.append(found["report"].format())
        lines += [f"reproduce: {found['repro']}", f"pin it:    {found['example']}"]
    worst = out.worst
    if worst is not None:
        lines += ["", f"worst error / tolerance reached: {worst['ratio']:.3g} ({worst['result']}, {worst['grade']}) "
                      f"on {worst['recipe']!r}"]
    if out.interrupted:
        lines.append(f"hunt: INTERRUPTED after {out.examples} recipes; rerun the same search with --seed {out.seed}")
    lines.append("hunt: FAIL found" if found is not None else "hunt: no FAIL found")
    return "\n".join(lines)


def _count(text):
    import argparse

    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def add_parser(sub):
    """``gdn2-oracle hunt``."""
    h = sub.add_parser("hunt", help="Hypothesis search for a FAIL, targeting error / tolerance",
                       description="Search the conformance suite's recipes with hypothesis.target on error / "
                                   "tolerance; shrink a FAIL to a minimal recipe and print its reproducer. Exit 1 on "
                                   "a FAIL.")
    cli_args.add_kernels(h, one=True)
    h.add_argument("--budget", type=_count, default=DEFAULT_BUDGET, metavar="N",
                   help=f"recipes drawn (default {DEFAULT_BUDGET}; shrinking a FAIL comes on top)")
    h.add_argument("--result", choices=RESULTS, help="target and judge only this result (default: all)")
    h.add_argument("--seed", type=cli_args.nonnegative, help="search seed (default: random, printed)")
    h.add_argument("--shapes", choices=SHAPES, default="core",
                   help="core (default: the conformance suite's CORE configs) or all (its small sets' cross product)")
    cli_args.add_run_options(h, mesh_jobs=False)


def run(args):
    """Search, print the shrunk FAIL (if any) and the worst ratio reached; exit 1 on a FAIL."""
    [spec] = cli_args.specs(args.kernel)
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    fn = cli_args.build(spec)
    print(f"gdn2-oracle hunt: seed {seed} (the same search again: --seed {seed})", file=sys.stderr, flush=True)
    out = hunt(fn, spec.spec, budget=args.budget, result=args.result, seed=seed, shapes=args.shapes,
               show_progress=not args.no_progress)
    print(format_hunt(out), flush=True)
    if out.found is not None:
        return EXIT["fail"]
    return EXIT["interrupted"] if out.interrupted else EXIT["pass"]
