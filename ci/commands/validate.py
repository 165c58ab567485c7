"""``gdn2-oracle validate``: every kernel on the golden corpus and on generated, oracle-checked problems.

A *case* (:class:`ci.grading.case.Case`) is one problem -- a golden, or an :class:`oracle.Recipe` -- with its
cotangents and exact reference, fed to the kernels in one input dtype. Sources:

* ``smoke``  -- a few cases of ``quick`` (:data:`SMOKE`): about a minute for one kernel on two cores;
* ``golden`` -- every case of the golden corpus (256-bit mpmath references), in its own precision, the mode
  goldens (training calls, ``golden/mode_catalogue.py``) among them;
* ``quick``  -- the golden corpus plus a handful of generated problems per dtype (float64 oracle);
* ``full``   -- the golden corpus plus every decay x gate regime at several lengths per dtype.

Training-call modes (FLA ``chunk_gdn2``'s packed sequences, in-kernel gate and q/k L2 norm, ``[V, K]`` states,
states at chunk starts; docs/DESIGN.md §2 and docs/modes.md): ``--modes`` selects them (default every mode,
``dense`` being the plain contract). Their cases are :class:`ci.grading.modes.ModeCase` s of the recipes in
``oracle/mode_recipes.py`` (``quick``: two small ones, a packed and a gated call; ``full``: all of them and the mode
goldens; ``golden``: the mode goldens, whose reference is their stored 256-bit results), judged
like the dense call; a kernel is judged on a mode case only when its signature accepts every keyword the case
uses, and the report says which modes each kernel was judged on and which it does not accept.

Each kernel result (forward output, final state, seven gradients) is judged by the tolerance model
(docs/DESIGN.md §4) and graded PASS / PRECISION / FAIL; the oracle reference and the working-precision
baselines are computed once per case and shared by all kernels. A kernel that raises on a case fails
that case (rule ``error``). Every non-PASS case carries a diagnosis (docs/DESIGN.md §4), and each
kernel one across its cases.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import repeat

from gdn2_oracle import oracle
from gdn2_oracle.kernels.spec import accepts_keywords
from gdn2_oracle.kernels.torch_bridge import TorchKernel
from gdn2_oracle.oracle import KERNEL_DTYPES, Recipe, call_modes, serving_recipes

from ..grading import families as family_grading
from ..grading import modes as mode_grading
from ..grading import reference_cache
from ..grading.diagnose import diagnose_kernel, one_chunk
from ..grading.grades import EMPTY, FAIL, INTERRUPTED, PASS, PRECISION, Verdict, run_grade
from ..grading.modes import ALL_MODES, MODE_RESULTS
from ..grading.result import INPUT_ERROR, CaseResult
from ..running import families as family_running
from ..running import handoff_sessions, multihost, xla_cpu
from ..running import modes as mode_running
from ..running import serving as serving_running
from ..running.ahead import Ahead, job_key
from ..running.cases import CallCase, DenseCase, FamilyRunCase
from ..running.fingerprint import source_sha256
from ..running.mesh import format_mesh
from . import args as cli_args
from . import dump as dumping
from .loop import RunLoop, needs_matplotlib
from .output import (
    EXIT,
    UsageError,
    fmt_err,
    interrupt_error,
    output_dir,
    say_interrupted,
    table,
    timed_out,
    write_after_work,
    write_json,
)
from .provenance import environment, kernel_notes, source_lines

CASE_SETS = ("smoke", "golden", "quick", "full")
# Every mode validate judges: the dense contract, FLA chunk_gdn2's training-call modes, the serving modes
# (decode steps on a state pool, speculative slots: docs/serving.md).
SERVING_MODES = call_modes.names("serving")
VALIDATE_MODES = ALL_MODES + SERVING_MODES
PLAIN = call_modes.BASE.name  # the dense contract: every kernel is judged on its cases
TRAINING = call_modes.names("training")
SCHEMA = "gdn2-oracle/validate/5"  # 2: + modes; per kernel accepted_modes, modes, not_accepted_cases;
# 3: grades EMPTY and INTERRUPTED, outcome "empty" (a kernel judged on no case is not a pass);
# 4: + families (the families of the run's kernels); per kernel family, other_family_cases; a family case's "family"
# 5: + per kernel refused_cases (the cases outside the kernel's own domain, not run: case, dtype, reason)
# The families a kernel may be (docs/DESIGN.md §2, "Families in FLA"): gdn2 is the plain contract.
FAMILIES = tuple(oracle.families.FAMILIES)
GDN2 = family_grading.GDN2

# quick: a handful of regimes on one shape (one program per kernel and dtype serves the five): B = 2 and H = 2 past
# two chunks of 64 (the corpus's multi-chunk goldens have B = H = 1 or T < 64), K = 32 != V.
GEN = (2, 130, 2, 32, 16)
QUICK = (
    # name, (B, T, H, K, V), decay, gates, initial_state
    ("gen_moderate_T130", GEN, "moderate", "uniform", True),
    ("gen_strong_negative_T130", GEN, "strong", "negative", False),
    ("gen_mixed_write_one_T130", GEN, "mixed", "write_one", True),
    ("gen_extreme_h0_T130", GEN, "extreme", "uniform", True),
    ("gen_resets_T130", GEN, "resets", "erase_one", False),
    # long sequences (past 128/256/512-token blocks; 1000 is a multiple of none of them), weak or no decay
    # so the state carries information across the whole length: a block-boundary bug fails here
    ("gen_weak_erase_zero_T1024", (1, 1024, 1, 8, 8), "weak", "erase_zero", True),
    ("gen_none_uniform_T1000", (1, 1000, 1, 16, 16), "none", "uniform", False),
)
# smoke: the cases of the quick set that catch the most of the suite's wrong kernels (kernels/testing*.py) in about a
# minute on two cores: few shapes (one compilation each), an initial state, erase / write / negative gates, extreme
# decay, a length past 64- and 256-token blocks, a bfloat16 call; the quick set's training-call cases; one session per
# serving mode; per family its initial-state, negative-eigenvalue and softplus-gate calls (docs/commands.md).
SMOKE = (
    "gates_erase_zero", "gates_negative", "gates_write_one", "scale_custom",  # one shape, [1, 40, 2, 16, 16]
    "decay_extreme_h0", "gates_erase_zero_strong", "kv_16x32",  # one shape, [2, 24, 1, 16, 32]
    "gen_weak_erase_zero_T1024", "bf16_strong_h0", "bf16_moderate",  # 1,024 tokens: past 256-token blocks
    "serving_pool_gather_scatter", "serving_speculative_accept",
)
# the family cases, their family's name (``gdn_``, ``kda_``) taken out: seven programs (a flag is a program of its
# own), about GDN-2's smoke's. Grouped value heads G = 2 and 4 on two key heads (a value head reading the wrong key
# head fails), beta near 0, 1 and 2, strong and extreme decay, resets, an initial state, beta logits with negative
# eigenvalues; the in-kernel gate at T = 100 and at whole chunks, T = 128 (a gate applied after padding T up fails
# only the first); the projection of GDN-2's 1,024-token case; bfloat16 calls (a decay or state kept in bfloat16
# fails); one session per serving mode.
SMOKE_FAMILY = (
    "gva2_moderate_h0", "gva2_resets_beta_small", "gva2_strong_beta_two",  # [2, 100, 2, 4, 16, 32]
    "gva4_weak_beta_one", "gva4_moderate_beta_two", "gva4_extreme_h0", "gva4_strong_neg_eigval",  # [1, 130, 2, 8]
    "gate_softplus", "gate_softplus_T128", "gen_weak_erase_zero_T1024",
    "gva2_moderate_h0_bf16", "gva2_resets_beta_small_bf16", "gva2_strong_beta_two_bf16",
    "serving_pool_g2", "serving_drafts_g4",
)
FULL_LENGTHS = (1, 63, 65, 200)
FULL_SHAPE = (1, None, 2, 32, 32)


def recipe_case(name, recipe: Recipe):
    """A generated case from ``recipe`` (a ``_bf16`` suffix for bfloat16), its reference split over the hosts;
    ``case.recipe`` keeps the recipe (the ``--dump`` reproducer names it)."""
    case = DenseCase.from_recipe(name if recipe.precision == "float32" else f"{name}_bf16", recipe,
                            reference_fn=multihost.reference_results)
    case.recipe = recipe
    return case


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


def build_cases(kind="quick", dtypes=KERNEL_DTYPES, *, seed=0, only=None, modes=None, families=(GDN2,)):
    """The cases of a case set, restricted to ``dtypes`` (and to the names in ``only``, if given).

    ``modes`` (default: :data:`VALIDATE_MODES`): the dense cases when it has ``dense``, the training-call mode cases
    (:func:`ci.grading.modes.cases`) whose modes it all has, and the serving sessions of its serving modes.
    ``families`` (default: ``gdn2`` only): the GDN-2 cases above when it has ``gdn2``; the family cases
    (:func:`ci.grading.families.cases`: calls in FLA's signature, dense with ``dense`` in ``modes``, and the mode
    calls whose modes ``modes`` all has) of its other families.
    """
    if kind not in CASE_SETS:
        raise ValueError(f"cases: {kind!r} not one of {CASE_SETS}")
    modes = VALIDATE_MODES if modes is None else tuple(modes)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"families: {unknown} not in {FAMILIES}")
    if kind == "smoke":
        cases = [c for c in build_cases("quick", dtypes, seed=seed, modes=modes, families=families) if in_smoke(c)]
        return only_cases(cases, only, kind, dtypes, modes, families)
    cases = []
    if GDN2 in families:
        cases = gdn2_cases(kind, dtypes, seed, modes)
    mapped = [f for f in oracle.families.MAPPED if f in families]
    if mapped:
        cases += family_grading.cases(kind, dtypes, seed=seed, families_selected=mapped, modes_selected=modes,
                                      plain=PLAIN in modes, case_type=FamilyRunCase,
                                      projected=dense_recipes(kind, dtypes, seed))
    serving = [m for m in SERVING_MODES if m in modes]
    if mapped and serving and kind != "golden":  # the families' serving sessions, in both pool layouts
        cases += serving_running.family_serving_cases(mapped, dtypes, seed, serving)
    return only_cases(cases, only, kind, dtypes, modes, families)


def in_smoke(case):
    """Whether a case of the quick set is in the smoke set (:data:`SMOKE`): named there, a GDN-2 training-call case,
    or a family case named in :data:`SMOKE_FAMILY`."""
    family = case_family(case)
    if family != GDN2:
        return case.name.replace(f"{family}_", "", 1) in SMOKE_FAMILY
    return case.name in SMOKE or (isinstance(case, CallCase) and bool(case.modes))


def only_cases(cases, only, kind, dtypes, modes, families):
    """``cases`` restricted to the names in ``only`` (None: all); an unknown name is a usage error."""
    if only:
        unknown = sorted(set(only) - {c.name for c in cases})
        if unknown:
            # a bfloat16 case's name carries _bf16: the one a name without it means
            meant = sorted({c.name for c in cases
                            if c.dtype == "bfloat16" and c.name.replace("_bf16", "", 1) in unknown})
            raise UsageError(f"--case: unknown case(s) {unknown} in set {kind!r} with dtypes {list(dtypes)}"
                             f" and modes {list(modes)}" + (f" and families {list(families)}"
                                                           if list(families) != [GDN2] else "")
                             + (f"; a bfloat16 case's name ends in _bf16: did you mean {meant}?" if meant else ""))
        cases = [c for c in cases if c.name in set(only)]
    return cases


def generated_recipes(kind, dtypes, seed):
    """``(name, Recipe)`` of the generated problems of a case set in each of ``dtypes`` (:func:`generated`)."""
    return [(n, Recipe(*s, decay=d, gates=g, initial_state=h, precision=dtype, seed=seed + 1000 + j))
            for dtype in dtypes for j, (n, s, d, g, h) in enumerate(generated(kind))]


def dense_recipes(kind, dtypes, seed):
    """``(name, Recipe)`` of a case set's dense GDN-2 problems in ``dtypes``: the golden corpus's recipes (each in its
    own precision; ``_bf16`` for a generated bfloat16 one) and the generated ones -- what a family projects
    (``oracle.family_recipes.projections``); none for ``golden``, whose family cases are the family goldens."""
    if kind == "golden":
        return []
    from gdn2_oracle.golden import catalogue  # the corpus's recipes, no data read

    goldens = [(n, catalogue.get(n).recipe) for n in catalogue.names() if catalogue.get(n).recipe.precision in dtypes]
    return goldens + [(n if r.precision == "float32" else f"{n}_bf16", r) for n, r in
                      generated_recipes(kind, dtypes, seed)]


def gdn2_cases(kind, dtypes, seed, modes):
    """The GDN-2 cases of a case set (dense, training-call and serving, as ``modes`` selects)."""
    cases = []
    if PLAIN in modes:
        from gdn2_oracle import golden  # the corpus is read only when validating

        cases = [c for c in (DenseCase.golden(n) for n in golden.names()) if c.dtype in dtypes]
        cases += [recipe_case(n, r) for n, r in generated_recipes(kind, dtypes, seed)]
    cases += mode_grading.cases(kind, dtypes, seed=seed, modes_selected=modes, case_type=CallCase)
    serving = [m for m in SERVING_MODES if m in modes]
    if serving and kind != "golden":
        cases += serving_running.serving_cases(dtypes, seed, serving,
                                                serving_recipes.QUICK if kind == "quick" else None)
    return cases


def run_case(fn, case, mesh=None, *, capture=False, program=None):
    """Judge kernel ``fn`` on one case (any kind: ``case.run``, ``ci/running/cases.py``): a :class:`CaseResult`.

    ``outcome``: ``pass``, ``precision``, ``fail`` (graded), ``error`` (the kernel raised) or ``input-error`` (the
    case's own data could not be loaded, e.g. a missing or damaged golden file: nothing is known about the kernel; the
    message names the file and how to restore it). ``capture`` (``--dump``): the result's ``arrays`` hold
    ``{"input", "got", "ref", "profile"}``, each ``{name: array}`` (what the case has); the caller drops them once the
    dump is written."""
    return case.run(fn, mesh, capture=capture, program=program)


def serving_only(fn):
    """Whether kernel ``fn`` runs serving sessions only (its ``serving_only`` attribute says why: vLLM's ReplaySSM
    functions), so no plain-contract case is run on it."""
    return bool(getattr(fn, "serving_only", None))


def takes_part(case, accepted, family=GDN2, flags=None, plain=True):
    """Whether a kernel of ``family`` accepting the modes ``accepted`` (and, for a family kernel, FLA's keywords
    ``flags``; None: every one) is judged on ``case``: a case of its family only (a GDN-2 case's family is ``gdn2``),
    a plain-contract case unless the kernel runs serving sessions only (``plain=False``: :func:`serving_only`), a
    mode case when it accepts every mode the case uses, a family case when it accepts every flag the case sets."""
    if case_family(case) != family or (not plain and not case.modes):
        return False
    return set(case.modes) <= set(accepted) and (flags is None or set(getattr(case, "flags", ())) <= set(flags))


# What a serving session needs of a kernel: a state pool, by FLA's keyword (ci/running/serving.py).
POOL_KEYWORD = "ssm_state_indices"


def needed_keywords(case, fn, accepted, flags=None):
    """The keywords kernel ``fn`` lacks for ``case`` (sorted): FLA's flags the case sets that ``flags`` lacks, the
    keywords of its modes outside ``accepted`` that ``fn``'s signature does not name (a serving mode's: a state pool,
    :data:`POOL_KEYWORD`; a mode its spec option ``modes=`` leaves out: ``modes=``); a plain case of a kernel that
    runs serving sessions only: the plain calls."""
    out = [f for f in getattr(case, "flags", ()) if flags is not None and f not in flags]
    for m in case.modes:
        if m not in accepted:
            keywords = [k for k in call_modes.get(m).keywords if k != "lower_bound"]
            out += ([k for k in keywords if not accepts_keywords(fn, (k,))] or ["modes="]) if keywords else [
                POOL_KEYWORD]
    return sorted(set(out)) or [f"{PLAIN} calls"]


def needs_text(needs):
    """``"12 need use_beta_sigmoid_in_kernel, 4 need cu_seqlens"``: the cases not run grouped by what they need
    (``{case: keywords}``, :func:`needed_keywords`), the largest group first."""
    groups = Counter(" + ".join(kw) for kw in needs.values())
    return ", ".join(f"{n} need {what}" for what, n in groups.most_common())


def case_family(case):
    """The family of a case: a family case's, else ``gdn2``."""
    return getattr(case, "family", GDN2)


