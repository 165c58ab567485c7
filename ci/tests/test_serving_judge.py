"""The serving judge (ci/grading/serving.py), its recipes (oracle/serving_recipes.py) and runner
(ci/running/serving.py).

Judge-level tests feed the judge the oracle's own float32 runs (with and without the state rounded to 16 bits at
every store or after every token) and tampered copies: the grades, the hard checks and the diagnosis follow.
Runner-level tests run the JAX decode kernel with float32 / bfloat16 / float16 pools and FLA's naive recurrent
reference through the torch adapter; the long-horizon test measures the figure of docs/serving.md.
"""

from __future__ import annotations

import importlib.util
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading import serving as judge
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION
from gdn2_oracle.ci.running import serving as runner
from gdn2_oracle.kernels.serving_bridge import FLA_NAIVE_SPEC, TorchDecode
from gdn2_oracle.kernels.testing_decode import mutant
from gdn2_oracle.oracle import serving_recipes as recipes

HAS_FLA = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("fla") is not None
needs_fla = pytest.mark.skipif(not HAS_FLA, reason="torch and fla-core (the fla extra) are not installed")


def scripted(recipe, *args, **kw):
    """The judge's session of a recipe's script (``oracle/serving_recipes.py``)."""
    return judge.Session.from_script(recipe(*args, **kw))


def _cast(x, dtype):
    return np.array(jnp.asarray(np.asarray(x, np.float32)).astype(dtype))


def feed(session, state_dtype, tamper=None, **options):
    """Judge the oracle's own float32 chain (``serving.decode`` options) as if a kernel had returned it; ``tamper(i,
    o, pool_after)`` may change a call's results (in place)."""
    j = session.judge(state_dtype)
    before = _cast(session.pool, state_dtype)
    for i, (_, r, _) in enumerate(session.chain(dtype=np.float32, **options)):
        o, after = _cast(r.o, session.dtype), _cast(r.pool, state_dtype)
        if tamper is not None:
            tamper(i, o, after)
        j.add(i, o, before, after)
        before = after
    return j.report()


def kinds(report):
    return {f.kind for f in report.diagnosis}


# --- the judge --------------------------------------------------------------------------------------------------

def test_float32_chain_passes():
    for session in (scripted(recipes.pool_gather_scatter), scripted(recipes.speculative_accept)):
        report = feed(session, "float32")
        assert report.grade == PASS and not report.diagnosis, report.format()


def test_stored_state_bound_arithmetic():
    assert judge.stored_state_bound(1e-7, 1e-3, "float32", "bfloat16") == (32e-7, 8e-3)
    assert judge.stored_state_bound(1e-9, 0.0, "float32", "float32") == (2.0 ** -20, 2.0 ** -20)  # floor
    assert judge.stored_state_bound(1e-3, math.inf, "bfloat16", "bfloat16") == (8e-3, 8e-3)


def test_16_bit_store_is_precision_and_16_bit_loop_is_fail():
    """The oracle with the state rounded to bfloat16 at every store (a correct bf16 pool) is PRECISION on a long
    horizon; rounded after every token (the state kept in bf16 inside the loop), FAIL, diagnosed as such."""
    session = scripted(recipes.long_horizon_prefill)
    store = feed(session, "bfloat16", store_dtype="bfloat16")
    assert store.grade == PRECISION and kinds(store) == {"stored-state"}, store.format()
    loop = feed(session, "bfloat16", carry_dtype="bfloat16", store_dtype="bfloat16")
    assert loop.grade == FAIL and "state-in-loop" in kinds(loop), loop.format()
    assert loop["o"].err_ratio > 4 * loop["o"].bound_ratio


def test_stalled_decay_is_flagged():
    """Single-token calls, no writes: a bf16 pool stalls (1 - 0.99992 is below half an ulp), an O(1) error every
    correct kernel with that pool has: PRECISION, with a warning in the diagnosis."""
    session = scripted(recipes.long_horizon, gates="zero")
    report = feed(session, "bfloat16", store_dtype="bfloat16")
    assert report.grade == PRECISION and report["state"].err_ratio > 0.1, report.format()
    assert "decay stalls" in judge.diagnosis_text(report)


