"""Hypothesis properties of any GDN-2 kernel, judged by the tolerance model (ci/grading/tolerance.py).

Every comparison is against the float64 oracle fed exactly the values the kernel saw (inputs and
cotangents rounded to the kernel's dtype), forward output, final state and all seven gradients,
with random cotangents on both the output and the final state.

Tests taking ``kernel`` run once per selected kernel (``--kernel`` / ``GDN2_KERNEL``; see
conftest.py). A failure prints the verdict table, a shell one-liner that reproduces it, the
``make_problem`` call and the ``@example`` line that pins it.

Tight agreement bound (properties 2-5; ``ci.grading.rule.agreement_tolerance``). Two correct kernels, or one
kernel with another chunk size / split point / a split sequence, are each allowed
``tol = max(MULTIPLE x e_rec, FLOOR)`` against the exact result (``e_rec``: the plain float32
recurrence's error on the same inputs; MULTIPLE = 32 in float32). Their *difference* comes only from
where they differ (how the score tiles' decay is formed; where the chunk boundaries fall), so it
must be smaller: we require ``max(AGREE_FRACTION x MULTIPLE x e_rec, FLOOR)`` with
AGREE_FRACTION = 1/3, i.e. ~11 x e_rec where the recurrence rule applies -- 3x tighter than either's
bound against the oracle. It cannot be much tighter: a correct kernel's own error reaches ~8 x e_rec
(0.24 x tol, dh0, calibration), and two kernels' errors are largely independent, so their
difference is of that size too (worst observed: pairwise~factorized 0.62 of this bound, dh0). The floor is
not divided: it is already ~8 float32 ulps, the resolution at
which two different float32 computations of one quantity can be asked to agree. Measured by
``calibrate_tolerance.py`` over every regime (pairwise~factorized, chunk 16/32, split 1/48). A bfloat16 result is
additionally allowed one bf16 ulp at its largest element (``2**-7`` relative), because two kernels
whose float32 values differ by one float32 ulp can round to neighbouring bf16 values.

Agreement grades (``ci.grading.tolerance.agreement`` with ``cum=``): a difference over the tight bound is PRECISION
(a PrecisionLossWarning; ``--gdn2-strict`` fails it) within ``max(MULTIPLE x max(e_rec, e_cum), FLOOR)``,
``e_cum`` the error of the float32 chunked algorithm with cumulative-sum-difference exponents
(``tolerance.cumulative_baseline``, computed only when some difference is over the tight bound), else
FAIL: a kernel whose exponents are differences of float32 cumulative sums rounds differently under
another chunk alignment (a split, another chunk size), by up to ~ulp(|G|) in every decay factor.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading import references, tolerance
from gdn2_oracle.ci.grading.families import GDN2
from gdn2_oracle.ci.grading.tolerance import agreement
from gdn2_oracle.ci.running import harness
from gdn2_oracle.oracle import RESULTS, Recipe, reductions
from gdn2_oracle.property_tests import grading, strategies
from gdn2_oracle.property_tests.strategies import CARRY_CONFIG, CARRY_SPLITS, CORE, specs, target_ratios

# The plain contract's properties: a Gated DeltaNet or KDA kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(GDN2)

# --------------------------------------------------------------------------------------------
# helpers


def _profile():
    try:
        return settings._current_profile  # the name hypothesis loaded (set by conftest / --hypothesis-profile)
    except AttributeError:  # pragma: no cover
        return "dev"


def core_specs(**kw):
    """A Recipe on one of the CORE configs (thorough: or on any config of the small sets)."""
    core = st.sampled_from(CORE).flatmap(lambda c: specs(c, **kw))
    return st.one_of(core, strategies.any_spec(**kw)) if _profile() == "thorough" else core


# Explicit examples (CORE index, decay, gates): every config, decay regime and gate regime is run in
# every profile (deterministic coverage) besides the random draws.
EXPLICIT = [
    (0, "none", "uniform"),
    (1, "strong", "zero"),
    (2, "weak", "one"),
    (3, "moderate", "erase_zero"),
    (4, "mixed", "erase_one"),
    (5, "extreme", "write_one"),
    (5, "resets", "negative"),
    (6, "moderate", "uniform"),
    (7, "weak", "erase_zero"),  # long sequences with weak / no decay: the state spans every block boundary
    (8, "none", "uniform"),
]


def per_config_examples(**fixed):
    """Decorator adding the EXPLICIT examples (``fixed`` overrides fields, e.g. gates)."""

    def deco(f):
        for i, (ci, decay, gates) in enumerate(EXPLICIT):
            c = CORE[ci]
            kw = dict(decay=decay, gates=gates, qk=oracle.QK_MODES[i % 2], initial_state=bool((i + 1) % 2),
                      precision=c.dtype, seed=1000 + i, cot_seed=2000 + i)
            kw.update(fixed)
            f = example(spec=Recipe(*c.shape, **kw))(f)
        return f

    return deco


def explain(spec, kernel_name, report, what, carry=None):
    """Failure message: the verdict table, a reproduction and the lines to pin the example. ``carry``: the split
    point of a state-carry failure (the reproducer reruns the split call, :func:`strategies.carry_repro`)."""
    if carry is None:
        reproduce, pin = strategies.repro(spec, kernel_name), strategies.example(spec)
    else:
        reproduce, pin = strategies.carry_repro(spec, kernel_name, carry), strategies.carry_example(spec, kernel_name,
                                                                                                  carry)
    return (f"{what}\n{report.format()}\n"
            f"reproduce: {reproduce}\n"
            f"pin it:    {pin}\n"
            f"golden:    {spec.call()}  (cotangents: {spec.cotangents_call('p')})")


def check(report, spec, kernel_name, what, carry=None):
    """Fail (with the explanation and a reproducer) on a FAIL grade; warn on PRECISION (fail under --gdn2-strict)."""
    note(f"spec: {spec!r}")
    if not report.passed:
        grading.enforce(report, explain(spec, kernel_name, report, what, carry))


def run(fn, problem, do, dfs, dtype):
    """A kernel's nine results (numpy, in the dtypes it returned them in)."""
    return harness.kernel_results(fn, problem, do, dfs, dtype=dtype)


