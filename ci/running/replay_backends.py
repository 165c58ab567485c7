"""Replay backends: one call's :class:`oracle.replay_slots.CallPlan` run on a replay kernel's own storage.

A backend (what ``ci/running/drivers.py: ReplayDriver`` drives) has ``capacity``, ``state_dtype``, ``family``,
``setup(slots, HV, H, K, V, window)``, ``run(plan, call, dtype) -> o`` and ``state(p, ahead)``: the ``[HV, K, V]``
state replay slot p encodes ``ahead`` tokens past its cursor, folded in float64 from what the kernel stores
(``oracle.replay.fold``): the checkpoint and the ring entries its cursors say are live.

:class:`JaxReplayBackend` runs our JAX replay kernel (``kernels/replay_decode.py``): decode rows as single-token steps
with the caller's ``write_pos`` (tokens since the slot's load, modulo the ring), verify windows through ``spec_decode``
after ``commit`` (the accepted tokens of the window read) and ``load`` + ``reset`` (a prefill's hand-off).
"""

from __future__ import annotations

import numpy as np

from gdn2_oracle.oracle.replay import fold
from gdn2_oracle.oracle.replay_slots import NULL_SLOT

from .harness import host_cast

FAMILY = "gdn"  # the replay kernels' family: one log-decay and one beta per value head and token
HOST_FIELDS = ("checkpoint", "d", "k", "g", "write_pos", "cache_base", "is_flush")  # what ``state`` reads


def gdn_inputs(call, dtype):
    """``(q, k, v, g, beta)`` of a session call in the gdn family's signature, NumPy in ``dtype`` (exact)."""
    fam = call.family_inputs(FAMILY)
    return tuple(host_cast(fam[n], dtype) for n in ("q", "k", "v", "g", "beta"))


def encode(checkpoint, d, k, g, base, n):
    """The float64 ``[HV, K, V]`` state of one slot from a kernel's storage: ``checkpoint [HV, V, K]``, ``d [HV, buf,
    V]``, ``k [H, buf, K]``, ``g [HV, buf]`` (one log-decay per value head), ``n`` entries from ring position
    ``base``."""
    f = [np.asarray(x).astype(np.float64) for x in (checkpoint, d, k, g)]
    C, dd, kk, gg = np.swapaxes(f[0], -1, -2), f[1], f[2], f[3]
    return fold(C, dd, kk, np.broadcast_to(gg[..., None], gg.shape + (kk.shape[-1],)), base, n)


class Traffic:
    """Bytes of state storage a kernel reads and writes over a session, and the live tokens it ran: what a kernel's
    representation touches per token, counted from its cursors as it runs (the state-traffic figure, docs/drivers.md).
    A replay token reads the checkpoint and its ring's valid entries and writes one entry, or the checkpoint on a
    flush; a pool call reads a sequence's slot once and writes each slot it stores (``ci/running/drivers.py``)."""

    def __init__(self):
        self.read = self.written = self.tokens = 0

    def per_token(self):
        """``(read, written)`` bytes per live token."""
        return (self.read / self.tokens, self.written / self.tokens) if self.tokens else (0.0, 0.0)


def nbytes(dtype):
    return np.dtype(dtype).itemsize if dtype != "bfloat16" else 2


def coarser(*dtypes):
    """The coarsest of some storage dtypes (float32, float16, bfloat16): the one whose rounding bounds a grade."""
    order = ("float32", "float16", "bfloat16")
    return max(dtypes, key=order.index)