def test_hard_checks():
    session = scripted(recipes.pool_gather_scatter)

    def touch(i, o, pool):
        if i == 2:
            pool[0, 0, 0, 0] += 1.0  # slot 0 is never addressed

    report = feed(session, "float32", touch)
    assert report["untouched"].grade == FAIL and report["o"].grade == PASS
    assert "pool-bookkeeping" in kinds(report) and "call 2" in report["untouched"].note

    def pad(i, o, pool):
        if i == 1:
            o[1] = 1.0  # row 1 is padding

    report = feed(session, "float32", pad)
    assert report["padding"].grade == FAIL and "padding" in kinds(report)


def test_wrong_starting_state_and_nan():
    session = scripted(recipes.chunked_prefill)

    def shift(i, o, pool):
        if i >= 2:
            o[...] = o + np.float32(1.0)

    report = feed(session, "float32", shift)
    assert report["o"].grade == FAIL and "logic" in kinds(report)
    assert "from call 2" in judge.diagnosis_text(report) and "starts from is wrong" in judge.diagnosis_text(report)

    def nan(i, o, pool):
        if i == 3:
            pool[2] = np.nan

    report = feed(session, "float32", nan)
    assert report["state"].rule == "non-finite" and "non-finite" in kinds(report)


def test_judge_refuses_what_it_cannot_judge():
    session = scripted(recipes.pool_gather_scatter)
    j = session.judge("float32")
    o = np.zeros(session.calls[0].q.shape[:3] + (recipes.V,), np.float32)
    pool = _cast(session.pool, "float32")
    with pytest.raises(ValueError, match="^state_pool:"):
        j.add(0, o, pool, _cast(session.pool, "bfloat16"))
    with pytest.raises(ValueError, match="^i:"):
        j.add(1, o, pool, pool)
    with pytest.raises(ValueError, match="^report:"):
        j.report()
    with pytest.raises(ValueError, match="^state_dtype:"):
        session.judge("float64")
    odd = judge.Session("odd", session.calls, session.pool + 2.0 ** -20, dtype="float32")
    with pytest.raises(ValueError, match="^state_dtype:"):
        odd.judge("bfloat16")
    with pytest.raises(ValueError, match=r"^calls\[0\]\.q:"):
        judge.Session("bf16", session.calls, session.pool, dtype="bfloat16")


def test_agreement():
    ref = {"o": np.linspace(-1, 1, 64)}
    errors = {"o": ((1e-7, 1e-7), (1e-7, 1e-7))}
    same = judge.agreement("split", ref, {"o": ref["o"] * (1 + 2e-7)}, ref, errors, {"o": "float32"}, "float32")
    assert same.passed
    off = judge.agreement("split", ref, {"o": ref["o"] * 1.001}, ref, errors, {"o": "float32"}, "float32")
    assert not off.passed and off.grade == FAIL


def test_sessions_and_modes():
    names = [s.name for s in recipes.sessions(("float32",), modes=("speculative",))]
    assert names == ["serving_speculative_accept"]
    assert len(recipes.sessions(("float32", "bfloat16"))) == 2 * len(recipes.RECIPES)
    with pytest.raises(ValueError, match="^modes:"):
        recipes.sessions(modes=("prefill",))
    s = scripted(recipes.speculative_accept, "bfloat16")
    d = s.describe()
    assert d["mode"] == "speculative" and d["dtype"] == "bfloat16" and d["case"].endswith("_bf16")
    for sd in judge.STATE_DTYPES:
        assert s.exact_in(sd)


# --- the runner ----------------------------------------------------------------------------------------------------

def test_which_kernels_take_part():
    assert runner.convention(kernels.get("decode")) == "pool"
    assert not runner.accepts_serving(kernels.get("pairwise"))

    def kwargs_only(q, k, v, g, b, w, **kwargs):
        return None

    def fla_style(q, k, v, g, b, w, initial_state=None, ssm_state_indices=None, **kwargs):
        return None

    assert not runner.accepts_serving(kwargs_only)  # FLA's public fused_recurrent_gdn2 drops the slots this way
    assert runner.convention(fla_style) == "fla"
    assert runner.state_dtype(kernels.get("decode", state_dtype="float16")) == "float16"


