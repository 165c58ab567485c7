"""``gdn2-oracle hunt``: a Hypothesis search for the problems on which a kernel is furthest from the oracle.

Recipes come from the conformance suite's generator (:mod:`property_tests.strategies`: its ``CORE``
shapes, or with ``shapes="all"`` the full cross product of its small sets; every decay and gate regime,
q/k mode, initial state, dtype and data seed). Each is judged by the tolerance model and error /
tolerance of every result (or of the one named) goes to ``hypothesis.target``, so the search climbs
towards the regimes where the kernel is worst. The first FAIL is shrunk to a minimal recipe and
reported with the one-line reproducer and the ``@example`` line that pins it.

Training-call modes (``modes``; docs/modes.md): each accepted mode adds drawn FLA training calls
(:func:`property_tests.strategies.mode_recipes`: packed lengths, gate forms and ``lower_bound``, near-zero q/k rows,
``[V, K]`` states, states at chunk starts), judged by the modes judge (``ci/grading/modes.py``) and targeted the
same way; a FAIL is shrunk to a minimal :class:`oracle.mode_recipes.ModeRecipe`.

Family kernels (KDA, Gated DeltaNet in FLA's signature; ``family``): drawn
:class:`oracle.family_recipes.FamilyRecipe` s of the kernel's family instead (hunt_families.py: grouped value heads,
decay and beta regimes, the FLA keywords the kernel takes; with training-call modes the family's calls in the
structure of a catalogued mode recipe using them -- its lengths, packing, gate form -- where the kernel takes every
keyword), judged by the family judge; a FAIL is shrunk to a minimal FamilyRecipe and printed with its one-liner (no
``@example`` line: no conformance test draws family recipes yet).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from gdn2_oracle.oracle import call_modes
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.oracle.mode_recipes import ModeRecipe
from gdn2_oracle.property_tests import strategies

from ..grading.families import FAMILY_RESULTS, GDN2
from ..grading.grades import FAIL, grade_rank
from ..grading.modes import MODE_RESULTS, ModeCase
from ..grading.result import error_text
from ..running import families as family_running
from ..running import harness
from ..running import modes as mode_running
from . import args as cli_args
from . import hunt_families
from .family_options import family_modes, kernel_and_family, refuse
from .loop import RunLoop
from .output import EXIT, interrupt_error, timed_out

SHAPES = ("core", "all")
RESULTS = tuple(dict.fromkeys(MODE_RESULTS + FAMILY_RESULTS))  # what --result may name (a GDN-2 or a family result)
DEFAULT_BUDGET = 500  # recipes drawn (shrinking a FAIL comes on top); half of them go to targeting


class Found(Exception):
    """A recipe with a FAIL (raised inside the search so that Hypothesis shrinks it)."""


PLAIN = call_modes.BASE.name  # the dense call: the conformance suite's recipes


def recipes(shapes="core", modes=(PLAIN,), family=GDN2, flags=family_running.FLAGS):
    """The recipes searched: with ``dense`` the conformance suite's CORE configs, or (``"all"``) also any config of
    its small sets; with training-call modes, drawn :class:`ModeRecipe` s using some of them; for a family kernel
    (``family`` gdn or kda, taking the FLA keywords ``flags``), drawn :class:`FamilyRecipe` s
    (``hunt_families.family_space``: dense ones, and with training-call modes the family's calls in their structure)."""
    if shapes not in SHAPES:
        raise ValueError(f"shapes: {shapes!r} not one of {SHAPES}")
    if family != GDN2:
        return hunt_families.family_space(family, shapes, modes, flags)
    spaces = []
    if PLAIN in modes:
        core = st.sampled_from(strategies.CORE).flatmap(strategies.specs)
        spaces.append(core if shapes == "core" else st.one_of(core, strategies.any_spec()))
    calls = [m for m in modes if not call_modes.is_base(m)]
    if calls:
        spaces.append(strategies.mode_recipes(calls))
    if not spaces:
        raise ValueError(f"modes: nothing to search in {tuple(modes)!r}")
    return spaces[0] if len(spaces) == 1 else st.one_of(*spaces)


def judge(fn, recipe):
    """Run kernel ``fn`` on a drawn recipe and grade it: a dense :class:`oracle.Recipe` by the tolerance model, a
    :class:`ModeRecipe` by the modes judge, a :class:`FamilyRecipe` by the family judge."""
    if isinstance(recipe, ModeRecipe):
        return mode_running.validate(fn, ModeCase.from_recipe("hunt", recipe))
    if isinstance(recipe, FamilyRecipe):
        return hunt_families.judge(fn, recipe)
    problem, do, dfs = recipe.build()
    return harness.validate(fn, problem, do, dfs, dtype=recipe.dtype)


@dataclass
class Search:
    """A search so far: the recipes run, the worst error / tolerance reached (``worst``: {ratio, result, grade,
    recipe}), the failing recipe (``found``: {recipe, report, failed}) and the recipe count at the first FAIL."""

    examples: int = 0
    worst: dict | None = None
    found: dict | None = None
    first_fail: int | None = None

    def fail(self, recipe, report, failed):
        """Record a failing recipe (Hypothesis replays the shrunk one last, so the last recorded is the minimal one)."""
        self.found = {"recipe": recipe, "report": report, "failed": failed}
        self.first_fail = self.first_fail or self.examples

    def climb(self, recipe, report, ratios):
        """Keep the recipe whose worst result (by grade, then error / tolerance) is the worst reached so far."""
        name = max(ratios, key=ratios.get)
        grade = report[name].grade
        if self.worst is None or (grade_rank(grade), ratios[name]) > (grade_rank(self.worst["grade"]),
                                                                      self.worst["ratio"]):
            self.worst = {"ratio": ratios[name], "result": name, "grade": grade, "recipe": recipe}


@dataclass(frozen=True)
class HuntOptions:
    """What a hunt searches and how it runs (defaults: 500 recipes, every result, seed 0, the CORE shapes, dense).

    ``budget``: the recipes drawn (a positive integer); ``result``: the one result targeted and judged (None: all);
    ``shapes``: one of :data:`SHAPES`; ``modes``: ``dense`` and training-call modes to draw; ``case_timeout``: the
    seconds one kernel call may take (0 or None: no limit); ``family``: the kernel's family
    (``ci.running.families.kernel_family``): ``gdn2``, or ``gdn`` / ``kda`` for a family kernel (its family calls are
    drawn, dense and in the training-call ``modes`` it takes; ``result`` one of ``FAMILY_RESULTS``). A bad value is a
    ValueError naming its field."""

    budget: int = DEFAULT_BUDGET
    result: str | None = None
    seed: int = 0
    shapes: str = "core"
    modes: tuple = (PLAIN,)
    case_timeout: float | None = None
    show_progress: bool = True
    family: str = GDN2

    def __post_init__(self):
        """Refuse a bad budget, result, shapes or modes; keep ``modes`` as a tuple."""
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget: expected a positive integer, got {self.budget!r}")
        results = MODE_RESULTS if self.family == GDN2 else FAMILY_RESULTS
        if self.result is not None and self.result not in results:
            raise ValueError(f"result: {self.result!r} not one of {results} (a {self.family} kernel's)")
        if self.shapes not in SHAPES:
            raise ValueError(f"shapes: {self.shapes!r} not one of {SHAPES}")
        object.__setattr__(self, "modes", tuple(self.modes))
        unknown = [m for m in self.modes if m not in (PLAIN, *call_modes.names("training"))]
        if self.family != GDN2 and unknown:
            raise ValueError(f"modes: a family kernel is searched on its family calls, the {PLAIN} call and the "
                             f"training-call modes; not {unknown!r}")


def hunt(fn, kernel, options=HuntOptions(), *, on_stop=None):
    """Search up to ``options.budget`` recipes for a FAIL of kernel ``fn`` (spec ``kernel``, used in the reproducer).

    Returns a :class:`HuntReport` (``worst``: {ratio, result, grade, recipe}; ``found``: None or
    {recipe, report, failed, repro, example}): ``first_fail`` counts the recipes run up to the first FAIL
    (before shrinking), ``found`` holds the shrunk (minimal) failing recipe. A mode of ``options.modes`` the kernel's
    signature does not accept is reported in ``not_accepted_modes``, not drawn. ``on_stop(report, reason)``: a
    watchdog stops the search when a kernel call passes ``options.case_timeout`` (that recipe is the FAIL, timed out,
    not shrunk) or hangs through Ctrl-C / SIGTERM; ``on_stop`` gets the report so far and the process ends (exit 1,
    130, 143).
    """
    run = HuntRun(fn, kernel, options)
    loop = RunLoop(run.report, "recipes", total=options.budget, desc=f"hunt {kernel}", unit_name="example",
                   show_progress=options.show_progress, case_timeout=options.case_timeout, on_stop=on_stop,
                   on_timeout=run.timed_out)
    if not run.searched:  # every mode asked for is one the kernel does not take: nothing to draw
        return loop.finish()
    return loop.run(lambda: run.search_all(loop))  # Ctrl-C or SIGTERM: the seed and the worst recipe so far


class HuntRun:
    """One hunt: the kernel, what it searches (the modes it accepts) and the :class:`Search` so far."""

    def __init__(self, fn, kernel, options):
        self.fn, self.kernel, self.options = fn, kernel, options
        family = options.family != GDN2
        accepted = (mode_running.chosen_modes(fn, family_running.accepted_family_modes(fn, options.family)) if family
                    else mode_running.accepted_modes(fn))
        self.not_accepted = [m for m in options.modes if not call_modes.is_base(m) and m not in accepted]
        self.searched = tuple(m for m in options.modes if m not in self.not_accepted)
        self.flags = family_running.accepted_flags(fn) if family else family_running.FLAGS
        self.search, self.start = Search(), time.perf_counter()

    def report(self, interrupted):
        """The :class:`HuntReport` so far (a FAIL the interrupt broke off is not the kernel's: dropped)."""
        search, options = self.search, self.options
        found = search.found
        if interrupted and found is not None and any(interrupt_error(f) for f in found["failed"]):
            found = search.found = None  # a kernel call the interrupt broke off: not the kernel's FAIL
        if found is not None:
            found["repro"], found["example"] = reproducer(found["recipe"], self.kernel)
        return HuntReport(kernel=self.kernel, budget=options.budget, seed=options.seed, shapes=options.shapes,
                          result=options.result, examples=search.examples, first_fail=search.first_fail,
                          seconds=time.perf_counter() - self.start, worst=search.worst, found=found,
                          interrupted=interrupted, modes=list(options.modes), not_accepted_modes=self.not_accepted,
                          family=options.family)

    def timed_out(self, unit):
        """The watchdog stopped the kernel call on ``unit["recipe"]``: that recipe is the FAIL."""
        self.search.fail(unit["recipe"], None, [timed_out(self.options.case_timeout)])

    def check(self, loop, recipe):
        """Judge one drawn recipe (a unit of ``loop``), climb towards the worst, raise :class:`Found` on a FAIL."""
        search = self.search
        search.examples += 1
        loop.advance()
        try:
            with loop.unit(repr(recipe), recipe=recipe):
                report = judge(self.fn, recipe)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises fails the recipe
            search.fail(recipe, None, [f"error: {error_text(exc)}"])
            raise Found(str(exc)) from None
        ratios = strategies.target_ratios(report, self.options.result)
        if not ratios:  # --result names a result this call does not have (dA_log of a dense call): nothing judged
            return
        search.climb(recipe, report, ratios)
        failed = [n for n in ratios if report[n].grade == FAIL]
        if failed:
            search.fail(recipe, report, failed)
            loop.note("shrinking a FAIL")
            raise Found(", ".join(failed))

    def search_all(self, loop):
        """The Hypothesis search (generate, target, shrink), each recipe checked as a unit of ``loop``."""
        options = self.options

        def check(recipe):
            self.check(loop, recipe)

        try:
            hypothesis_seed(options.seed)(settings(
                max_examples=options.budget, deadline=None, database=None, derandomize=False,
                phases=(Phase.generate, Phase.target, Phase.shrink), verbosity=Verbosity.quiet,
                suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                print_blob=False)(given(recipe=recipes(options.shapes, self.searched, options.family,
                                                       self.flags))(check)))()
        except Found:
            pass  # Hypothesis replays the minimal failing recipe last, so search.found holds it
        except Flaky:  # the replay did not fail again: a non-deterministic kernel; keep the last failing recipe
            self.search.found["failed"].append("flaky: the same recipe passed when replayed")


def reproducer(recipe, kernel):
    """``(repro, example)``: the one-liner that judges ``kernel`` on ``recipe`` again and the ``@example`` line that
    pins it (a dense recipe: property_tests/test_conformance.py's ``spec``; a training call: test_modes' ``recipe``;
    a family call: None, no conformance test draws one)."""
    if isinstance(recipe, FamilyRecipe):
        return hunt_families.family_repro(recipe, kernel), None
    if isinstance(recipe, ModeRecipe):
        return strategies.mode_repro(recipe, kernel), strategies.mode_example(recipe)
    return strategies.repro(recipe, kernel), strategies.example(recipe)


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
    modes: list = field(default_factory=lambda: [PLAIN])  # what was drawn (--modes)
    not_accepted_modes: list = field(default_factory=list)  # selected, not in the kernel's signature: not drawn
    family: str = GDN2  # the kernel's family: gdn2, or gdn / kda (its family calls drawn)


def format_hunt(out):
    """What the CLI prints: the search, the shrunk FAIL with its reproducer (if any), the worst ratio reached."""
    what = f"result {out.result}" if out.result else "every result"
    modes = [m for m in out.modes if m not in out.not_accepted_modes]
    family = "" if out.family == GDN2 else f" (family {out.family}: its family calls)"
    lines = [f"gdn2-oracle hunt: {out.kernel}{family}, {out.examples} recipes run (budget {out.budget}, seed "
             f"{out.seed}, {out.shapes} shapes, modes {','.join(modes) or 'none'}, targeting {what}) in "
             f"{out.seconds:.0f} s"]
    if out.not_accepted_modes:
        lines.append(f"not drawn: {', '.join(out.not_accepted_modes)} (not accepted by the kernel's signature; "
                     "not a failure)")
    found = out.found
    if found is not None:
        stopped = any(f.startswith("timed out") for f in found["failed"])
        lines += ["", f"FAIL ({', '.join(found['failed'])}) first at recipe {out.first_fail}, "
                      f"{'not shrunk (the search stopped at it)' if stopped else 'shrunk to'} {found['recipe']!r}"]
        if found["report"] is not None:
            lines.append(found["report"].format())
        lines.append(f"reproduce: {found['repro']}")
        if found["example"] is not None:
            lines.append(f"pin it:    {found['example']}")
    if found is not None or out.interrupted:
        lines.append(f"rerun:     {rerun_command(out)}")
    worst = out.worst
    if worst is not None:
        lines += ["", f"worst error / tolerance reached: {worst['ratio']:.3g} ({worst['result']}, {worst['grade']}) "
                      f"on {worst['recipe']!r}"]
    if out.interrupted:
        lines.append(f"hunt: INTERRUPTED after {out.examples} recipes; rerun the same search with --seed {out.seed}")
    lines.append("hunt: FAIL found" if found is not None else "hunt: no FAIL found before the interrupt"
                 if out.interrupted else "hunt: no FAIL found" if judged(out) else
                 "hunt: EMPTY: no recipe was judged (not a pass)")
    return "\n".join(lines)


def judged(out):
    """Whether the search judged any recipe (a kernel that takes none of the modes, or a ``--result`` no drawn call
    has, judges none)."""
    return out.worst is not None or out.found is not None


def rerun_command(out):
    """The ``gdn2-oracle hunt`` command line that runs the same search again."""
    import shlex

    kernel = shlex.quote(out.kernel)
    extra = (f" --result {out.result}" if out.result else "") + (" --shapes all" if out.shapes != "core" else "")
    return (f"gdn2-oracle hunt --kernel {kernel} --modes {','.join(out.modes)} --budget {out.budget} "
            f"--seed {out.seed}{extra}")


def _count(text):
    import argparse

    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def add_parser(sub):
    """``gdn2-oracle hunt``."""
    h = sub.add_parser("hunt", help="Hypothesis search for a FAIL, targeting error / tolerance",
                       description="Search the conformance suite's recipes (a KDA or Gated DeltaNet kernel in FLA's "
                                   "signature, family=kda|gdn: its family's calls, with grouped value heads, decay and "
                                   "beta regimes) with hypothesis.target on error / tolerance; shrink a FAIL to a "
                                   "minimal recipe and print its reproducer. Exit 1 on a FAIL.")
    cli_args.add_kernels(h, one=True)
    h.add_argument("--budget", type=_count, default=DEFAULT_BUDGET, metavar="N",
                   help=f"recipes drawn (default {DEFAULT_BUDGET}; shrinking a FAIL comes on top)")
    h.add_argument("--result", choices=RESULTS,
                   help="target and judge only this result (default: all; a call without it is not judged; a family "
                        f"kernel's results: {', '.join(FAMILY_RESULTS)})")
    cli_args.add_seed(h, "search seed (default: random, printed)", default=None)
    h.add_argument("--shapes", choices=SHAPES, default="core",
                   help="core (default: the conformance suite's CORE configs; a family kernel: "
                        "hunt_families.FAMILY_CORE) or all (their small sets' cross product)")
    h.add_argument("--modes", type=cli_args.call_modes, default=(PLAIN,), metavar="LIST",
                   help=f"what to draw, comma-separated among {PLAIN} and the training-call modes "
                        f"({', '.join(call_modes.names('training'))}) or all (default {PLAIN}: the conformance suite's "
                        "recipes; a mode "
                        "adds drawn FLA training calls using it, judged by the modes judge, where the kernel accepts "
                        "it)")
    cli_args.add_case_timeout(h, "recipe")
    cli_args.add_run_options(h, mesh_jobs=False)


def run(args):
    """Search, print the shrunk FAIL (if any) and the worst ratio reached; exit 1 on a FAIL."""
    [spec] = cli_args.specs(args.kernel)
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    fn, family, _ = kernel_and_family("hunt", spec)
    modes = tuple(args.modes) if family != GDN2 else family_modes("hunt", spec, family, args.modes)
    refuse("hunt", spec, family, "--result", args.result, MODE_RESULTS if family == GDN2 else FAMILY_RESULTS)
    print(f"gdn2-oracle hunt: seed {seed} (the same search again: --seed {seed})", file=sys.stderr, flush=True)
    options = HuntOptions(budget=args.budget, result=args.result, seed=seed, shapes=args.shapes, modes=modes,
                          case_timeout=args.case_timeout, show_progress=not args.no_progress, family=family)
    out = hunt(fn, spec.spec, options, on_stop=lambda report, reason: print(format_hunt(report), flush=True))
    print(format_hunt(out), flush=True)
    if out.found is not None:
        return EXIT["fail"]
    return EXIT["interrupted"] if out.interrupted else EXIT["pass"] if judged(out) else EXIT["empty"]