class JaxReplayBackend:
    """Our JAX replay kernel (``kernel``: a ``kernels.replay_kernel.ReplayKernel``) as a backend."""

    family = FAMILY

    def __init__(self, kernel):
        self.kernel = kernel
        self.ops = kernel.ops
        self.name = kernel.__name__
        self.capacity = int(kernel.capacity)
        self.storage = (kernel.state_dtype, kernel.cache_dtype)  # (checkpoint, d and k caches)
        self.state_dtype = coarser(*self.storage)
        self.cache = None
        self._host_of = self._host_arrays = None
        self.traffic = Traffic()

    def setup(self, slots, HV, H, K, V, window):
        self.window = int(window)
        self.cache = self.ops.new_cache(slots, H, HV, K, V, self.capacity, max_spec_len=self.window,
                                        state_dtype=self.storage[0], cache_dtype=self.storage[1])
        self.decoded = np.zeros(slots, np.int64)  # decode tokens since the slot's load (the caller's write_pos)
        self.verified = np.zeros(slots, bool)  # a verify window ran since the slot's last commit
        self.windowed = np.zeros(slots, bool)  # the slot runs verify windows (cursors kept by the kernel)
        sb, cb = (nbytes(x) for x in self.storage)
        self.entry_bytes = HV * V * cb + H * K * cb + HV * 4  # d, k (once per key head), g (float32)
        self.checkpoint_bytes = HV * K * V * sb

    def _limits(self):
        return {"max_cache_len": self.capacity, "max_spec_len": self.window}

    def run(self, plan, call, dtype):
        q, k, v, g, beta = gdn_inputs(call, dtype)
        B, T, HV, V = v.shape
        o = np.zeros((B, T, HV, V), v.dtype)
        mutant = self.kernel.options
        live = [r for r in plan.rows if r.slot != NULL_SLOT and r.length > 0]
        spec = bool(plan.rows) and plan.rows[0].window
        if plan.commits:
            slots, acc = (np.array(x, np.int32) for x in zip(*plan.commits))
            self.cache = self.ops.commit(self.cache, acc, slots, **self._limits(), **mutant)
            self.verified[slots] = False
        if plan.loads:
            slots = np.array([p for p, _ in plan.loads], np.int32)
            states = np.stack([np.swapaxes(S, -1, -2) for _, S in plan.loads])
            self.cache = self.ops.load(self.cache, slots, states.astype(np.float32))
            self.decoded[slots], self.verified[slots] = 0, False
            self.windowed[slots] = spec
            if spec:
                self.cache = self.ops.reset(self.cache, slots, **self._limits())
        if spec:
            S = self.window
            win = [np.zeros((len(plan.rows), S) + x.shape[2:], x.dtype) for x in (q, k, v, g, beta)]
            for i, r in enumerate(plan.rows):
                for w, x in zip(win, (q, k, v, g, beta)):
                    w[i, :r.length] = x[r.row, r.start:r.start + r.length]
            slots = np.array([r.slot for r in plan.rows], np.int32)
            lengths = np.array([max(r.length, 1) for r in plan.rows], np.int32)
            out, self.cache = self.ops.spec_decode(*win, self.cache, slots, lengths, scale=call.scale,
                                                   **self._limits(), **mutant)
            out = np.asarray(out)
            for i, r in enumerate(plan.rows):
                o[r.row, r.start:r.start + r.length] = out[i, :r.length]
            self.verified[[r.slot for r in live]] = True
            self._count_windows(live)
            return o
        rows = list(plan.rows)
        for t in range(max((r.length for r in rows), default=0)):
            step = [r for r in rows if r.length > t]
            slots = np.array([r.slot for r in step], np.int32)
            xs = [np.stack([x[r.row, r.start + t] for r in step]) for x in (q, k, v, g, beta)]
            wp = np.array([self.decoded[r.slot] % self.capacity if r.slot != NULL_SLOT else 0 for r in step],
                          np.int32)
            out, self.cache = self.ops.recurrent_step(*xs, self.cache, slots, wp, capacity=self.capacity,
                                                      scale=call.scale, **mutant)
            out = np.asarray(out)
            for i, r in enumerate(step):
                o[r.row, r.start + t] = out[i]
                if r.slot != NULL_SLOT:
                    n = int(wp[i])
                    self.traffic.read += self.checkpoint_bytes + n * self.entry_bytes
                    self.traffic.written += self.checkpoint_bytes if n == self.capacity - 1 else self.entry_bytes
                    self.traffic.tokens += 1
                    self.decoded[r.slot] += 1
        return o

    def _count_windows(self, live):
        """Traffic of the verify windows just run: the checkpoint and the committed entries read (and the checkpoint
        written, on a slot that flushed), the window's entries written."""
        c = self.cache
        for r in live:
            wp, flush = int(np.asarray(c.write_pos)[r.slot]), int(np.asarray(c.is_flush)[r.slot])
            self.traffic.read += self.checkpoint_bytes + wp * self.entry_bytes
            self.traffic.written += r.length * self.entry_bytes + (self.checkpoint_bytes if flush else 0)
            self.traffic.tokens += r.length

    def _host(self):
        """The cache's arrays on the host, copied once per cache the kernel returned (``state`` reads many slots)."""
        if self._host_of is not self.cache:
            c = self.cache
            self._host_of = c
            self._host_arrays = {n: np.asarray(getattr(c, n)) for n in HOST_FIELDS}
        return self._host_arrays

    def state(self, p, ahead):
        c = self._host()
        raw = [c[n][p] for n in ("checkpoint", "d", "k", "g")]
        if not self.windowed[p]:
            return encode(*raw, 0, self.decoded[p] % self.capacity + ahead)
        wp, base = int(c["write_pos"][p]), int(c["cache_base"][p])
        if self.verified[p] and int(c["is_flush"][p]):  # the window's flush folded the history already
            return encode(*raw, base + wp, ahead)
        return encode(*raw, base, wp + ahead)


def backend(fn):
    """The replay backend of kernel ``fn`` (its ``session_driver`` is ``"replay"``): our JAX replay kernel's."""
    if hasattr(fn, "ops") and hasattr(fn, "capacity"):
        return JaxReplayBackend(fn)
    from .replayssm_backend import VllmReplayBackend, drives  # torch is imported only when such a kernel runs
    if drives(fn):
        return VllmReplayBackend(fn)
    from . import sglang_replay_backend as sglang
    if sglang.drives(fn):
        return sglang.SglangReplayBackend(fn)
    raise ValueError(f"kernel: {getattr(fn, '__name__', fn)!r} says it is a replay kernel but has no replay backend")
