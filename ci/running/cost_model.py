"""``gdn2-oracle cost``: operation counts of a kernel's own traced program and a roofline TPU time ESTIMATE.

The counter walks ``jax.make_jaxpr`` of forward + VJP, finds every ``pallas_call`` and walks its body
jaxpr (recursing into ``jit``/``cond``/``scan`` bodies; a ``scan`` multiplies its body by its length).
Per grid step (= per chunk of one head) it counts MXU FLOPs by operand dtype (``dot_general``:
``2 * output size * contracted size``), vector element operations (every other arithmetic, compare,
select, convert or iota: its output size; a reduction: its input size), transcendentals (``exp`` and
kin) separately, and the sequential dependent steps (the longest chain of counted operations through
values and refs). From the grid and block specs: HBM bytes read and written (a block is fetched again
only when its block index changes along the grid) and the VMEM held by double-buffered blocks plus
scratch. :data:`CHIPS` turns counts into a roofline estimate (docs/DESIGN.md §8 gives each figure's
source); it is an estimate, not a measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "erf",
                            "erf_inv", "sqrt", "rsqrt", "cbrt", "pow", "atan2"})
# Data movement and bookkeeping: no ALU work (their dependence still propagates).
MOVES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "slice", "dynamic_slice",
                   "dynamic_update_slice", "concatenate", "transpose", "get", "swap", "program_id",
                   "num_programs", "copy", "copy_p", "pad", "rev", "gather"})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "argmax", "argmin", "cumsum", "cumprod", "cummax", "cumlogsumexp"})
WRITES = frozenset({"swap", "addupdate"})
# XLA's HIGHEST precision runs a float32 matmul as 6 bf16 MXU passes (docs/DESIGN.md §8).
F32_MXU_PASSES = 6


@dataclass
class Counts:
    """Operation counts of one program region."""

    mxu_flops: dict = field(default_factory=dict)  # operand dtype name -> FLOPs
    vector_ops: float = 0.0
    transcendentals: float = 0.0
    depth: float = 0.0  # sequential dependent steps
    loops: list = field(default_factory=list)  # (primitive, trip count or None)

    def add(self, other: Counts, times: float = 1.0) -> None:
        """Accumulate ``times`` copies of ``other`` (its work only; depth is handled by the walker)."""
        for k, v in other.mxu_flops.items():
            self.mxu_flops[k] = self.mxu_flops.get(k, 0.0) + times * v
        self.vector_ops += times * other.vector_ops
        self.transcendentals += times * other.transcendentals
        self.loops.extend(other.loops)

    @property
    def flops(self) -> float:
        return float(sum(self.mxu_flops.values()))

    def scaled(self, times: float) -> Counts:
        out = Counts(depth=self.depth * times, loops=list(self.loops))
        out.add(Counts(dict(self.mxu_flops), self.vector_ops, self.transcendentals), times)
        return out


def _size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ())))


def inner_jaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(x, jcore.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jcore.Jaxpr):
                yield x


def _dot_flops(eqn) -> float:
    (lc, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    contracted = math.prod(lhs.shape[d] for d in lc)
    return 2.0 * _size(eqn.outvars[0].aval) * contracted


def count_jaxpr(jaxpr, in_depth=None) -> Counts:
    """Counts of one jaxpr (inputs at depth ``in_depth`` or 0); refs carry the depth of their last write."""
    depth = {}
    for v, d in zip(jaxpr.invars, in_depth or [0.0] * len(jaxpr.invars)):
        depth[v] = d
    out = Counts()

    def d_of(v):
        return 0.0 if isinstance(v, jcore.Literal) else depth.get(v, 0.0)

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        d_in = max((d_of(v) for v in eqn.invars), default=0.0)
        step = 1.0
        if name == "dot_general":
            key = jnp.dtype(eqn.invars[0].aval.dtype).name
            out.mxu_flops[key] = out.mxu_flops.get(key, 0.0) + _dot_flops(eqn)
        elif name in TRANSCENDENTAL:
            out.transcendentals += _size(eqn.outvars[0].aval)
        elif name in REDUCTIONS:
            out.vector_ops += _size(eqn.invars[0].aval)
        elif name == "scan":
            body = count_jaxpr(eqn.params["jaxpr"].jaxpr)
            n = int(eqn.params["length"])
            out.add(body, n)
            out.loops.append(("scan", n))
            step = body.depth * n
        elif name == "while":
            body = count_jaxpr(eqn.params["body_jaxpr"].jaxpr)
            out.add(body)
            out.loops.append(("while", None))
            step = body.depth
        elif name == "cond":
            branches = [count_jaxpr(b.jaxpr) for b in eqn.params["branches"]]
            worst = max(branches, key=lambda c: (c.flops, c.vector_ops, c.transcendentals))
            out.add(worst)
            step = max(b.depth for b in branches)
        elif name == "pallas_call":
            raise ValueError("count_jaxpr: nested pallas_call; use kernel_cost for a program with kernels")
        elif any(True for _ in inner_jaxprs(eqn)):  # jit, custom_jvp/vjp, closed_call, ...
            inner = next(inner_jaxprs(eqn))
            body = count_jaxpr(inner)
            out.add(body)
            step = body.depth
        elif name in MOVES:
            step = 0.0
        else:
            out.vector_ops += sum(_size(v.aval) for v in eqn.outvars)
        d = d_in + step
        for v in eqn.outvars:
            depth[v] = d
        if name in WRITES:  # a ref write orders later reads of that ref after it
            ref = eqn.invars[0]
            depth[ref] = max(d_of(ref), d)
        out.depth = max(out.depth, d)
    return out


@dataclass
class CallCost:
    """One ``pallas_call``: counts per grid step, the grid and its HBM/VMEM traffic."""

    name: str
    grid: tuple
    per_step: Counts
    hbm_read: float
    hbm_write: float
    vmem_bytes: int

    @property
    def steps(self) -> int:
        return int(math.prod(self.grid))

    @property
    def total(self) -> Counts:
        return self.per_step.scaled(self.steps)


def _block_bytes(bm) -> int:
    aval = bm.block_aval
    aval = getattr(aval, "inner_aval", aval)
    return _size(aval) * jnp.dtype(aval.dtype).itemsize


def _fetches(bm, grid) -> int:
    """Times a block is moved: once per change of its block index along the (row-major) grid."""
    closed = bm.index_map_jaxpr

    def index(point):
        return tuple(int(x) for x in jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *point))

    base = index((0,) * len(grid))
    inner = -1
    for a, n in enumerate(grid):
        if n > 1:
            point = [0] * len(grid)
            point[a] = 1
            if index(tuple(point)) != base:
                inner = a
    return int(math.prod(grid[:inner + 1])) if inner >= 0 else 1


def call_cost(eqn) -> CallCost:
    """Counts, HBM traffic and VMEM of one ``pallas_call`` equation."""
    gm = eqn.params["grid_mapping"]
    grid = tuple(int(g) for g in gm.grid)
    per_step = count_jaxpr(eqn.params["jaxpr"])
    n_in = gm.num_inputs
    bms = list(gm.block_mappings)
    read = sum(_block_bytes(b) * _fetches(b, grid) for b in bms[:n_in])
    write = sum(_block_bytes(b) * _fetches(b, grid) for b in bms[n_in:])
    scratch = sum(_size(a) * jnp.dtype(a.dtype).itemsize
                  for a in (getattr(s, "inner_aval", s) for s in gm.scratch_avals))
    vmem = 2 * sum(_block_bytes(b) for b in bms) + scratch
    return CallCost(str(eqn.params.get("name") or getattr(eqn.params.get("metadata"), "name", "pallas_call")),
                    grid, per_step, float(read), float(write), int(vmem))


def _pallas_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        else:
            for inner in inner_jaxprs(eqn):
                yield from _pallas_eqns(inner)


def fwd_bwd_jaxpr(fn, shape, dtype):
    """``jax.make_jaxpr`` of forward + VJP of a kernel at ``shape = (B, T, H, K, V)`` (abstract inputs)."""
    B, T, H, K, V = shape
    dt = jnp.dtype(dtype)
    kx, vx = jax.ShapeDtypeStruct((B, T, H, K), dt), jax.ShapeDtypeStruct((B, T, H, V), dt)
    s0 = jax.ShapeDtypeStruct((B, H, K, V), jnp.float32)

    def fwd_bwd(q, k, v, g, b, w, h0, do, dfs):
        def f(q, k, v, g, b, w, h0):
            return fn(q, k, v, g, b, w, initial_state=h0)

        out, vjp = jax.vjp(f, q, k, v, g, b, w, h0)
        return out, vjp((do, dfs))

    return jax.make_jaxpr(fwd_bwd)(kx, kx, vx, kx, kx, vx, s0, vx, s0)


def kernel_cost(fn, shape, dtype) -> list[CallCost]:
    """The cost of every ``pallas_call`` in forward + backward of ``fn`` at ``shape``."""
    calls = [call_cost(e) for e in _pallas_eqns(fwd_bwd_jaxpr(fn, shape, dtype).jaxpr)]
    if not calls:
        raise ValueError("kernel: no pallas_call in its forward + backward program (a pure-JAX kernel? "
                         "use count_jaxpr on fwd_bwd_jaxpr)")
    return calls


@dataclass(frozen=True)
class Chip:
    """Published (or derived, see docs/DESIGN.md §8) per-chip figures of one TPU generation."""

    name: str
    bf16_flops: float  # peak dense bf16 MXU FLOP/s per chip
    hbm_bytes: float  # HBM bandwidth, bytes/s per chip
    cores: int  # TensorCores per chip (the "parallel" grid axis is split across them)
    clock_hz: float  # derived: bf16 peak / (MXU MACs per cycle * 2)
    vpu_ops_per_cycle: float = 8 * 128 * 2  # per core: one (8, 128) vreg on each of 2 VALU slots (assumed)
    eup_ops_per_cycle: float = 8 * 128  # per core: one (8, 128) vreg of transcendentals (assumed)

    @property
    def f32_flops(self) -> float:
        return self.bf16_flops / F32_MXU_PASSES

    @property
    def vector_rate(self) -> float:
        return self.cores * self.vpu_ops_per_cycle * self.clock_hz

    @property
    def transcendental_rate(self) -> float:
        return self.cores * self.eup_ops_per_cycle * self.clock_hz


CHIPS = {
    # clock = peak / (2 * MXUs * MXU MACs): v5e 4 x 128^2 per core, v5p 2 cores x 4 x 128^2, v6e 2 x 256^2.
    "v5e": Chip("v5e", 197e12, 819e9, 1, 197e12 / (2 * 4 * 128 * 128)),
    "v5p": Chip("v5p", 459e12, 2765e9, 2, 459e12 / (2 * 2 * 4 * 128 * 128)),
    "v6e": Chip("v6e", 918e12, 1640e9, 1, 918e12 / (2 * 2 * 256 * 256)),
}


def roofline(calls: list[CallCost], chip: Chip) -> dict:
    """ESTIMATED seconds per unit and in total: ``max`` over MXU, VPU, EUP and HBM (perfect overlap),
    ``serial`` their sum (no overlap), summed over the calls."""
    t = dict(mxu=0.0, vpu=0.0, eup=0.0, hbm=0.0, max=0.0, serial=0.0)
    for c in calls:
        tot = c.total
        parts = dict(
            mxu=sum(f / (chip.f32_flops if k == "float32" else chip.bf16_flops) for k, f in tot.mxu_flops.items()),
            vpu=tot.vector_ops / chip.vector_rate,
            eup=tot.transcendentals / chip.transcendental_rate,
            hbm=(c.hbm_read + c.hbm_write) / chip.hbm_bytes)
        for k, v in parts.items():
            t[k] += v
        t["max"] += max(parts.values())
        t["serial"] += sum(parts.values())
    t["bound"] = max(("mxu", "vpu", "eup", "hbm"), key=lambda k: t[k])
    return t


def summary(calls: list[CallCost]) -> dict:
    """Per-chunk and total counts of forward + backward, summed over the calls."""
    per = Counts()
    tot = Counts()
    depth = 0.0
    chain = 0.0
    for c in calls:
        per.add(c.per_step)
        tot.add(c.total)
        depth += c.per_step.depth
        chain += c.per_step.depth * c.grid[-1]
    return dict(mxu_flops_per_chunk=dict(per.mxu_flops), vector_ops_per_chunk=per.vector_ops,
                transcendentals_per_chunk=per.transcendentals, depth_per_chunk=depth,
                mxu_flops=dict(tot.mxu_flops), vector_ops=tot.vector_ops, transcendentals=tot.transcendentals,
                sequential_steps=chain, hbm_read=sum(c.hbm_read for c in calls),
                hbm_write=sum(c.hbm_write for c in calls), vmem_bytes=max(c.vmem_bytes for c in calls),
                loops=[lp for c in calls for lp in c.per_step.loops])


def pallas_fn(method: str, tiles: dict | None = None):
    """The Pallas kernel of ``method`` built for TPU (Mosaic) with tile options ``tiles``."""
    from gdn2_oracle.kernels.pallas import make_kernel

    return make_kernel(method, interpret=False, **(tiles or {}))


def estimate(method: str, shape, dtype, chip: str, tiles: dict | None = None) -> dict:
    """Counts and the roofline ESTIMATE of one Pallas kernel configuration on ``chip``."""
    if chip not in CHIPS:
        raise ValueError(f"chip: {chip!r} not one of {tuple(CHIPS)}")
    calls = kernel_cost(pallas_fn(method, tiles), shape, dtype)
    return dict(method=method, tiles=dict(tiles or {}), shape=tuple(shape), dtype=jnp.dtype(dtype).name, chip=chip,
                counts=summary(calls), seconds=roofline(calls, CHIPS[chip]))


# jax.Device.device_kind of each chip (the "lite" parts are the "e" chips).
DEVICE_KINDS = {"TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5p": "v5p", "TPU v5": "v5p",
                "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def chip_of(device_kind: str) -> str | None:
    """The chip of CHIPS a ``jax.Device.device_kind`` names, or None (not a TPU we have figures for)."""
    return DEVICE_KINDS.get(str(device_kind).strip())


def prediction(kernel: str, options: dict, shape, dtype, device_kind: str) -> dict | None:
    """The roofline ESTIMATE of forward + backward for a ``pallas-*`` kernel on the TPU ``device_kind``
    names (``{"chip", "seconds"}``), or None for other kernels and devices: what ``bench`` prints
    beside its measurement."""
    chip = chip_of(device_kind)
    if chip is None or not kernel.startswith("pallas-"):
        return None
    tiles = {k: v for k, v in (options or {}).items() if k != "interpret"}
    e = estimate(kernel.removeprefix("pallas-"), shape, dtype, chip, tiles)
    return {"chip": chip, "seconds": e["seconds"]["max"], "bound": e["seconds"]["bound"]}