def accepted_modes(fn, family=GDN2):
    """The modes other than dense that kernel ``fn`` accepts: training-call keywords (a family kernel: those its
    family has, ``ci.running.families.accepted_family_modes``), a state pool; less those its spec option ``modes=``
    leaves out (``ci.running.modes.chosen_modes``)."""
    serving = SERVING_MODES if serving_running.accepts_serving(fn) else ()
    try:
        if family != GDN2:
            return list(mode_running.chosen_modes(fn, [*family_running.accepted_family_modes(fn, family), *serving]))
        return list(mode_running.chosen_modes(fn, [*mode_running.accepted_modes(fn), *serving]))
    except ValueError as exc:  # the spec option modes= names a mode the kernel cannot take part in
        raise UsageError(f"--kernel: {exc}") from None


def case_grade(c):
    """A case record's grade (None for an input error: not judged)."""
    return c["grade"]


def severity(v):
    """Error / tolerance of a verdict dict (``Verdict.ratio``; >1 is over the tolerance)."""
    return Verdict.from_dict(v).ratio


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
            grade = v["grade"]
            s["failed"] += grade == FAIL
            s["precision"] += grade == PRECISION
            if s["worst"] is None or severity(v) > severity(s["worst"]):
                s["worst"] = {**v, "case": cr["case"], "severity": severity(v)}
    return out


