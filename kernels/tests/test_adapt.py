"""Mapping and padding options for any kernel (kernels/adapt.py, docs/DESIGN.md §2): another positional order
and layout, the scale and state positionally, exp2 log-decays, exact padding of K, V and T, a float32 ``o``."""

from __future__ import annotations

import math
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.testing import assert_matches_oracle, oracle_case
from gdn2_oracle.kernels import adapt
from gdn2_oracle.oracle import Recipe

BASE = kernels.get("pairwise", chunk_size=16)
RECIPE = Recipe(1, 37, 2, 16, 24, decay="strong", gates="uniform", initial_state=True, seed=4, cot_seed=5)


def levanter_style(q, k, v, w, b, g, scale, h0):
    """Levanter's order (q, k, v, w, b, g, scale, h0 positional), head-major [B, H, T, dim], and only
    K = V = 128 with T a multiple of 256 (as a TPU kernel tiled that way)."""
    assert q.shape[-1] == 128 and v.shape[-1] == 128 and q.shape[2] % 256 == 0, (q.shape, v.shape)
    t = [jnp.swapaxes(x, 1, 2) for x in (q, k, v, g, b, w)]
    o, S = BASE(*t, scale=scale, initial_state=h0)
    return jnp.swapaxes(o, 1, 2), S


def exp2_decay(q, k, v, g2, b, w, *, sm_scale=None, h0=None):
    """A kernel that takes base-2 log-decays (it calls exp2) and names its scale and state differently."""
    return BASE(q, k, v, g2 * math.log(2.0), b, w, scale=sm_scale, initial_state=h0)