@pytest.mark.parametrize("state_dtype", judge.STATE_DTYPES)
def test_decode_kernel_on_the_short_recipes(state_dtype):
    fn = kernels.get("decode", state_dtype=state_dtype)
    for case in runner.serving_cases(("float32",), only=("pool_gather_scatter", "speculative_accept")):
        res = case.run(fn)
        assert set(res.to_dict()) == {*case.describe(), "passed", "outcome", "grade", "verdicts", "diagnosis",
                                      "error", "seconds"}
        want = {PASS} if state_dtype == "float32" else {PASS, PRECISION}
        assert res.grade in want, (case.name, res)
        case.release()


def test_a_kernel_without_a_pool_is_an_error_case():
    case = runner.serving_cases(("float32",), only=("pool_gather_scatter",))[0]
    res = case.run(kernels.get("pairwise"))
    assert res.outcome == "error" and res.grade == FAIL and "takes no state pool" in res.error


def test_long_horizon_figure(record_property):
    """docs/serving.md: 4,096 single-token calls at decay 0.99992 (H = 2, K = V = 32, uniform gates, as the
    DESIGN figure) and the 256-token-chunk horizon; a bf16 pool within its bound, the bf16-in-loop kernel not."""
    long = scripted(recipes.long_horizon, shape=(2, 32, 32))
    chunks = scripted(recipes.long_horizon_prefill)
    fig = {}
    for label, fn in (("float32", kernels.get("decode")), ("bfloat16", kernels.get("decode", state_dtype="bfloat16")),
                      ("float16", kernels.get("decode", state_dtype="float16")),
                      ("bf16_in_loop[bfloat16]", mutant("bf16_in_loop", "bfloat16"))):
        for name, session in (("single", long), ("chunks", chunks)):
            r = runner.run_session(fn, session)
            fig[f"{label} {name}"] = {v.name: (v.grade, v.err_ratio, v.tol_ratio, v.bound_ratio)
                                      for v in r.verdicts if v.name in judge.GRADED}
    record_property("serving_long_horizon_figure", fig)
    assert {g for g, *_ in fig["float32 single"].values()} == {PASS}
    for sd in ("bfloat16", "float16"):
        for name in ("single", "chunks"):
            for g, err, _tol, bound in fig[f"{sd} {name}"].values():
                assert g in (PASS, PRECISION) and (bound is None or err < bound / 2), fig
    assert fig["bf16_in_loop[bfloat16] chunks"]["o"][0] == FAIL


# --- FLA's naive recurrent reference through the torch adapter ----------------------------------------------------

@needs_fla
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_fla_naive_peer(state_dtype):
    fn = kernels.get(f"{FLA_NAIVE_SPEC}[device=cpu,state_dtype={state_dtype}]")
    assert runner.convention(fn) == "fla" and runner.state_dtype(fn) == state_dtype
    for case in runner.serving_cases(("float32", "bfloat16"), only=("pool_gather_scatter", "speculative_accept",
                                                                    "chunked_prefill")):
        res = case.run(fn)
        assert res.grade in ({PASS} if state_dtype == "float32" else {PASS, PRECISION}), (case.name, res)


@needs_fla
def test_torch_adapter_copies_the_pool_and_accepts_a_functional_kernel():
    import torch

    def functional(q, k, v, g, b, w, initial_state=None, ssm_state_indices=None, scale=None, **kwargs):
        new = initial_state.clone()
        new[ssm_state_indices.long()] += 1.0
        return torch.zeros_like(v), new

    dec = TorchDecode(functional, device="cpu")
    xs = [np.zeros((2, 1, 1, 2), np.float32) for _ in range(6)]
    pool = np.zeros((3, 1, 2, 2), np.float32)
    o, new = dec(*xs, state_pool=pool, state_indices=np.array([2, 0]))
    assert not pool.any() and new[2].all() and new[0].all() and not new[1].any()
    with pytest.raises(ValueError, match="^fn:"):
        TorchDecode(lambda q, k, v, g, b, w, **kw: None)
    with pytest.raises(ValueError, match="^state_dtype:"):
        TorchDecode(functional, options={"state_dtype": "float64"})