@dataclass
class ValidationReport:
    """What ``validate`` found: per kernel its case records (plain JSON dicts), summary and diagnosis."""

    cases: str
    dtypes: list
    seed: int
    only: list | None
    mesh: str | None
    environment: dict
    n_cases: int
    seconds: float
    passed: bool
    interrupted: bool
    outcome: str  # pass | precision | fail | input-error | interrupted (``cli.EXIT`` maps it)
    grade: str
    kernels: list = field(default_factory=list)
    modes: list = field(default_factory=lambda: list(VALIDATE_MODES))  # the modes selected (``--modes``)
    families: list = field(default_factory=lambda: [GDN2])  # the families of the run's kernels
    # per kernel (in order), {case not run: the keywords it needs} (:func:`needed_keywords`; not in the JSON report)
    needs: list = field(default_factory=list)

    def to_json(self):
        """The JSON report (schema :data:`SCHEMA`)."""
        return {"schema": SCHEMA, "command": "validate", **{k: v for k, v in asdict(self).items() if k != "needs"}}


@dataclass(frozen=True)
class ValidateOptions:
    """What a validate run judges and how it runs (defaults: every dtype, the quick set, every mode).

    ``only``: the names of the set's cases to run; ``modes``: as in :func:`build_cases` (None: every mode); ``mesh``: a
    ``jax.sharding.Mesh`` (running/mesh.py) every kernel runs inside, on sharded inputs (training-call cases run without
    it); ``case_timeout``: the seconds one kernel may take on one case (0 or None: no limit); ``compile_workers``,
    ``program_cache``: as in :func:`compile_ahead`; ``env``: the environment record (None: this machine's)."""

    dtypes: tuple = KERNEL_DTYPES
    cases: str = "quick"
    seed: int = 0
    only: tuple | None = None
    modes: tuple | None = None
    mesh: object = None
    case_timeout: float | None = None
    compile_workers: int | None = None
    program_cache: bool = True
    show_progress: bool = True
    env: dict | None = None
    prefill: tuple | None = None  # (kernel, spec) of --prefill: the hand-off sessions' prefill kernel


# The time model of the line said before a run: a compiled kernel costs core-seconds per program compiled (a case
# dtype, shape, kind and modes) and per kernel call judged, cold (empty compilation, program and reference caches),
# and per call warm (every cache filled by an earlier run), divided by the cores, plus START_SECONDS (the process
# starting, the cases built). One set of constants per way XLA compiles (ci/running/xla_cpu.py) and per kind of case:
# a GDN-2 case, or a family case (FLA's signature mapped onto GDN-2: the family oracle, the map's own program, about
# twice the cost a call). Quick-compile refitted 2026-12-07, after the chunked kernels' cheaper trace, to
# `bench_estimates` runs (fresh process, empty cache home, both dtypes) on this repository's 2-core host, otherwise
# idle: factorized smoke 7.1 s cold / 4.5 s warm (6 programs, 12 calls), quick 16.3 / 9.6 s (27, 62); pairwise quick
# 10.9 / 8.3 s; gdn-factorized smoke 7.6 / 5.0 s (6, 13), quick 44.3 / 24.5 s (43, 92); kda-factorized quick
# 55.3 / 27.1 s (49, 98). XLA's default (not refitted since 2026-12-06): factorized quick cold 116.4 s, warm 18.5 s.
# A guess, never a measurement: docs/performance.md#the-estimate-line.
START_SECONDS = 4.0
COMPILED_CORE_SECONDS = {  # way of compiling -> kind of case -> (a program cold, a call cold, a call warm)
    "quick-compile": {"gdn2": (0.6, 0.22, 0.2), "family": (0.9, 0.45, 0.45)},
    "default": {"gdn2": (5.5, 1.2, 0.55), "family": (5.5, 1.2, 0.55)},
}
# A kernel run in an interpreter (Triton's, for FLA's and the engines' Triton kernels; Pallas's interpret=1), or a
# torch kernel (no XLA program of its own), compiles nothing: its call costs grow with the problem, seconds per
# token-head (B * T * HV over the case's calls; the oracle, grading and start-up included) on one core, by the
# kernel's kind (:func:`interpreted_kind`), warm or cold alike. Fitted as (whole-run wall - START_SECONDS) / the run's
# token-heads to cold float32 smoke runs (ci/benchmarks/bench_estimates.py, two at a time) on this repository's
# 2-core CPU host, 2026-12-07, after Triton's interpreter patched triton.language once per launch
# (kernels/triton_interpret.py, shim 4): fla-gdn-chunk[interpret=1] 54.6 s (10,432 token-heads);
# fla-kda-chunk[interpret=1] 172.3 s; fla-gdn2-chunk[interpret=1] 108.4 s (1,784).
# A kernel without a backward (FLA's fused-recurrent kernels, the engines' peers: ``no_backward``) runs only the
# forward: its kinds are their own (:data:`FORWARD_ONLY`), fitted the same way: vllm-gdn-chunk 21.1 s (7,568
# token-heads); fla-gdn-fused-recurrent[interpret=1] 46.6 s, vllm-gdn-fused-recurrent 23.1 s and
# sglang-gdn-fused-recurrent 14.3 s (the geometric mean over the three: each within 2x of it); vllm-kda-chunk 42.9 s.
# Not refitted: "recurrent" (a recurrent kernel with a backward) and torch (an earlier fit, under load average ~7-9:
# fla-gdn-naive-recurrent 29.3 s, 12,832 token-heads) (docs/performance.md#the-estimate-line).
# Our Pallas kernels where Pallas's TPU interpreter runs them (a backend other than a TPU, interpret None, "auto",
# "tpu" or True): the interpreter's grid steps, not the compile, are the time (cold and warm alike), so they are the
# kind "pallas-tpu": pallas-factorized smoke 12.9 s / 12.1 s warm (1,648 token-heads), quick 52.5 / 53.6 s (12,461),
# 2026-12-07, the geometric mean. With interpret="xla" they are compiled kernels.
INTERPRETED_SECONDS_PER_TOKEN_HEAD = {"chunk": 0.0049, "recurrent": 0.0071, "kda-chunk": 0.0161, "gdn2-chunk": 0.0585,
                                      "chunk-forward": 0.0023, "recurrent-forward": 0.0024,
                                      "kda-chunk-forward": 0.0051, "torch": 0.0023, "pallas-tpu": 0.0045}