def float32_o(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """FLA's naive references return o in float32 for bfloat16 inputs."""
    o, S = BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return o.astype(jnp.float32), S


def test_a_levanter_style_kernel_needs_no_adapter():
    fn = kernels.get(f"{__name__}:levanter_style[order=qkvwbgsh,layout=bhtk,pad=K128V128T256]")
    assert fn.pad == {"K": 128, "V": 128, "T": 256} and fn.__wrapped__.mapping["order"] == "qkvwbgsh"
    assert_matches_oracle(fn, RECIPE)


def test_padding_is_exact():
    """Zero channels and identity tokens change nothing: padded and unpadded runs agree to float32 rounding
    of the same sums (the padded terms are exact zeros)."""
    problem, do, dfs = oracle_case(RECIPE).data()
    plain = harness.kernel_results(BASE, problem, do, dfs)
    padded = harness.kernel_results(adapt.padded(BASE, "K32V40T48"), problem, do, dfs)
    for name, want in plain.items():
        np.testing.assert_allclose(padded[name], want, rtol=2e-5, atol=1e-6 * np.max(np.abs(want)), err_msg=name)


def test_exp2_decays_and_renamed_keywords():
    assert_matches_oracle(kernels.get(f"{__name__}:exp2_decay[decay_base=2,scale_arg=sm_scale,state_arg=h0]"),
                          RECIPE)


def test_a_float32_o_is_judged_as_what_it_is():
    bf16 = RECIPE.replace(precision="bfloat16")
    assert_matches_oracle(kernels.get(f"{__name__}:float32_o[o_dtype=float32]"), bf16)
    problem, do, dfs = oracle_case(bf16).data()
    with pytest.raises(harness.ContractError, match="dtype float32, expected bfloat16"):
        harness.kernel_results(kernels.get(f"{__name__}:float32_o"), problem, do, dfs, dtype="bfloat16")


@pytest.mark.parametrize("spec, match", [
    ("levanter_style[order=qkvwb]", "order: 'qkvwb'"),
    ("levanter_style[order=qkvwbgsx]", "order:"),
    ("levanter_style[order=qkvwbg,layout=thbk]", "layout: 'thbk'"),
    ("levanter_style[order=qkvwbg,decay_base=10]", "decay_base: 10"),
    ("levanter_style[order=qkvwbg,scale_arg='1x']", "scale_arg:"),
    ("levanter_style[pad=K128,V128]", "not of the form key=value"),
    ("levanter_style[pad=K128K64]", "pad: 'K128K64'"),
    ("levanter_style[pad=X8]", "pad: 'X8'"),
    ("levanter_style[o_dtype=float16]", "o_dtype: 'float16'"),
])
def test_bad_mapping_options_name_the_option(spec, match):
    with pytest.raises(ValueError, match=match):
        kernels.get(f"{__name__}:{spec}")


def test_every_kernel_takes_the_wrapping_options_and_external_ones_the_mapping():
    assert kernels.accepts("pairwise", "pad") and kernels.accepts("pairwise", "o_dtype")
    assert not kernels.accepts("pairwise", "order")
    assert kernels.accepts(f"{__name__}:levanter_style", "order")
    fn = kernels.get("pairwise[chunk_size=16,pad=T64]")
    assert fn.pad == {"T": 64}


def _copy_body(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def pallas_copy(x):
    """``x`` copied through a ``pl.pallas_call`` that takes no ``interpret`` argument (off a TPU it needs
    interpret mode)."""
    from jax.experimental import pallas as pl

    return pl.pallas_call(_copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@jax.custom_vjp
def pallas_backward(x):
    """The identity, whose custom backward copies the cotangent through a Pallas call (atomic-ops' fused backward
    launches its own ``pallas_call``s this way, after the forward has returned)."""
    return x


pallas_backward.defvjp(lambda x: (x, None), lambda _, dy: (pallas_copy(dy),))


def pallas_backward_kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """A correct kernel whose ``dq`` comes back through a Pallas call in its custom backward."""
    return BASE(pallas_backward(q), k, v, g, b, w, scale=scale, initial_state=initial_state)


def test_interpret_covers_the_custom_backward():
    """``interpret=1`` turns interpret mode on for the kernel's VJP too: the judge's program (forward and all seven
    gradients, jitted) runs on a CPU and matches the oracle; interpret mode around the forward call alone leaves the
    backward's Pallas call compiled for the host, which a CPU refuses."""
    kernel = kernels.get(f"{__name__}:pallas_backward_kernel[interpret=1]")
    assert kernel.interpret == "tpu"
    assert_matches_oracle(kernel, RECIPE.replace(T=8))
    if jax.default_backend() == "cpu":
        def forward_only(*args, **kwargs):
            with adapt.tpu_interpret_mode():
                return pallas_backward_kernel(*args, **kwargs)

        problem, do, dfs = oracle_case(RECIPE.replace(T=8)).data()
        with pytest.raises(Exception, match="Only interpret mode is supported on CPU"):
            harness.kernel_results(forward_only, problem, do, dfs)


def test_interpret_keeps_flags_and_integer_arrays_concrete():
    """Only traced values and float arrays become the interpreted VJP's inputs: a Python flag, a number and a
    concrete integer array (a static ``cu_seqlens``) reach the kernel as they were given."""
    seen = {}

    def kernel(x, *, flag, cu_seqlens, scale):
        seen.update(flag=flag, cu=cu_seqlens, scale=scale)
        return pallas_backward(x) * scale

    x = jnp.arange(8.0).reshape(1, 8)
    cu = jnp.asarray([0, 3, 8])
    grad = jax.grad(lambda x: adapt.interpreted(kernel, 1)(x, flag=True, cu_seqlens=cu, scale=0.5).sum())(x)
    np.testing.assert_array_equal(grad, np.full((1, 8), 0.5))
    assert seen["flag"] is True and seen["scale"] == 0.5 and not isinstance(seen["cu"], jax.core.Tracer)


def test_interpret_reaches_a_program_lowered_on_another_thread():
    """The compile-ahead lookahead traces the judge's program on a thread of its own (ci/running/ahead.py): the
    interpret context is set by the kernel wherever it is traced, so that program runs too, backward included."""
    kernel = kernels.get(f"{__name__}:pallas_backward_kernel[interpret=1]")
    case = oracle_case(RECIPE.replace(T=8))
    problem, do, dfs = case.data()
    lowered = {}
    worker = threading.Thread(target=lambda: lowered.update(program=harness.lower(kernel, problem, "float32")))
    worker.start()
    worker.join()
    compiled = lowered["program"].compile()
    report = case.judge(harness.kernel_results(kernel, problem, do, dfs, program=lambda: compiled))
    assert report.passed, report.format()