def test_validate_modes_decode_speculative_judges_a_serving_kernel_and_catches_a_mutant(cli, monkeypatch, tmp_path):
    """``gdn2-oracle validate --modes decode,speculative``: the serving sessions for kernels that take a state
    pool; a contract-only kernel is listed as not accepting them; a decode mutant FAILs."""
    from gdn2_oracle.kernels import spec as kernel_spec
    from gdn2_oracle.kernels.testing_decode import mutant

    monkeypatch.setitem(kernel_spec._REGISTERED, "decode-wrong-slot", lambda: mutant("wrong_slot", "float32"))
    path = tmp_path / "v.json"
    code, out, err = cli("validate", "--kernel", "decode", "--kernel", "pairwise", "--kernel", "decode-wrong-slot",
                         "--modes", "decode,speculative", "--dtype", "float32", "--no-progress", "--json", path)
    assert code == 1, out + err
    report = json.loads(path.read_text())
    decode, pairwise, wrong = report["kernels"]
    assert decode["passed"] and decode["modes"]["judged"] == ["decode", "speculative"]
    assert pairwise["modes"]["not_accepted"] == ["decode", "speculative"] and pairwise["n_cases"] == 0
    assert not wrong["passed"] and "decode-wrong-slot: FAIL" in out


def test_an_fp16_output_beside_an_fp32_state_overflows_and_is_told_apart():
    """An fp16 output buffer is judged at fp16's rounding where it fits and FAILs where it overflows (outputs
    ~8e4 > 65504), with a diagnosis saying so; a float32 output passes the same session."""
    from gdn2_oracle import kernels
    from gdn2_oracle.ci.running.serving import serving_cases

    [large] = serving_cases(("float32",), 0, ("decode",), ["large_outputs"])
    [small] = serving_cases(("float32",), 0, ("decode",), ["pool_gather_scatter"])
    fp16_out = kernels.get('decode[o_dtype="float16"]')
    res = large.run(fp16_out)
    assert res.grade == "FAIL" and [d.kind for d in res.diagnosis] == ["output-overflow"], res
    assert "65504" in res.diagnosis[0].text
    assert large.run(kernels.get("decode")).grade == "PASS"
    assert small.run(fp16_out).grade == "PASS"


def test_flas_fused_recurrent_kernel_under_the_interpreter_is_judged_in_its_domain_and_refused_outside():
    """FLA's Triton fused_recurrent_gdn2_fwd (the serving engines' path), interpreted on the CPU in a subprocess
    (TRITON_INTERPRET cannot be undone in this one): PASS on single-token steps with permuted slots; a padding
    row (slot -1, unguarded in FLA 0.6.0: memory before the pool, a segfault here) is refused with the reason."""
    import os
    import subprocess
    import sys

    from gdn2_oracle.kernels.serving_bridge import FLA_FUSED_SPEC

    def validate(case):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_", "TRITON_"))}
        return subprocess.run([sys.executable, "-m", "gdn2_oracle.ci.cli", "validate", "--kernel", FLA_FUSED_SPEC,
                               "--modes", "decode", "--cases", "full", "--case", case, "--dtype", "float32",
                               "--no-progress"], env=env, capture_output=True, text=True, timeout=600)

    inside = validate("serving_single_token_steps")
    assert inside.returncode == 0 and "PASS (1/1 cases pass)" in inside.stdout, inside.stdout + inside.stderr
    outside = validate("serving_pool_gather_scatter")
    assert outside.returncode == 1, outside.stdout + outside.stderr  # not a segfault (-11)
    assert "no guard for padding slot -1" in outside.stdout, outside.stdout