FORWARD_ONLY = {"chunk": "chunk-forward", "recurrent": "recurrent-forward", "kda-chunk": "kda-chunk-forward"}


def interpreted_kind(spec, fn):
    """The kind (a key of :data:`INTERPRETED_SECONDS_PER_TOKEN_HEAD`) of kernel ``fn``, built from ``spec``, when it
    runs in an interpreter (the spec's ``interpret`` option, or the kernel's ``interpreted`` attribute: the engines'
    peers) or is a torch kernel, ``pallas-tpu`` for our Pallas kernels in Pallas's TPU interpreter, else None (a
    compiled kernel)."""
    if pallas_tpu_interpreted(fn):
        return "pallas-tpu"
    if not (spec.options.get("interpret") in (1, True, "1") or getattr(fn, "interpreted", False)):
        return "torch" if isinstance(fn, TorchKernel) else None
    kind = ("recurrent" if "chunk" not in spec.name else "kda-chunk" if "kda" in spec.name
            else "gdn2-chunk" if "gdn2" in spec.name else "chunk")
    return FORWARD_ONLY.get(kind, kind) if getattr(fn, "no_backward", None) else kind


def pallas_tpu_interpreted(fn):
    """Whether ``fn`` is one of our Pallas kernels (``kernels/pallas``: a ``TileConfig`` as its ``config``) that
    Pallas's TPU interpreter runs here (its ``interpret`` as ``kernels.pallas.resolve_interpret`` reads it)."""
    config = sys.modules.get("gdn2_oracle.kernels.pallas.config")  # not imported: fn cannot be one of them
    if config is None or not isinstance(getattr(fn, "config", None), config.TileConfig):
        return False
    from jax.experimental.pallas import tpu as pltpu

    from gdn2_oracle.kernels.pallas import resolve_interpret

    return isinstance(resolve_interpret(getattr(fn, "interpret", None)), pltpu.InterpretParams)


def token_heads(case):
    """``B * T * HV`` of a case: its calls' token positions times the value heads (the key heads where the shape does
    not name value heads; a serving session's tokens over all its calls)."""
    shape = tuple(case.shape)
    if hasattr(case, "tokens"):  # a serving session: (P, HV, K, V) of the pool
        return case.tokens() * shape[1]
    if len(shape) == 6:  # (B, T, H, HV, K, V)
        return shape[0] * shape[1] * shape[3]
    return shape[0] * shape[1] * shape[2]  # (B, T, H, K, V)


def estimate_cores():
    """The cores the time model counts on this machine (at most 8)."""
    import os

    return max(1, min(os.cpu_count() or 1, 8))


def compiled_constants():
    """:data:`COMPILED_CORE_SECONDS` of the way this process compiles: ``quick-compile`` when both of XLA's
    quick-compiling CPU flags are in force (``ci/running/xla_cpu.py``), else ``default``."""
    quick = set(xla_cpu.FLAGS) <= set(xla_cpu.in_force().split())
    return COMPILED_CORE_SECONDS["quick-compile" if quick else "default"]


def compiled_core_seconds(cases, warm=False):
    """Core-seconds a compiled kernel spends on ``cases``: per program and call cold (or per call ``warm``), each case
    at the constants of its kind (:data:`COMPILED_CORE_SECONDS`: GDN-2 or family)."""
    constants, total = compiled_constants(), 0.0
    for kind in ("gdn2", "family"):
        mine = [c for c in cases if (case_family(c) == GDN2) == (kind == "gdn2")]
        per_program, per_call, per_call_warm = constants[kind]
        total += per_call_warm * len(mine) if warm else per_program * case_programs(mine) + per_call * len(mine)
    return total


def kernel_cases(run):
    """``[(spec, fn, cases)]``: each kernel of ``run`` with the cases it takes part in."""
    return [(spec, fn, [c for c in run.case_list
                        if takes_part(c, kout["accepted_modes"], kout["family"], flags, not serving_only(fn))])
            for (spec, fn), kout, flags in zip(run.built, run.kernels_out, run.flags)]


def case_programs(cases):
    """How many programs a compiled kernel compiles for ``cases``: one per case dtype, shape, kind and modes."""
    return len({(c.dtype, c.shape, type(c).__name__, c.modes) for c in cases})


def estimate_programs(run):
    """The programs the compiled kernels of ``run`` compile (:func:`case_programs`; 0 for interpreted ones)."""
    return sum(case_programs(mine) for spec, fn, mine in kernel_cases(run) if interpreted_kind(spec, fn) is None)


def estimate_seconds(run, warm=False):
    """``(seconds, calls, compiles)``: how long a run of ``run`` takes on this machine by the model above, cold (or
    ``warm``: every cache filled by an earlier run), its kernel calls, and whether any of its kernels is compiled."""
    cores = estimate_cores()
    calls, core_seconds, seconds = 0, 0.0, 0.0
    for spec, fn, mine in kernel_cases(run):
        calls += len(mine)
        kind = interpreted_kind(spec, fn)
        if kind is not None:  # one core runs the interpreter
            seconds += INTERPRETED_SECONDS_PER_TOKEN_HEAD[kind] * sum(token_heads(c) for c in mine)
        else:
            core_seconds += compiled_core_seconds(mine, warm)
    return START_SECONDS + core_seconds / cores + seconds, calls, core_seconds > 0


def about(seconds):
    """``about N min`` from 90 s, ``about N s`` to the nearest 10 s below it, ``about 5 s`` below 7.5 s (a line that
    said 10 s for a 3-s run was 3x off)."""
    if seconds >= 90:
        return f"about {round(seconds / 60)} min"
    return f"about {round(seconds, -1):.0f} s" if seconds >= 7.5 else "about 5 s"


def estimate_line(run):
    """The line said before a run: how many cases for how many kernels, and about how long cold on this machine, and
    warm where a kernel is compiled (None when it cannot be said: an estimate never fails a run)."""
    try:
        cores = estimate_cores()
        seconds, calls, compiles = estimate_seconds(run)
        warm = (f", {about(estimate_seconds(run, warm=True)[0])} with a warm compilation cache" if compiles
                else " (interpreted or torch: a warm compilation cache saves nothing)")
        programs = estimate_programs(run)
        return (f"gdn2-oracle validate: starting {len(run.case_list)} cases x {len(run.built)} kernel(s) (set "
                f"{run.options.cases!r}): {calls} kernel calls"
                + (f", {programs} programs to compile" if programs else "")
                + f"; {about(seconds)} on this machine cold ({cores} cores){warm}")
    except Exception:  # noqa: BLE001 - the estimate is a courtesy: whatever goes wrong, the run goes on
        return None