def inputs_of(spec):  # not `setup`: pytest < 8.1 calls a module-level setup() before the module's tests
    """``(problem, do, dfinal_state)`` of a recipe."""
    return spec.build()


def baselines(problem, do, dfs, got):
    """``(base, cum)`` for results like ``got``: the float32 recurrence baseline, and a function returning the
    cumulative-sum chunked baseline (computed at most once, when a judgement first needs it)."""
    dtypes = {n: tolerance.dtype_name(got[n]) for n in RESULTS}
    base = tolerance.baseline(problem, do, dfs, dtypes)
    return base, functools.cache(lambda: tolerance.cumulative_baseline(problem, do, dfs, dtypes))


def judge(problem, do, dfs, got, ref, dtype):
    """``(report, base, cum)``: the tolerance model's report for results ``got`` and its baselines (for
    :func:`agreement` of results like ``got``)."""
    base, cum = baselines(problem, do, dfs, got)
    return tolerance.compare(problem, do, dfs, got, ref, dtype=dtype, base=base, cum=cum), base, cum


def _fn(name, **options):
    return strategies.kernel_fn(name, **options)


# --------------------------------------------------------------------------------------------
# 1. each kernel matches the oracle


@per_config_examples()
@given(spec=core_specs())
def test_matches_oracle(kernel, spec):
    """Forward, final state and the seven gradients match the float64 oracle, every regime and dtype."""
    p, do, dfs = inputs_of(spec)
    report = harness.validate(kernel.fn, p, do, dfs, dtype=spec.dtype)
    target_ratios(report)  # hypothesis.target on error / tolerance per result: steers the search (as gdn2-oracle hunt)
    check(report, spec, kernel.name, f"kernel {kernel.name!r} vs the float64 oracle")


# --------------------------------------------------------------------------------------------
# 2. pairwise and factorized agree (tightly)


@pytest.mark.parametrize("owner", ["factorized"])  # runs only when our factorized kernel is under test
@per_config_examples()
@given(spec=core_specs())
def test_pairwise_and_factorized_agree(kernel, owner, spec):
    """The two kernels differ only in how the score tiles' decay is formed: their results agree to
    a third of the model's recurrence rule (3x tighter than either's bound against the oracle); over it,
    within the agreement's precision-loss bound, PRECISION."""
    p, do, dfs = inputs_of(spec)
    a = run(_fn("pairwise"), p, do, dfs, spec.dtype)
    b = run(kernel.fn, p, do, dfs, spec.dtype)
    ref = references.reference_results(p, do, dfs)
    base, cum = baselines(p, do, dfs, a)
    check(agreement(p, b, a, ref, base, spec.dtype, what="factorized~pairwise", cum=cum),
          spec, "factorized", "factorized vs pairwise (tight agreement)")


# --------------------------------------------------------------------------------------------
# 3. chunk-size and split-point invariance (kernels that accept those options)

VARIANTS = [  # (kernel, options): chunk sizes below the default, split points off the middle, a small leaf
    ("pairwise", dict(chunk_size=16)),
    ("pairwise", dict(chunk_size=32)),
    ("factorized", dict(chunk_size=16, leaf=8)),
    ("factorized", dict(chunk_size=32)),
    ("factorized", dict(split=1)),  # the earliest split: a 1-token earlier block
    ("factorized", dict(split=48)),  # an off-centre split
    ("factorized", dict(chunk_size=32, split=5, leaf=8)),
]
VARIANT_CONFIG = strategies.core_config(T=65, dtype="float32")


