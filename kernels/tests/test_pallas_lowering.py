"""The Pallas kernels lower for TPU (Mosaic) at the benchmark shapes -- on CPU, without a TPU.

``jax.export`` with ``platforms=["tpu"]`` runs the Pallas -> Mosaic lowering of every kernel
(block shapes against the TPU tiling, lowering rules of every primitive in the kernel bodies) and
serialises the Mosaic module into a ``tpu_custom_call``. Nothing is executed. What this cannot
check is the Mosaic compiler itself (layout assignment, VMEM allocation), which only runs in
libtpu on a TPU host: ``gdn2-oracle validate --kernel pallas-factorized`` there is the real check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from gdn2_oracle.kernels.pallas import SWEEP, make_kernel

BENCH = dict(T=4096, H=6, K=128, V=128)


def _specs(B, dtype):
    T, H, K, V = BENCH["T"], BENCH["H"], BENCH["K"], BENCH["V"]
    kspec = jax.ShapeDtypeStruct((B, T, H, K), dtype)
    vspec = jax.ShapeDtypeStruct((B, T, H, V), dtype)
    sspec = jax.ShapeDtypeStruct((B, H, K, V), jnp.float32)
    return kspec, vspec, sspec


def export_forward_backward(cfg, B, dtype):
    fn = make_kernel(cfg.method, chunk_size=cfg.chunk_size, split=cfg.split, leaf=cfg.leaf, interpret=False)

    def fwd(q, k, v, g, b, w, h0):
        return fn(q, k, v, g, b, w, initial_state=h0)

    def bwd(q, k, v, g, b, w, h0, do, dfs):
        _, vjp = jax.vjp(fwd, q, k, v, g, b, w, h0)
        return vjp((do, dfs))

    kspec, vspec, sspec = _specs(B, dtype)
    args = (kspec, kspec, vspec, kspec, kspec, vspec, sspec)
    ef = jax.export.export(jax.jit(fwd), platforms=["tpu"])(*args)
    eb = jax.export.export(jax.jit(bwd), platforms=["tpu"])(*args, vspec, sspec)
    return ef, eb


CASES = [pytest.param(cfg, B, dt, id=f"{cfg.name}-B{B}-{jnp.dtype(dt).name}",
                      marks=() if B == 4 else pytest.mark.slow)
         for cfg in SWEEP for dt in (jnp.float32, jnp.bfloat16) for B in (4, 8)]


@pytest.mark.parametrize("cfg, B, dtype", CASES)
def test_lowers_for_tpu(cfg, B, dtype):
    ef, eb = export_forward_backward(cfg, B, dtype)
    T, H, K, V = BENCH["T"], BENCH["H"], BENCH["K"], BENCH["V"]
    assert ef.platforms == ("tpu",) and eb.platforms == ("tpu",)
    fwd_txt, bwd_txt = ef.mlir_module(), eb.mlir_module()
    assert "tpu_custom_call" in fwd_txt and "tpu_custom_call" in bwd_txt
    assert f"gdn2_fwd_{cfg.method}_c{cfg.chunk_size}" in fwd_txt
    assert f"gdn2_bwd_{cfg.method}_c{cfg.chunk_size}" in bwd_txt
    o, s = ef.out_avals
    assert o.shape == (B, T, H, V) and o.dtype == dtype
    assert s.shape == (B, H, K, V) and s.dtype == jnp.float32
    grads = eb.out_avals
    assert [g.dtype for g in grads] == [dtype] * 6 + [jnp.float32]
    assert grads[3].shape == (B, T, H, K) and grads[6].shape == (B, H, K, V)