def run_validation(specs, options=ValidateOptions(), *, dump=None, on_stop=None, on_start=None):
    """Validate every kernel spec (:class:`kernels.KernelSpec`) as ``options`` (:class:`ValidateOptions`) say; returns
    the :class:`ValidationReport`. A kernel is judged on a mode case only when it accepts all of the case's modes
    (:func:`ci.running.modes.accepted_modes`).

    ``dump`` (a :class:`ci.commands.dump.Dumper`, ``--dump``): each case not graded PASS is written by it right
    after it is judged, its arrays then dropped (an OSError writing it is said on stderr once; the run goes on).

    ``on_start(line)``: given the line said before any work (the cases, the kernels, :func:`estimate_line`'s time).

    ``on_stop(report, reason)``: a watchdog (ci/running/watchdog.py) stops the run when a kernel call passes
    ``options.case_timeout`` (that case graded FAIL, "timed out") or hangs through a Ctrl-C / SIGTERM; ``on_stop`` gets
    the report of what was finished and the process ends (exit 1, 130, 143).

    Kernels are built first, so an unknown name or import failure raises ``UsageError`` before any work.
    """
    run = ValidationRun(specs, options, dump)
    line = estimate_line(run) if on_start is not None else None
    if line:
        on_start(line)
    loop = RunLoop(run.report, "cases", total=len(run.built) * len(run.case_list), desc="validate", unit_name="case",
                   show_progress=options.show_progress, case_timeout=options.case_timeout,
                   on_timeout=run.timed_out, on_stop=on_stop)
    ahead = compile_ahead(run.built, run.case_list, options.mesh, options.compile_workers, options.program_cache,
                          run.families)
    return loop.run(functools.partial(run.judge_all, loop), ahead)


class ValidationRun:
    """One validate run: the kernels built, the cases in the order they run, each kernel's record so far."""

    def __init__(self, specs, options, dump=None):
        self.options, self.dump = options, dump
        self.dump_ok = True  # after a failed dump write, the dump is not tried again (one message)
        self.modes = VALIDATE_MODES if options.modes is None else tuple(options.modes)
        self.built, self.families = [], []
        for spec in specs:
            build_spec, option = family_running.spec_family(spec)
            fn = cli_args.build(build_spec)
            try:
                family = family_running.kernel_family(fn, option, label=spec.spec)
            except ValueError as exc:
                raise UsageError(f"--kernel {spec.spec}: {exc}") from None
            self.built.append((spec, fn))
            self.families.append(family)
        run_families = [f for f in FAMILIES if f in self.families]
        self.case_list = build_cases(options.cases, options.dtypes, seed=options.seed, only=options.only,
                                     modes=self.modes, families=run_families)
        self.case_list += handoff_sessions.cases(options.prefill, self.modes, options.dtypes, options.seed)
        # Group by shape and dtype so each kernel compiles once per group while the arrays are warm.
        self.case_list.sort(key=lambda c: (c.dtype, c.shape))
        self.kernels_out = [{"name": spec.label(), "spec": spec.spec, "options": spec.options,
                             "source": source_sha256(fn), "notes": kernel_notes(fn), "cases": [],
                             "family": family, "accepted_modes": accepted_modes(fn, family),
                             "not_accepted_cases": [], "other_family_cases": [], "refused_cases": []}
                            for (spec, fn), family in zip(self.built, self.families)]
        # FLA's keywords each family kernel takes (a family case setting another one is not run on it)
        self.flags = [None if family == GDN2 else family_running.accepted_flags(fn) + serving_running.layout_flags(fn)
                      for (_, fn), family in zip(self.built, self.families)]
        self.needs = [{} for _ in self.built]  # per kernel, {case not run: the keywords it needs}
        self.t0 = time.perf_counter()
        self.cache_before = reference_cache.snapshot()  # the report counts what this run read from the cache

    def judge_all(self, loop, ahead):
        """Judge every kernel on each case in turn, each kernel call a unit of ``loop``; a case's arrays are
        released once every kernel was judged on it."""
        for case in self.case_list:
            for (spec, fn), kout, flags in zip(self.built, self.kernels_out, self.flags):
                with loop.unit(f"{spec.label()} {case.name}", kout=kout, case=case):
                    self.judge_one(loop, ahead, spec, fn, kout, case, flags)
            case.release()

    def judge_one(self, loop, ahead, spec, fn, kout, case, flags=None):
        """Judge kernel ``fn`` on ``case`` (a case of another family, one its signature does not take, or one outside
        its own domain -- its ``refuses``, ``ci.running.modes.case_refusal`` -- is only listed) into ``kout``."""
        mesh, dump = self.options.mesh, self.dump
        loop.note(f"{spec.label()} {case.name}")
        if case_family(case) != kout["family"]:
            kout["other_family_cases"].append(case.name)
        elif (not takes_part(case, kout["accepted_modes"], kout["family"], flags, not serving_only(fn))
              or not family_running.takes_case(fn, case)):  # gva=none, no scale
            kout["not_accepted_cases"].append(case.name)
            mine = next(i for i, k in enumerate(self.kernels_out) if k is kout)
            self.needs[mine][case.name] = needed_keywords(case, fn, kout["accepted_modes"], flags)
        elif reason := mode_running.case_refusal(fn, case):
            kout["refused_cases"].append({"case": case.name, "dtype": case.dtype, "reason": reason})
        else:
            key = job_key(fn, case)  # by identity: kernels that compare equal are two kernels
            program = functools.partial(ahead.compiled, key) if key in ahead else None
            result = run_case(fn, case, mesh, capture=dump is not None, program=program)
            arrays, result.arrays = result.arrays, None
            res = result.to_dict()
            kout["cases"].append(res)
            if dump is not None and not res["passed"]:
                self.dump_ok = self.dump_ok and write_after_work("--dump", dump.root, functools.partial(
                    dump.write, spec.label(), spec.spec, case, kout["cases"][-1], arrays))
        loop.advance()

    def timed_out(self, unit):
        """Record the case the watchdog stopped (``unit``: its ``kout`` and ``case``): graded FAIL, timed out."""
        limit = self.options.case_timeout
        result = CaseResult.failed(unit["case"].describe(), timed_out(limit), limit, kind="timeout")
        unit["kout"]["cases"].append(result.to_dict())

    def report(self, interrupted):
        """The :class:`ValidationReport` of the cases judged so far (``interrupted``: a kernel call the interrupt
        broke off was not judged, and nothing passes)."""
        modes, options = self.modes, self.options
        for kout in self.kernels_out:
            if interrupted:  # a kernel call the signal broke off (its error is the interrupt) was not judged
                kout["cases"] = [c for c in kout["cases"] if not broken_off(c)]
            kout["cases"], _ = one_chunk(kout["cases"])  # one chunk size per kernel in its cancellation findings
            results = [CaseResult.from_dict(c) for c in kout["cases"]]
            kout["passed"] = not interrupted and bool(results) and all(r.passed for r in results)
            kout["n_cases"] = len(results)
            # n_failed: graded FAIL or the kernel raised (PRECISION and input errors are counted apart)
            kout["n_failed"] = sum(r.grade == FAIL for r in results)
            kout["n_input_errors"] = sum(r.outcome == INPUT_ERROR for r in results)
            kout["n_precision"] = sum(r.grade == PRECISION for r in results)
            kout["grade"] = run_grade((r.grade for r in results if r.grade is not None), interrupted=interrupted)
            kout["summary"] = summarize(kout["cases"])
            kout["diagnosis"] = [f.as_dict() for f in diagnose_kernel(results)]
            judged = {m for r in results for m in r.modes} | ({PLAIN} if any(not r.modes for r in results) else set())
            kout["modes"] = {"judged": [m for m in modes if m in judged],
                             "not_accepted": [m for m in modes if m != PLAIN and m not in kout["accepted_modes"]]
                             if kout["family"] == GDN2 else []}
        kernels_out, mesh, only = self.kernels_out, options.mesh, options.only
        return ValidationReport(cases=options.cases, dtypes=list(options.dtypes), seed=options.seed,
                                only=list(only) if only else None,
                                mesh=format_mesh(mesh) if mesh is not None else None,
                                environment={**(options.env or environment()),
                                             "reference_cache": reference_cache.provenance(self.cache_before)},
                                n_cases=len(self.case_list), seconds=time.perf_counter() - self.t0,
                                passed=not interrupted and all(k["passed"] for k in kernels_out),
                                interrupted=interrupted,
                                outcome=outcome(kernels_out, interrupted),
                                grade=report_grade([k["grade"] for k in kernels_out], interrupted),
                                kernels=kernels_out,
                                modes=list(modes),
                                families=[f for f in FAMILIES if f in self.families],
                                needs=[dict(n) for n in self.needs])