def _variant_id(opts):
    return ",".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.slow
@pytest.mark.parametrize("owner,options", VARIANTS, ids=[f"{n}({_variant_id(o)})" for n, o in VARIANTS])
@given(spec=specs(VARIANT_CONFIG))
@settings(max_examples=max(2, settings().max_examples // 2))
def test_chunk_and_split_invariance(kernel, owner, options, spec):
    """The same kernel with another chunk_size / split / leaf: matches the oracle, and agrees tightly
    with its default options (the chunking is an implementation detail, not a numerical choice)."""
    assert kernel.name == owner and kernel.configurable  # other combinations are deselected (conftest)
    variant = kernel.variant(**options)
    p, do, dfs = inputs_of(spec)
    got = run(variant.fn, p, do, dfs, spec.dtype)
    ref = references.reference_results(p, do, dfs)
    report, base, cum = judge(p, do, dfs, got, ref, spec.dtype)
    check(report, spec, kernel.name, f"{kernel.name}({_variant_id(options)}) vs the float64 oracle")
    default = run(kernel.fn, p, do, dfs, spec.dtype)
    check(agreement(p, got, default, ref, base, spec.dtype, what="options~default", cum=cum),
          spec, kernel.name, f"{kernel.name}({_variant_id(options)}) vs {kernel.name}() (tight agreement)")


# --------------------------------------------------------------------------------------------
# 4. state carry


@pytest.mark.parametrize("t", CARRY_SPLITS, ids=[f"split{t}" for t in CARRY_SPLITS])
@given(spec=specs(CARRY_CONFIG))
def test_state_carry(kernel, t, spec):
    """[0, t) then [t, T) with the carried final state equals one call: forward, and every gradient
    by chaining the two calls' VJPs (the second call's dh0 is the first call's final-state cotangent).
    A failure's reproducer reruns this split call (``harness.carried_results``), not one call."""
    p, do, dfs = inputs_of(spec)
    report, agrees = harness.validate_carried(kernel.fn, p, do, dfs, t, dtype=spec.dtype)
    check(report, spec, kernel.name, f"{kernel.name}: [0,{t}) + [{t},{p.shape[1]}) with carried state vs the oracle",
          carry=t)
    check(agrees, spec, kernel.name, f"{kernel.name}: split at {t} with carried state vs one call (tight agreement)",
          carry=t)


# --------------------------------------------------------------------------------------------
# 5. linearity in (v, h0) and equivariance under head / batch permutations

SCALED = {"o", "final_state", "dq", "dk", "dg", "db", "dw"}  # linear in (v, h0); dv, dh0 do not change
TINY = 2.0 ** -90  # below this, flush-to-zero of subnormals may differ between the two calls


@given(spec=core_specs(), c=st.sampled_from([2.0 ** -3, 2.0, 2.0 ** 5]))
def test_scaling_v_and_initial_state(kernel, spec, c):
    """Scaling v and h0 by a power of two c scales o, the final state and dq, dk, dg, db, dw by c
    exactly (every operation is linear in (v, h0) or independent of it) and leaves dv, dh0 unchanged."""
    p, do, dfs = inputs_of(spec)
    scaled = p.replace(v=c * p.v, initial_state=None if p.initial_state is None else c * p.initial_state)
    a = run(kernel.fn, p, do, dfs, spec.dtype)
    b = run(kernel.fn, scaled, do, dfs, spec.dtype)
    bad = []
    for name in RESULTS:
        want = c * a[name].astype(np.float64) if name in SCALED else a[name].astype(np.float64)
        got = b[name].astype(np.float64)
        diff = np.max(np.abs(got - want)) if np.all(np.isfinite(got)) else np.inf
        if not diff <= TINY * max(c, 1.0):
            bad.append(f"{name}: max|f(c v, c h0) - {'c ' if name in SCALED else ''}f(v, h0)| = {diff:.3e} "
                       f"(max|f| = {np.max(np.abs(want)):.3e})")
    note(f"spec: {spec!r}, c = {c}")
    if bad:
        pytest.fail(f"{kernel.name}: scaling v, h0 by c = {c} is not exact\n" + "\n".join(bad)
                    + f"\nreproduce (base case): {strategies.repro(spec, kernel.name)}"
                    + f"\npin it: {strategies.example(spec)}", pytrace=False)


def _permute(p, do, dfs, axis_bt, perm):
    """Permute batch (axis 0) or heads (axis 2 of [B,T,H,*], 1 of [B,H,K,V]) of a problem and its cotangents."""
    def take(x, ax):
        return np.take(x, perm, axis=ax)

    st_axis = 0 if axis_bt == 0 else 1
    h0 = None if p.initial_state is None else take(p.initial_state, st_axis)
    q = p.replace(**{n: take(getattr(p, n), axis_bt) for n in oracle.INPUTS}, initial_state=h0)
    return q, take(do, axis_bt), take(dfs, st_axis)


PERMUTABLE = tuple(c for c in CORE if c.B > 1 or c.H > 1)


@given(spec=st.sampled_from(PERMUTABLE).flatmap(specs))
def test_batch_and_head_permutation(kernel, spec):
    """Permuting batch rows and heads of the inputs permutes every result the same way."""
    p, do, dfs = inputs_of(spec)
    a = run(kernel.fn, p, do, dfs, spec.dtype)
    ref = references.reference_results(p, do, dfs)
    base, cum = baselines(p, do, dfs, a)
    for axis, n in ((0, spec.B), (2, spec.H)):
        if n == 1:
            continue
        perm = np.arange(n)[::-1]
        pp, pdo, pdfs = _permute(p, do, dfs, axis, perm)
        b = run(kernel.fn, pp, pdo, pdfs, spec.dtype)
        # undo the permutation of the results (perm is an involution)
        back = {name: np.take(x, perm, axis=axis if x.ndim == 4 and name not in ("final_state", "dh0")
                              else (0 if axis == 0 else 1)) for name, x in b.items()}
        check(agreement(p, back, a, ref, base, spec.dtype, what="permuted~original", cum=cum),
              spec, kernel.name, f"{kernel.name}: {'batch' if axis == 0 else 'head'} permutation")


# --------------------------------------------------------------------------------------------
# 6. reductions: GLA (b = 0), KDA, Gated DeltaNet


@given(spec=core_specs(gates=("zero", "erase_zero")))
def test_gla_reduction(kernel, spec):
    """b = 0: o and the final state match the independent O(T^2) closed form (oracle.reductions.gla_forward),
    judged by the model (and the gradients against the recurrence)."""
    p, do, dfs = inputs_of(spec)
    got = run(kernel.fn, p, do, dfs, spec.dtype)
    ref = references.reference_results(p, do, dfs)
    o, S = reductions.gla_forward(p)
    ref = {**ref, "o": o, "final_state": S}
    report, _, _ = judge(p, do, dfs, got, ref, spec.dtype)
    check(report, spec, kernel.name, f"{kernel.name} vs the gated-linear-attention closed form (b = 0)")


REDUCTION = {"kda": "kda", "gated_deltanet": "gdn"}  # test id -> Recipe.reduction


@pytest.mark.parametrize("model", list(REDUCTION))
@given(spec=core_specs(gates=("uniform", "one", "negative")))
def test_kda_and_gated_deltanet(kernel, model, spec):
    """KDA (b = w = beta) and Gated DeltaNet (also a scalar decay per head) problems match the oracle."""
    spec = spec.replace(reduction=REDUCTION[model])  # oracle.reductions.reduce of the drawn problem
    p, do, dfs = inputs_of(spec)
    report = harness.validate(kernel.fn, p, do, dfs, dtype=spec.dtype)
    check(report, spec, kernel.name, f"{kernel.name} on the {model} reduction of the spec's problem "
                                     f"(b = w = beta = b[..., 0]{', g = g[..., 0]' if model != 'kda' else ''})")


@given(spec=core_specs(gates=("uniform", "negative")), perm_seed=st.integers(0, 2**16))
def test_gated_deltanet_key_channel_permutation(kernel, spec, perm_seed):
    """Gated DeltaNet: the decay is shared by all key channels, so permuting the key channels of q, k, b
    (and the rows of h0) permutes dq, dk, dg, db, the final state and dh0 the same way and leaves o,
    dv, dw unchanged."""
    spec = spec.replace(reduction="gdn")
    p, do, dfs = inputs_of(spec)
    perm = np.random.default_rng(perm_seed).permutation(spec.K)
    h0 = None if p.initial_state is None else p.initial_state[:, :, perm]
    pp = p.replace(q=p.q[..., perm], k=p.k[..., perm], g=p.g[..., perm], b=p.b[..., perm], initial_state=h0)
    a = run(kernel.fn, p, do, dfs, spec.dtype)
    b = run(kernel.fn, pp, do, dfs[:, :, perm], spec.dtype)
    inv = np.argsort(perm)
    back = dict(b)
    for name in ("dq", "dk", "dg", "db"):
        back[name] = b[name][..., inv]
    for name in ("final_state", "dh0"):
        back[name] = b[name][:, :, inv]
    ref = references.reference_results(p, do, dfs)
    base, cum = baselines(p, do, dfs, a)
    check(agreement(p, back, a, ref, base, spec.dtype, what="permuted~original", cum=cum),
          spec, kernel.name, f"{kernel.name}: Gated DeltaNet key-channel permutation {perm.tolist()}")
