"""Tile configuration of the Pallas GDN-2 kernels, the recursion tree it implies, and VMEM budgets.

A :class:`TileConfig` fixes everything static about one kernel build:

* ``method``: ``"pairwise"`` (one ``exp`` per token pair per key channel for the whole
  ``chunk_size x chunk_size`` score tile, the baseline) or ``"factorized"`` (boundary factorization:
  cross-block tiles are one MXU product ``(X*exp(G_r-G_m)) @ (K*exp(G_m-G_s))^T``, recursively,
  and only the ``leaf x leaf`` diagonal tiles stay pairwise);
* ``chunk_size``: tokens per chunk (64, 128 or 256; the pure-JAX kernels' option name);
* ``split``: the top-level boundary, i.e. the number of tokens in the earlier block
  (``None``: ``chunk_size // 2``; lower levels split their block at the middle, rounded to ``leaf``);
* ``leaf``: the recursion stops at blocks of ``leaf`` tokens (8, 16 or 32). The same tree, continued
  dyadically inside the leaves down to single tokens, drives the WY inverse in both methods
  (matmul-only block merges, wy.py).

``SWEEP`` lists the configurations the benchmark sweeps; ``vmem_footprint`` estimates the VMEM a
configuration needs from its block shapes (double-buffered inputs/outputs, scratch, live temporaries).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..contract import CHUNK_SIZE

METHODS = ("pairwise", "factorized")
CHUNKS = (64, 128, 256)
LEAVES = (8, 16, 32)
LANE = 128
SUBLANE = 8

MIB = 1 << 20
# Scoped VMEM a Mosaic kernel gets without asking (v4/v5e default) and the physical VMEM of a
# v5e/v6e TensorCore (v5p/v4: 95/32 MiB on some chips; 128 MiB is the upper budget here).
DEFAULT_SCOPED_VMEM = 16 * MIB
VMEM_BUDGET = 128 * MIB
# Float32 bytes of one [rows, keys, K] pairwise decay slab of the score pass (score.pair_tiles).
SLAB_BYTES = 512 * 1024
# Slab-sized values live at once in the score pass (decay, decayed keys, products, reduction input).
LIVE_SLABS = 4


@dataclass(frozen=True)
class TileConfig:
    """Static tiling of one Pallas GDN-2 kernel build (validated on construction)."""

    method: str = "factorized"
    chunk_size: int = CHUNK_SIZE
    split: int | None = None
    leaf: int = 16

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method: {self.method!r} not one of {METHODS}")
        if not _is_int(self.chunk_size) or self.chunk_size not in CHUNKS:
            raise ValueError(f"chunk_size: {self.chunk_size!r} not one of {CHUNKS}")
        if not _is_int(self.leaf) or self.leaf not in LEAVES:
            raise ValueError(f"leaf: {self.leaf!r} not one of {LEAVES}")
        if self.leaf >= self.chunk_size:
            raise ValueError(f"leaf: {self.leaf} must be smaller than chunk_size {self.chunk_size}")
        if self.split is not None:
            if not _is_int(self.split):
                raise ValueError(f"split: expected an int or None, got {self.split!r}")
            if not 0 < self.split < self.chunk_size:
                raise ValueError(f"split: {self.split} must lie strictly inside the chunk "
                                 f"(0 < split < chunk_size = {self.chunk_size})")
            if self.split % self.leaf:
                raise ValueError(f"split: {self.split} must be a multiple of leaf {self.leaf}")

    @property
    def boundary(self) -> int:
        """Tokens in the earlier block of the top-level split."""
        return self.chunk_size // 2 if self.split is None else int(self.split)

    @property
    def name(self) -> str:
        s = "" if self.split is None else f"-s{self.split}"
        return f"{self.method}-c{self.chunk_size}{s}-l{self.leaf}"

    def replace(self, **changes) -> TileConfig:
        return dataclasses.replace(self, **changes)

    def levels(self):
        """The split tree as levels, deepest first: ``[[(lo, m, hi), ...], ...]``.

        A block ``[lo, hi)`` longer than ``leaf`` is split at ``m`` into ``[lo, m)`` (earlier,
        anchor token ``m - 1``) and ``[m, hi)`` (later). Leaves are exactly ``leaf`` tokens long.
        """
        by_depth = {}

        def walk(lo, hi, depth, m=None):
            n = hi - lo
            if n <= self.leaf:
                return
            if m is None:
                half = (n // self.leaf + 1) // 2
                m = lo + half * self.leaf
            by_depth.setdefault(depth, []).append((lo, m, hi))
            walk(lo, m, depth + 1)
            walk(m, hi, depth + 1)

        walk(0, self.chunk_size, 0, self.boundary)
        return [by_depth[d] for d in sorted(by_depth, reverse=True)]


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


# The configurations the benchmark sweeps (and the lowering test exports for TPU).
SWEEP = (
    TileConfig("pairwise", 64, None, 16),
    TileConfig("pairwise", 128, None, 16),
    TileConfig("factorized", 64, None, 16),
    TileConfig("factorized", 64, None, 8),
    TileConfig("factorized", 64, 16, 16),
    TileConfig("factorized", 128, None, 16),
    TileConfig("factorized", 128, None, 32),
    TileConfig("factorized", 256, None, 32),
)


def pad_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _tile_bytes(rows, cols, itemsize):
    """VMEM bytes of a 2-D buffer padded to the native tile ((8*4/itemsize) x 128)."""
    sub = SUBLANE * (4 // itemsize)
    return pad_to(max(rows, 1), sub) * pad_to(max(cols, 1), LANE) * itemsize


def slab_rows(cfg: TileConfig, K: int) -> int:
    """Rows per pairwise decay slab: a leaf (factorized) or as many as fit ``SLAB_BYTES`` (pairwise)."""
    if cfg.method == "factorized":
        return cfg.leaf
    return max(1, min(cfg.chunk_size, SLAB_BYTES // (4 * cfg.chunk_size * K)))


def pair_slab_bytes(cfg: TileConfig, K: int) -> int:
    """VMEM bytes of one ``[rows, keys, K]`` float32 decay slab (keys: a leaf or the chunk), tile-padded."""
    keys = cfg.leaf if cfg.method == "factorized" else cfg.chunk_size
    return slab_rows(cfg, K) * _tile_bytes(keys, K, 4)


def vmem_footprint(cfg: TileConfig, K=128, V=128, in_itemsize=4, *, backward=False):
    """Estimated VMEM bytes of one kernel instance: ``{"inputs", "outputs", "scratch", "temporaries", "total"}``.

    Blocks are padded to TPU tiles; pipelined inputs and outputs count twice (double buffering).
    ``temporaries`` is a conservative allowance for values the compiler keeps live in VMEM
    (score, WY and gate tiles, ``LIVE_SLABS`` pairwise decay slabs). ``K``/``V`` are the (padded) key/value widths.
    """
    C = cfg.chunk_size
    Kp, Vp = pad_to(K, LANE), pad_to(V, LANE)
    isz = in_itemsize
    ck_in = _tile_bytes(C, Kp, isz)
    cv_in = _tile_bytes(C, Vp, isz)
    ck32 = _tile_bytes(C, Kp, 4)
    cv32 = _tile_bytes(C, Vp, 4)
    cc32 = _tile_bytes(C, C, 4)
    kv32 = _tile_bytes(Kp, Vp, 4)
    slabs = LIVE_SLABS * pair_slab_bytes(cfg, Kp)
    if not backward:
        # q, k, b (input dtype), G (f32) ; v, w ; h0 state
        inputs = 3 * ck_in + ck32 + 2 * cv_in + kv32
        # o (input dtype), per-chunk state, final state
        outputs = cv_in + 2 * kv32
        # S carry ; q32, k32, bk32 ; Mq, Mbk
        scratch = kv32 + 3 * ck32 + 2 * cc32
        temporaries = 8 * ck32 + 4 * cv32 + 4 * cc32 + slabs
    else:
        # q, k, b, G ; v, w, dO ; entering state, dfinal
        inputs = 3 * ck_in + ck32 + 3 * cv_in + 2 * kv32
        # dq, dk, db, dG (f32) ; dv, dw (f32) ; dh0
        outputs = 4 * ck32 + 2 * cv32 + kv32
        # dS carry ; q32, k32, bk32 ; Mq, Mbk, 4 score cotangents ; 3 score-side accumulators
        scratch = kv32 + 3 * ck32 + 6 * cc32 + 3 * ck32
        temporaries = 16 * ck32 + 8 * cv32 + 8 * cc32 + 2 * kv32 + slabs
    inputs *= 2
    outputs *= 2
    total = inputs + outputs + scratch + temporaries
    return dict(inputs=inputs, outputs=outputs, scratch=scratch, temporaries=temporaries, total=total)


def vmem_limit_bytes(cfg: TileConfig, K=128, V=128, in_itemsize=4, *, backward=False) -> int:
    """The ``vmem_limit_bytes`` to request: 2x the estimate, at least 16 MiB, at most 100 MiB."""
    need = vmem_footprint(cfg, K, V, in_itemsize, backward=backward)["total"]
    return int(min(max(2 * need, DEFAULT_SCOPED_VMEM), 100 * MIB))