def compile_ahead(built, case_list, mesh, workers, program_cache=True, families=None):
    """An :class:`Ahead` over the dense cases' programs of every kernel in the run's order (``workers`` 0, or a
    mesh: none -- each program compiles on its first call), through the program cache unless ``program_cache``
    is false."""
    jobs = [] if workers == 0 or mesh is not None else [
        (job_key(fn, case), functools.partial(case.ahead, fn, program_cache))
        for case in case_list if case.compiles_ahead for (_, fn), family in zip(built, families or repeat(GDN2))
        if case_family(case) == family]
    return Ahead(jobs, workers or None)


def outcome(kernels_out, interrupted=False):
    """The run's outcome: ``interrupted``, else ``fail`` if any judged case failed or a kernel raised,
    else ``input-error`` if some case could not be loaded, else ``empty`` if a kernel has no case at all (none of
    the set that it takes), else ``precision`` if some case was graded PRECISION, else ``pass`` (``ci.cli.EXIT``
    maps it)."""
    cases = [c for k in kernels_out for c in k["cases"]]
    if interrupted:
        return "interrupted"
    if any(c.get("outcome", "pass" if c["passed"] else "fail") in ("fail", "error") for c in cases):
        return "fail"
    if any(c.get("outcome") == "input-error" for c in cases):
        return "input-error"
    if not all(k["cases"] for k in kernels_out):
        return "empty"
    return "precision" if any(case_grade(c) == PRECISION for c in cases) else "pass"


def report_grade(kernel_grades, interrupted):
    """The run's grade from its kernels' (:func:`run_grade`'s order): EMPTY as soon as one kernel judged nothing."""
    judged = [g for g in kernel_grades if g != EMPTY]
    grade = run_grade(judged, interrupted=interrupted)
    return EMPTY if grade not in (FAIL, INTERRUPTED) and len(judged) < len(kernel_grades) else grade


def broken_off(c):
    """Whether case dict ``c`` is a kernel call an interrupt broke off (its error is the interrupt's: not judged)."""
    return c.get("outcome") == "error" and interrupt_error(c.get("error"))


def case_lines(k, c):
    """The lines of one case not graded PASS: what happened, then its diagnosis."""
    head = f"  {k['name']:<14} {c['dtype']:<8} {c['case']:<28}"
    if c.get("outcome") == "input-error":
        return [f"{head} input error (not judged): {c['error']}"]
    if c["error"]:
        return [f"{head} error: {c['error']}"]
    bad = sorted((v for v in c["verdicts"] if not v["passed"]), key=severity, reverse=True)
    desc = ", ".join(f"{v['name']} x{severity(v):.3g}" for v in bad)
    return ([f"{head} {case_grade(c)}: {len(bad)}/{len(c['verdicts'])} over tolerance (error/tolerance): {desc}"]
            + [f"      {'diagnosis' if f.get('primary', i == 0) else '    also'} {f['kind']}: {f['text']}"
               for i, f in enumerate(c.get("diagnosis") or [])])


def format_validation(report, *, max_failures=60):
    """The verdict table (kernel x dtype x result: worst case), per-case failures and the verdict line."""
    modes = getattr(report, "modes", list(VALIDATE_MODES))
    lines = [*header_lines(report, modes), ""]
    lines.append(table(["kernel", "dtype", "result", "err_ratio", "tol", "max_err", "tol", "rule",
                        "worst case", "failed", "verdict"], verdict_rows(report), "<<<>>>><<><"))
    lines += failure_lines(report, max_failures)
    diagnoses = [(k["name"], f) for k in report.kernels for f in k.get("diagnosis") or []]
    if diagnoses:
        lines += ["", "Diagnosis (across cases):"] + [f"  {name}: {f['kind']}: {f['text']}" for name, f in diagnoses]
    n_prec = sum(k.get("n_precision", 0) for k in report.kernels)
    if n_prec:
        lines += ["", f"WARNING: {n_prec} case(s) graded PRECISION: over the working-precision tolerance but within "
                      "the precision-loss bound (docs/DESIGN.md §4): the algorithm is right, precision is lost of a "
                      "known kind. Not a failure (exit 0) unless --strict."]
    mode_lines = [format_modes(k, modes) for k in report.kernels
                  if set(modes) - {PLAIN} and k.get("family", GDN2) == GDN2]
    if mode_lines:
        lines += ["", "Call modes (docs/modes.md, docs/serving.md):"] + mode_lines
    family_lines = [format_family(k, report.needs[j] if j < len(report.needs) else None)
                    for j, k in enumerate(report.kernels)
                    if k.get("family", GDN2) != GDN2 or k.get("other_family_cases")]
    if family_lines:
        lines += ["", "Families (docs/DESIGN.md §2, \"Families in FLA\"):"] + family_lines
    notes = [(k["name"], n) for k in report.kernels for n in [*k["notes"], *padding_notes(k)]]
    if notes:
        lines += ["", "Notes:"] + [f"  {name}: {n}" for name, n in notes]
    lines.append("")
    lines += [kernel_line(k, report.interrupted) for k in report.kernels]
    lines.append(overall_line(report))
    return "\n".join(lines)


def padding_notes(k):
    """The one line saying that kernel record ``k``'s padding outputs were not judged (its serving cases' ``padding``
    verdict by the rule ``unwritten``: its contract leaves them unwritten), or none."""
    n = sum(any(v["name"] == "padding" and v["rule"] == "unwritten" for v in c.get("verdicts") or [])
            for c in k["cases"])
    return [f"padding rows' o not judged in {n} session(s): the kernel's contract leaves it unwritten "
            "(padding_output=unwritten); its pool is judged by untouched"] if n else []


def header_lines(report, modes):
    """The run's first line (cases, their golden / generated split, the dtypes of the cases run, device, mesh, modes),
    a line per kernel not judged on every case (how many, and why not), and the kernels' source lines."""
    env = report.environment
    ran = max(report.kernels, key=lambda k: len(k["cases"]), default=None)  # the kernel that ran the most cases
    n_gold = sum(1 for c in ran["cases"] if c["source"] == "golden") if ran else 0
    split = (f"{n_gold} golden, {report.n_cases - n_gold} generated; "
             if ran and len(ran["cases"]) == report.n_cases else "")  # known only once a kernel ran every case
    return [f"gdn2-oracle validate: {report.n_cases} cases ({split}"
            f"set {report.cases!r}), dtypes {','.join(run_dtypes(report))}; device {env['device_kind']} "
            f"({env['platform']}), jax {env['jax_version']}"
            + (f"; mesh {report.mesh}" if report.mesh else "")
            + (f"; XLA_FLAGS {env['xla_flags']}" if env.get("xla_flags") else "")
            + (f"; modes {','.join(modes)}" if list(modes) != list(VALIDATE_MODES) else ""),
            *judged_lines(report), *source_lines(report.kernels)]


