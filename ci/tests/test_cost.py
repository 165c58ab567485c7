"""The TPU cost model (ci/running/cost_model.py): the counter against hand counts, the roofline's arithmetic, and
``gdn2-oracle cost``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from gdn2_oracle.ci.cli import main
from gdn2_oracle.ci.commands.bench import format_predictions
from gdn2_oracle.ci.running import cost_model as cost
from gdn2_oracle.kernels.pallas import SWEEP, TileConfig, make_kernel

TINY = (1, 128, 1, 128, 128)  # B, T, H, K, V: two chunks of 64, one head


def _toy_call(x, y):
    """grid (2, 3): o[i, j] = exp(x[i]) @ y + 2^4 x[i] (the doubling in a 4-trip fori_loop)."""

    def body(x_ref, y_ref, o_ref):
        x = x_ref[...]
        m = jnp.dot(jnp.exp(x), y_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = m + jax.lax.fori_loop(0, 4, lambda i, a: a * 2.0, x)

    return pl.pallas_call(
        body, grid=(2, 3),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, 0)), pl.BlockSpec((128, 128), lambda i, j: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((16, 384), jnp.float32), interpret=True)(x, y)


def test_counter_matches_hand_counts_of_a_toy_kernel():
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    y = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    (eqn,) = [e for e in jax.make_jaxpr(_toy_call)(x, y).jaxpr.eqns if e.primitive.name == "pallas_call"]
    c = cost.call_cost(eqn)
    blk, wblk = 8 * 128 * 4, 128 * 128 * 4
    assert c.grid == (2, 3)
    assert c.per_step.mxu_flops == {"float32": 2 * 8 * 128 * 128}
    assert c.per_step.transcendentals == 8 * 128
    assert c.per_step.vector_ops == 8 * 128 * (4 + 1)  # four doublings, one add
    assert c.per_step.loops == [("scan", 4)]
    assert c.per_step.depth == 4 + 1  # the loop's 4 steps, then the add (exp -> dot is shorter)
    assert c.hbm_read == 2 * blk + 1 * wblk  # x changes with i only, y never
    assert c.hbm_write == 6 * blk
    assert c.vmem_bytes == 2 * (2 * blk + wblk)
    assert c.total.mxu_flops["float32"] == 6 * 2 * 8 * 128 * 128


def _forward_call(cfg):
    fn = make_kernel(cfg.method, chunk_size=cfg.chunk_size, split=cfg.split, leaf=cfg.leaf, interpret=False)
    calls = cost.kernel_cost(fn, TINY, "float32")
    assert [c.name.startswith("gdn2_fwd") for c in calls] == [True, False]
    return calls[0]


@pytest.mark.parametrize("cfg", [TileConfig("factorized", 64, None, 16), TileConfig("pairwise", 64, None, 16)],
                         ids=lambda c: c.name)
def test_forward_kernel_matches_hand_counts(cfg):
    """Per chunk: score products (factorized levels, leaf placements), the WY merges, the five state
    products; exps: one per token per channel per level, the pairwise slabs, gamma and the decay to the end."""
    C, K, V, n = 64, 128, 128, cfg.leaf
    L = len(cfg.levels())
    merges = int(math.log2(n)) + L - 1  # the first (1 x 1) level needs no product
    flops = merges * 2 * 2 * C**3 + 3 * 2 * C * K * V + 2 * 2 * C * C * V
    exps = 2 * C * K + K
    if cfg.method == "factorized":
        flops += L * 2 * 2 * C * C * K + (C // n) * 2 * 2 * n * n * C
        exps += L * C * K + C * n * K
    else:
        exps += C * C * K
    fwd = _forward_call(cfg)
    assert fwd.grid == (1, 2)
    assert fwd.per_step.mxu_flops == {"float32": flops}
    assert fwd.per_step.transcendentals == exps


@pytest.mark.parametrize("cfg", SWEEP, ids=lambda c: c.name)
def test_pallas_kernels_have_no_loops(cfg):
    """No loop inside any pallas_call body of forward + backward: the chunk scan is the grid."""
    fn = make_kernel(cfg.method, chunk_size=cfg.chunk_size, split=cfg.split, leaf=cfg.leaf, interpret=False)
    s = cost.summary(cost.kernel_cost(fn, (1, 2 * cfg.chunk_size, 1, 128, 128), "float32"))
    assert s["loops"] == []
    assert 0 < s["depth_per_chunk"] < 8 * cfg.chunk_size


def test_roofline_is_the_slowest_unit_and_faster_chips_are_faster():
    calls = cost.kernel_cost(make_kernel("factorized", interpret=False), TINY, "float32")
    est = {name: cost.roofline(calls, chip) for name, chip in cost.CHIPS.items()}
    for t in est.values():
        assert t[t["bound"]] == max(t["mxu"], t["vpu"], t["eup"], t["hbm"])
        assert max(t["mxu"], t["vpu"], t["eup"], t["hbm"]) <= t["max"] <= t["serial"]
    assert est["v6e"]["max"] < est["v5e"]["max"] and est["v5p"]["max"] < est["v5e"]["max"]
    half = cost.summary(cost.kernel_cost(make_kernel("factorized", interpret=False), TINY, "bfloat16"))
    full = cost.summary(calls)
    assert half["hbm_read"] < full["hbm_read"]  # bf16 inputs move fewer bytes; in-kernel math stays f32
    assert half["mxu_flops"] == full["mxu_flops"]


def test_cost_command_prints_the_estimate_and_ratio(capsys):
    assert main(["cost", "--chip", "v6e", "--dtype", "float32", "--shape", "1,128,1,128,128"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE" in out and "v6e" in out
    assert "estimated factorized / pairwise (v6e, float32)" in out


@pytest.mark.parametrize("argv", [["--shape", "1,2,3"], ["--tiles", "chunk_size=48"], ["--dtype", "float16"],
                                  ["--chip", "v4"], ["--tiles", "depth=3"]])
def test_cost_command_rejects_bad_options(argv, capsys):
    assert main(["cost", *argv]) == 2
    assert "error" in capsys.readouterr().err


def test_estimate_rejects_unknown_chip():
    with pytest.raises(ValueError, match="chip"):
        cost.estimate("factorized", TINY, "float32", "v9")




# --- bench on a TPU prints the prediction beside the measurement -----------------------------

@pytest.mark.parametrize("kind, chip", [("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"), ("TPU v6 lite", "v6e"),
                                        ("cpu", None), ("NVIDIA H200", None)])
def test_chip_of_device_kind(kind, chip):
    assert cost.chip_of(kind) == chip


def test_bench_prediction_only_for_pallas_kernels_on_a_known_tpu():
    shape = (1, 128, 1, 128, 128)
    assert cost.prediction("pallas-factorized", {}, shape, "float32", "cpu") is None
    assert cost.prediction("factorized", {}, shape, "float32", "TPU v6 lite") is None
    p = cost.prediction("pallas-factorized", {"interpret": "xla"}, shape, "float32", "TPU v6 lite")
    e = cost.estimate("factorized", shape, "float32", "v6e")
    assert p == {"chip": "v6e", "seconds": e["seconds"]["max"], "bound": e["seconds"]["bound"]}


def test_bench_report_shows_prediction_beside_measurement():
    shape = dict(B=1, T=128, H=1, K=128, V=128)
    pred = {"chip": "v6e", "seconds": 2e-3, "bound": "vpu"}
    results = [{"kernel": "pallas-factorized", "status": "ok", "shape": shape, "dtype": "float32",
                "median_s": 5e-3, "prediction": pred},
               {"kernel": "pairwise", "status": "ok", "shape": shape, "dtype": "float32", "median_s": 1e-3,
                "prediction": None}]
    lines = format_predictions(results)
    assert len(lines) == 3 and "ESTIMATE" in lines[1]
    assert "pallas-factorized B1 T128 H1 K128 V128 float32 on v6e: predicted 2.00 ms (vpu-bound), " \
           "measured 5.00 ms = 2.50x the estimate" in lines[2]
    assert format_predictions(results[1:]) == []


@pytest.mark.parametrize("argv, needle", [
    (["--tiles", "chunk_size=64,chunk_size=128"], "'chunk_size' is given twice"),
    (["--tiles", "chunk_size=64,128"], "chunk_size: expected one value"),
    (["--dtype", ""], "expected a comma-separated list"),
])
def test_cost_usage_errors(capsys, argv, needle):
    assert main(["cost", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_one_tiles_grammar_for_bench_and_cost():
    """``key=v1,v2;key2=v3`` and ``key=v1,v2,key2=v3`` are the same grid; a repeated key is an error."""
    from gdn2_oracle.ci.commands.args import tiles
    from gdn2_oracle.ci.commands.cost import parse_tiles

    assert tiles("chunk_size=32,64;leaf=8") == tiles("chunk_size=32,64,leaf=8") == {"chunk_size": [32, 64],
                                                                                   "leaf": [8]}
    assert parse_tiles("chunk_size=128,leaf=32,split=none") == {"chunk_size": 128, "leaf": 32, "split": None}
    with pytest.raises(Exception, match="given twice"):
        tiles("leaf=8;leaf=16")