def test_serving_contract_messages_name_the_result():
    """A float64 ``o`` and a 3-tuple where ``(o, new_pool)`` is expected are said in those words."""
    session = scripted(recipes.pool_gather_scatter)
    j = session.judge("float32")
    pool = _cast(session.pool, "float32")
    o = np.zeros(session.calls[0].q.shape[:3] + (recipes.V,), np.float64)
    with pytest.raises(ValueError, match=r"^o: call 0 returned o as float64; a serving kernel returns o in one of"):
        j.add(0, o, pool, pool)
    assert runner.returned((o, pool, pool)) == "a 3-tuple"
    assert runner.returned(o).startswith("one array float64[")
    case = runner.serving_cases(("float32",), only=("pool_gather_scatter",))[0]
    decode = kernels.get("decode")

    def three(*args, **kw):
        return (*decode(*args, **kw), None)

    three.__signature__ = __import__("inspect").signature(decode)
    res = case.run(three)
    assert res.outcome == "error" and "returns (o, new_pool), got a 3-tuple" in res.error, res.error


# --- rejected drafts: finite for the kernel, NaN for the reference ----------------------------------------------

def test_rejected_drafts_are_poisoned_finite_and_differently():
    s = scripted(recipes.speculative_accept)
    masks = s.rejected()
    assert s.has_drafts and sum(int(m.sum()) for m in masks) > 0
    assert not scripted(recipes.pool_gather_scatter).has_drafts  # NaN padding rows are no drafts
    a, b = s.poisoned(1), s.poisoned(2)
    for c, ca, cb, m in zip(s.calls, a, b, masks):
        if not m.any():
            assert ca is c  # a call without rejected drafts is the script's
            continue
        for x, xa, xb in zip(c.inputs(), ca.inputs(), cb.inputs()):
            assert np.all(np.isfinite(xa[m])) and not np.array_equal(xa[m], xb[m])
            np.testing.assert_array_equal(xa[~m], x[~m])  # everything else as scripted, padding rows still NaN
    assert np.isnan(s.calls[0].v[5]).all() and np.isnan(a[0].v[5]).all()
    with pytest.raises(ValueError, match="^poisoning:"):
        s.poisoned(3)


def test_a_correct_kernel_is_bit_identical_under_other_drafts():
    session = scripted(recipes.speculative_accept)
    run = runner.SessionRun(kernels.get("decode"), session, keep=True)
    report = run.report
    assert report.passed and report["drafts"].note == "bit-identical" and "window-nan" not in kinds(report)
    arrays, graded = run.arrays(), session.poisoned(1)  # a dump holds the inputs of the graded run too
    assert np.array_equal(arrays["call0_graded_input_v"], graded[0].v, equal_nan=True)
    assert "call5_graded_input_v" not in arrays  # the last call has no rejected drafts


def test_a_kernel_reading_a_rejected_draft_fails_naming_it():
    from gdn2_oracle.kernels.testing_decode import next_token_gate

    report = runner.run_session(next_token_gate, scripted(recipes.speculative_accept))
    assert report["drafts"].grade == FAIL
    first = report.diagnosis[0]
    assert first.primary and first.kind == "rejected-draft"
    assert "call 0, sequence 0 token 1" in first.text and "call 0 sequence 0 token(s) 2, 3" in first.text


def test_window_nan_is_its_own_finding_and_fails_only_when_strict():
    from gdn2_oracle.ci.grading.serving_diagnosis import WINDOW_NAN_TEXT
    from gdn2_oracle.kernels.testing_decode import window_zero_times

    session = scripted(recipes.speculative_accept)
    report = runner.run_session(window_zero_times, session)
    assert report.passed and report["drafts"].note == "bit-identical"
    assert report.diagnosis[0].kind == "window-nan" and WINDOW_NAN_TEXT in report.diagnosis[0].text
    strict = runner.run_session(window_zero_times, session, strict=True)
    assert strict.grade == FAIL and [v.name for v in strict.failures()] == ["window-nan"]


def test_session_sizes_by_kernel():
    script = recipes.speculative_accept(size="k128")
    assert script.pool.shape == (20, 2, 128, 128) and script.name.endswith("_k128")
    with pytest.raises(ValueError, match="^size:"):
        recipes.chunked_prefill(size="k64")
    case = runner.serving_cases(("float32",), only=("chunked_prefill",))[0]

    class Sized:
        session_size = "k128"

    assert case.session_for(kernels.get("decode")) is case.session
    assert case.session_for(Sized()).shape[2:] == (128, 128)
    Sized.session_size = "huge"
    with pytest.raises(ValueError, match="^session_size:"):
        case.session_for(Sized())