def run_dtypes(report):
    """The dtypes of the cases the kernels were judged on (the selected ones when none was judged)."""
    seen = {c["dtype"] for k in report.kernels for c in k["cases"]}
    return [d for d in report.dtypes if d in seen] + sorted(seen - set(report.dtypes)) or list(report.dtypes)


def judged_lines(report):
    """One line per kernel judged on fewer than the run's cases: ``60 of 68 cases judged for K (8 need ...)``."""
    lines = []
    for j, k in enumerate(report.kernels):
        skipped, other = len(k.get("not_accepted_cases") or []), len(k.get("other_family_cases") or [])
        refused = k.get("refused_cases") or []
        if not skipped and not other and not refused:
            continue
        what = "a mode" if k.get("family", GDN2) == GDN2 else "a flag, a call mode or a state pool"
        needs = report.needs[j] if j < len(report.needs) else {}
        why = [(f"{needs_text(needs)}: not in its signature" if len(needs) == skipped and k.get("family", GDN2) != GDN2
                else f"{skipped} need {what} its signature does not take") if skipped else "",
               f"{other} are of another family" if other else "", refused_text(refused)]
        lines.append(f"  {len(k['cases'])} of {report.n_cases} cases judged for {k['name']} "
                     f"({'; '.join(w for w in why if w)})")
    return lines


def refused_text(refused):
    """``"3 case(s) outside the kernel's domain: <reason>"``: the cases a kernel refused (``refused_cases``), the first
    one's reason (and how many others differ), or ``""`` for none."""
    if not refused:
        return ""
    reasons = list(dict.fromkeys(r["reason"] for r in refused))
    more = f" (and {len(reasons) - 1} other reason(s); the JSON report lists each)" if len(reasons) > 1 else ""
    return f"{len(refused)} case(s) outside the kernel's domain: {reasons[0]}{more}"


def verdict_rows(report):
    """The verdict table's rows: per kernel and dtype, each result's worst case, then the cases in error."""
    rows = []
    for k in report.kernels:
        for dtype, per in k["summary"].items():
            for name in [*MODE_RESULTS, *(n for n in per if n not in MODE_RESULTS and not n.startswith("_"))]:
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
    return rows


# Cases of one kernel that fail alike (grade, results over tolerance, primary diagnosis) are shown as one block from
# this many on: the worst of them whole, the others by name.
GROUP_ALIKE = 3


def failure_key(k, c):
    """What makes two failing cases of kernel ``k`` alike: its name, the grade, the results over tolerance and the
    primary diagnosis's kind (None for a case that raised or could not be loaded: never grouped)."""
    if c.get("outcome") == "input-error" or c["error"]:
        return None
    bad = tuple(sorted(v["name"] for v in c["verdicts"] if not v["passed"]))
    kinds = [f["kind"] for i, f in enumerate(c.get("diagnosis") or []) if f.get("primary", i == 0)]
    return k["name"], case_grade(c), bad, kinds[0] if kinds else None


def failure_blocks(report):
    """``[(cases, lines)]``: the blocks of the cases not graded PASS, in report order: one per case, or one per group
    of at least :data:`GROUP_ALIKE` cases failing alike (:func:`failure_key`) -- the worst case's lines, then the
    others' names."""
    failing = [(k, c) for k in report.kernels for c in k["cases"] if not c["passed"]]
    groups = {}
    for k, c in failing:
        key = failure_key(k, c)
        groups.setdefault(key if key is not None else id(c), []).append((k, c))
    blocks = []
    for members in groups.values():
        if len(members) < GROUP_ALIKE:
            blocks += [(1, case_lines(k, c)) for k, c in members]
            continue
        k, worst = max(members, key=lambda kc: max(severity(v) for v in kc[1]["verdicts"] if not v["passed"]))
        names = [c["case"] + ("" if c["dtype"] == worst["dtype"] else f" ({c['dtype']})") for _, c in members
                 if c is not worst]
        shown = ", ".join(names[:20]) + (f", ... ({len(names) - 20} more)" if len(names) > 20 else "")
        blocks.append((len(members), [f"  {k['name']}: {len(members)} cases {case_grade(worst)} alike; the worst:"]
                       + case_lines(k, worst) + [f"      alike: {shown}"]))
    return blocks


def failure_lines(report, max_failures):
    """The cases not graded PASS (:func:`failure_blocks`), the first ``max_failures`` blocks of them (a group of cases
    failing alike is one block)."""
    n = sum(1 for k in report.kernels for c in k["cases"] if not c["passed"])
    if not n:
        return []
    blocks = failure_blocks(report)
    lines = ["", f"Cases not graded PASS ({n}):"]
    for _, block in blocks[:max_failures]:
        lines += block
    rest = sum(cases for cases, _ in blocks[max_failures:])
    if rest:
        lines.append(f"  ... {rest} more case(s) in the JSON report (--max-failures)")
    return lines


def overall_line(report):
    """The verdict line: the outcome, why (input errors, an interrupt, a kernel that judged nothing), the seconds."""
    what = report.outcome
    judged = sum(k["n_cases"] - k.get("n_input_errors", 0) for k in report.kernels)
    empty = [k["name"] for k in report.kernels if not k["n_cases"]]
    why = {"input-error": ("; some cases could not be loaded (see above), every other case passed" if judged else
                           "; no case could be judged (see above)"),
           "interrupted": f"; {max((k['n_cases'] for k in report.kernels), default=0)} of {report.n_cases} "
                          "cases were run, the rest not judged",
           "empty": f"; no case was judged for {', '.join(empty)} (see above): not a pass"}.get(what, "")
    return f"overall: {VERDICT[what]}{why} ({report.seconds:.0f} s)"


# The verdict line's word for each outcome (an interrupted or empty run is never called PASS).
VERDICT = {"pass": "PASS", "fail": "FAIL", "input-error": "INPUT ERROR", "interrupted": INTERRUPTED,
           "precision": "PRECISION (warning)", "empty": EMPTY}


def kernel_line(k, interrupted):
    """One kernel's verdict line: its grade (INTERRUPTED or FAIL in an interrupted run) and its case counts."""
    n_in = k.get("n_input_errors", 0)
    n_p, n_f = k.get("n_precision", 0), k["n_failed"]
    n_pass = k["n_cases"] - n_f - n_p - n_in
    if not k["n_cases"]:
        skipped, refused = len(k.get("not_accepted_cases") or []), len(k.get("refused_cases") or [])
        what = "modes" if k.get("family", GDN2) == GDN2 else "flags"
        parts = [f"{skipped} case(s) of the set need {what} it does not accept" if skipped else "",
                 f"{refused} case(s) outside its own domain (refused)" if refused else ""]
        said = "; ".join(p for p in parts if p) or "the selection has no case it takes"
        why = " before the interrupt" if interrupted else f": {said}"
        return f"{k['name']}: {INTERRUPTED if interrupted else EMPTY} (no case judged{why})"
    word = k.get("grade", FAIL) if interrupted else ("PASS" if k["passed"] else VERDICT[outcome([k])])
    return (f"{k['name']}: {word} ({n_pass}/{k['n_cases']} cases pass{' before the interrupt' if interrupted else ''}"
            f"{f', {n_p} graded PRECISION' if n_p else ''}"
            f"{f', {n_f} FAIL' if n_f else ''}"
            f"{f', {n_in} not judged: input error' if n_in else ''})")


def format_family(k, needs=None):
    """One line: a kernel's family, the cases of other families (not run on it) and the family cases that set a flag
    the kernel does not take, grouped by the keyword each needs (``needs``: ``{case: keywords}`` of this run)."""
    fam = k.get("family", GDN2)
    line = f"  {k['name']}: family {fam}" + (" (the plain contract)" if fam == GDN2 else " (FLA's signature)")
    other = k.get("other_family_cases") or []
    if other:
        line += f"; {len(other)} case(s) of other families not run"
    skipped = k.get("not_accepted_cases") or []
    if fam != GDN2 and skipped and needs and len(needs) == len(skipped):
        line += (f"; {len(skipped)} case(s) not run, a keyword not in its signature ({needs_text(needs)}): "
                 f"{', '.join(skipped[:4])}{' ...' if len(skipped) > 4 else ''}")
    elif fam != GDN2 and skipped:
        line += (f"; {len(skipped)} case(s) need a flag, a call mode or a state pool its signature does not take "
                 f"(not run): {', '.join(skipped[:4])}{' ...' if len(skipped) > 4 else ''}")
    return line


def format_modes(k, selected):
    """One line: the modes a kernel was judged on, those of ``selected`` no case in the set uses, and those the
    kernel does not accept (their cases not run)."""
    m = k.get("modes") or {}
    judged = [x for x in m.get("judged", []) if x != PLAIN]
    line = f"  {k['name']}: judged on {', '.join(judged) if judged else 'no mode case'}"
    unused = [x for x in selected if x != PLAIN and x not in judged and x not in m.get("not_accepted", [])]
    if unused:
        line += f"; no case of this set uses {', '.join(unused)}"
    if m.get("not_accepted"):
        skipped = k.get("not_accepted_cases") or []
        line += (f"; does not accept {', '.join(m['not_accepted'])} (not in the kernel's signature: "
                 f"{len(skipped)} case(s) not run)")
    return line


def modes_arg(text):
    """``--modes`` value: comma-separated names of :data:`VALIDATE_MODES`, in that order."""
    try:
        return call_modes.parse(text, VALIDATE_MODES + (handoff_sessions.MODE,))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("modes: ")) from None


def add_parser(sub):
    """``gdn2-oracle validate``."""
    v = sub.add_parser("validate", help="judge kernels on the golden corpus and generated problems",
                       description="Run kernels on the golden corpus and on oracle-checked generated problems; "
                                   "judge the forward output, final state and all seven gradients.")
    cli_args.add_kernels(v)
    v.add_argument("--dtype", type=cli_args.dtypes, default=list(KERNEL_DTYPES), metavar="LIST",
                   help=f"input dtypes, comma-separated (default {','.join(KERNEL_DTYPES)})")
    v.add_argument("--cases", choices=CASE_SETS, default="quick",
                   help="smoke: 14 of quick's cases, about a minute for one kernel on two cores (a first check); "
                        "golden: the corpus only; quick (default): plus a few generated regimes, 6-12 min; full: "
                        "plus every decay x gate regime at several lengths")
    v.add_argument("--case", action="append", metavar="NAME", help="only this case of the set (repeatable)")
    cli_args.add_seed(v, "seed of the generated problems")
    v.add_argument("--modes", type=modes_arg, default=None, metavar="LIST",
                   help=f"call modes to judge, comma-separated among {','.join(VALIDATE_MODES)} (default: all; "
                        f"{PLAIN} is the plain contract, {TRAINING[0]}..{TRAINING[-1]} FLA chunk_gdn2's training-call "
                        f"modes, {' and '.join(SERVING_MODES)} a state pool; each judged on the kernels whose "
                        "signature accepts it)")
    v.add_argument("--json", metavar="PATH", help="write the JSON report here (a directory: PATH/validate.json)")
    v.add_argument("--plot", metavar="PATH", help="write a PNG heat map here, cases x results coloured by "
                                                  "log10(error / tolerance) (a directory: PATH/validate.png)")
    v.add_argument("--dump", metavar="DIR", help="for each case not graded PASS write DIR/<kernel>/<case>/: arrays.npz "
                                                 "(inputs, results, reference, per-token errors), a PNG of error / "
                                                 "tolerance per token of each failing result, reproduce.txt")
    v.add_argument("--max-failures", type=int, default=60, metavar="N",
                   help="cases not graded PASS printed, each with its diagnosis (default 60)")
    cli_args.add_case_timeout(v)
    v.add_argument("--compile-workers", type=int, default=None, metavar="N",
                   help="threads compiling the kernels' programs ahead of the cases (default: one per two cores; 0: "
                        "compile each program when its first case runs)")
    v.add_argument("--no-program-cache", action="store_true",
                   help="lower every kernel program again (default: every program is traced, and the exported "
                        "program stored under the traced program's content key is read back instead of lowered, from "
                        "$GDN2_PROGRAM_CACHE or ~/.cache/gdn2-oracle/programs; docs/DESIGN.md §4)")
    v.add_argument("--strict", action="store_true",
                   help="fail (exit 1) on cases graded PRECISION too: over the working-precision tolerance but within "
                        "the precision-loss bound (default: a warning, exit 0)")
    v.add_argument("--no-reference-cache", action="store_true",
                   help="neither read nor write the references and baselines cached by recipe (default: read them "
                        "from, and store them in, $GDN2_REFERENCE_CACHE or ~/.cache/gdn2-oracle/references)")
    cli_args.add_prefill(v)
    cli_args.add_run_options(v)


def run(args):
    """Validate, print the verdict table, write ``--json``; the exit status."""
    if args.compile_workers is not None and args.compile_workers < 0:
        raise UsageError(f"gdn2-oracle validate: error: --compile-workers must be >= 0, got {args.compile_workers}")
    if args.max_failures < 0:
        raise UsageError(f"gdn2-oracle validate: error: --max-failures must be >= 0, got {args.max_failures}")
    out = cli_args.outputs(args, json="validate.json", plot="validate.png")
    if out["plot"] or args.dump:
        needs_matplotlib("validate", "--plot" if out["plot"] else "--dump")
    dumper = (dumping.Dumper(output_dir(args.dump, option="--dump"), case_set=args.cases, seed=args.seed)
              if args.dump else None)
    def report_so_far(report, reason):  # the watchdog stopped a hung or slow kernel: what was finished
        print(format_validation(report, max_failures=args.max_failures), flush=True)
        if out["json"]:
            write_after_work("--json", out["json"], lambda: write_json(out["json"], report.to_json()))

    with reference_cache.bypassed(args.no_reference_cache):
        specs = cli_args.specs(args.kernel)
        options = ValidateOptions(dtypes=args.dtype, cases=args.cases, seed=args.seed, only=args.case,
                                  modes=args.modes, mesh=cli_args.built_mesh(args), case_timeout=args.case_timeout,
                                  compile_workers=args.compile_workers, program_cache=not args.no_program_cache,
                                  show_progress=not args.no_progress, prefill=cli_args.prefill(args))
        report = run_validation(specs, options, dump=dumper, on_stop=report_so_far,
                                on_start=lambda line: print(line, flush=True))
    print(format_validation(report, max_failures=args.max_failures), flush=True)
    if out["json"] and write_after_work("--json", out["json"], lambda: write_json(out["json"], report.to_json())):
        print(f"report: {out['json']}", flush=True)
    if out["plot"] and report.kernels and write_after_work("--plot", out["plot"], lambda: dumping.plot_validation(
            report, out["plot"], preferred=MODE_RESULTS)):
        print(f"plot: {out['plot']}", flush=True)
    if dumper is not None:
        print(f"dump: {len(dumper.written)} case folder(s) not graded PASS in {dumper.root}", flush=True)
    if report.interrupted:
        say_interrupted(sum(len(k["cases"]) for k in report.kernels), "kernel x case result(s)", out["json"])
    if args.strict and report.outcome == "precision":
        print("--strict: cases graded PRECISION count as failures", flush=True)
        return EXIT["fail"]
    return EXIT[report.outcome]
