"""vLLM's ReplaySSM functions, found by name (``kernels/replayssm.py``), as a replay backend (docs/drivers.md).

:class:`VllmReplayBackend` has the interface of ``replay_backends.JaxReplayBackend`` (``ci/running/drivers.py``'s
``ReplayDriver`` drives it) and calls the kernel object's four functions with vLLM's arguments, on torch tensors it
allocates as vLLM's cache pages are:

* the one-token path: checkpoint ``[slots, HV, V, K]`` in ``state_dtype``, rings ``d [slots, HV, L, V]``, ``k
  [slots, H, L, K]`` (``cache_dtype``), ``g [slots, HV, L]`` float32 with ``L = capacity``;
* the window path (sessions with verify windows): checkpoint float32 (vLLM forces it), rings of ``buf =
  next_pow2(capacity)`` entries, the per-slot cursors ``write_pos``, ``cache_base`` (int32) and ``is_flush`` (int8);
  ``max_cache_len = capacity``, ``max_spec_len`` the kernel's ``spec_len`` or the session's longest window if longer.

Each call's tokens go in packed (``mixed_qkv [tokens, 2 H K + HV V]``, q | k | v in the session's input dtype) with
raw gates: ``A_log = 0`` and ``dt_bias = 0`` per value head, ``a = log(expm1(-g))`` (the inverse of softplus, so
``-softplus(a) = g``) and ``b = logit(beta)``, both computed in float64 from the session's values and passed as
float32: one float32 rounding of ``a`` and ``b``, which the kernel's float32 softplus and sigmoid turn into errors of
a few float32 ulps in ``g`` and ``beta``, inside the judge's float32 tolerance. ``use_qk_l2norm_in_kernel=False``:
the sessions' q and k are the kernel's inputs as they are. Padding rows (and empty sequences) get slot 0, vLLM's
null block; replay slots start at 1.

Per call, in vLLM's order: ``commit_gdn_replayssm_spec`` with the plan's commits (a row continuing on a slot whose
last window was not committed commits 0 tokens, as vLLM commits every row), the loads (the prefill hand-off:
``checkpoint[slot] = state``, layout ``[HV, V, K]``; on the window path also ``reset_gdn_replayssm_spec_cursors`` for
those slots), then either ``gdn_replayssm_spec_decode`` on the rows' windows (``query_start_loc`` from their lengths)
or, one token per row per launch, ``fused_recurrent_gated_delta_rule_replayssm`` with ``write_pos`` = the tokens since
the slot's load modulo ``capacity`` (a multi-token row runs as successive launches; for ``K < 32`` with vLLM's
launch config but one K tile, ``nk=1``). ``state(p, ahead)`` folds (:func:`encode`, float64, as
``replay_backends.encode``) the checkpoint and the live ring entries of the tensors it holds.
"""

from __future__ import annotations

import numpy as np

from gdn2_oracle.kernels.replayssm import ReplaySSMKernel
from gdn2_oracle.kernels.torch_bridge import import_torch, resolve_device, to_numpy, to_torch
from gdn2_oracle.oracle.replay import fold
from gdn2_oracle.oracle.replay_slots import NULL_SLOT

from .harness import host_cast

FAMILY = "gdn"  # one log-decay and one beta per value head and token

STORAGE_ORDER = ("float32", "float16", "bfloat16")  # finer to coarser
LOGIT_BOUND = 200.0  # |a|, |b| are kept below this: exp(-200) and sigmoid(-200) are 0 in float32 (g = 0, beta 0/1)


def drives(fn):
    """Whether kernel ``fn`` is a ``replayssm:PACKAGE`` kernel (this backend's)."""
    return isinstance(fn, ReplaySSMKernel)


def gdn_inputs(call, dtype):
    """``(q, k, v, g, beta)`` of a session call in the gdn family's signature, NumPy in ``dtype`` (exact)."""
    fam = call.family_inputs(FAMILY)
    return tuple(host_cast(fam[n], dtype) for n in ("q", "k", "v", "g", "beta"))


def encode(checkpoint, d, k, g, base, n):
    """The float64 ``[HV, K, V]`` state of one slot from ``checkpoint [HV, V, K]``, ``d [HV, buf, V]``, ``k [H, buf,
    K]``, ``g [HV, buf]``: ``n`` ring entries from position ``base`` folded (``replay_backends.encode``'s fold; this
    module does not import that one, which imports this one)."""
    C, dd, kk, gg = (np.asarray(x).astype(np.float64) for x in (checkpoint, d, k, g))
    return fold(np.swapaxes(C, -1, -2), dd, kk, np.broadcast_to(gg[..., None], gg.shape + (kk.shape[-1],)), base, n)


def raw_gdn_terms(g, beta):
    """``(a, b)`` float32 with ``-softplus(a) = g`` and ``sigmoid(b) = beta`` (float64 arithmetic, bounded)."""
    x = -np.asarray(g, np.float64)
    bt = np.asarray(beta, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # log(expm1(x)) = x + log1p(-exp(-x)) for large x (expm1 overflows above ~709)
        a = np.where(x > 30.0, x + np.log1p(-np.exp(-np.minimum(x, 700.0))), np.log(np.expm1(np.minimum(x, 30.0))))
        b = np.log(bt) - np.log1p(-bt)
    a = np.clip(a, -LOGIT_BOUND, None)
    b = np.clip(b, -LOGIT_BOUND, LOGIT_BOUND)
    return a.astype(np.float32), b.astype(np.float32)


class VllmReplayBackend:
    """The ReplaySSM functions of ``kernel`` (a ``kernels.replayssm.ReplaySSMKernel``) as a backend."""

    family = FAMILY

    def __init__(self, kernel):
        self.kernel = kernel
        self.name = kernel.__name__
        self.capacity = int(kernel.capacity)
        # (checkpoint dtype, d and k ring dtype); graded by the coarser of the two (the window path's float32
        # checkpoint is finer than either)
        self.storage = (kernel.state_dtype, kernel.cache_dtype)
        self.state_dtype = max(self.storage, key=STORAGE_ORDER.index)
        self.torch = import_torch()
        self.device = resolve_device(kernel.device)

    def _dtype(self, name):
        return getattr(self.torch, name)

    def _zeros(self, shape, dtype):
        return self.torch.zeros(shape, dtype=self._dtype(dtype) if isinstance(dtype, str) else dtype,
                                device=self.device)

    def _page(self, slots, HV, H, K, V, ring, state_dtype):
        """Zero storage of one path: ``(checkpoint, d, k, g)``."""
        cd = self.kernel.cache_dtype
        return (self._zeros((slots, HV, V, K), state_dtype), self._zeros((slots, HV, ring, V), cd),
                self._zeros((slots, H, ring, K), cd), self._zeros((slots, HV, ring), "float32"))

    def setup(self, slots, HV, H, K, V, window):
        self.window = int(window)
        self.spec_len = max(int(self.kernel.spec_len), self.window)
        self.buf = 1 << (self.capacity - 1).bit_length()  # vLLM's spec ring: next_pow2(max_cache_len)
        if self.window and max(self.capacity, 2 * self.spec_len) > self.buf:
            raise ValueError(f"capacity: a ring of next_pow2({self.capacity}) = {self.buf} entries holds less than "
                             f"a flushed history and a window, 2 * max_spec_len = {2 * self.spec_len}")
        self.HV = HV
        # vLLM's one-token launch config (block_v 64, 1 warp, 3 stages) splits next_pow2(K) into nk = 2 tiles, each
        # at least 16 wide (tl.dot): one tile for a smaller K (the sessions' K = 16)
        small = 1 << (K - 1).bit_length() < 32
        self.launch = {"block_v": 64, "num_warps": 1, "num_stages": 3, "nk": 1} if small else {}
        self.one = self._page(slots, HV, H, K, V, self.capacity, self.state_dtype)
        self.win = self._page(slots, HV, H, K, V, self.buf, "float32") if self.window else None
        torch = self.torch
        self.cursors = tuple(self._zeros((slots,), dt) for dt in (torch.int32, torch.int32, torch.int8))
        self.A_log = self._zeros((HV,), "float32")
        self.dt_bias = self._zeros((HV,), "float32")
        self.decoded = np.zeros(slots, np.int64)  # one-token path: tokens since the slot's load (the write_pos)
        self.verified = np.zeros(slots, bool)  # a window ran since the slot's last commit
        self.windowed = np.zeros(slots, bool)  # the slot runs windows (cursors kept by the kernel)

    def _limits(self):
        return {"max_cache_len": self.capacity, "max_spec_len": self.spec_len}

    def _ints(self, values, dtype=None):
        return self.torch.tensor(np.asarray(values, np.int64), dtype=dtype or self.torch.int32, device=self.device)

    def _packed(self, xs):
        """``(mixed_qkv, a, b)`` torch tensors of token inputs ``xs = (q [n, H, K], k, v [n, HV, V], g [n, HV],
        beta)``: q | k | v in their dtype, the raw gates float32."""
        q, k, v, g, beta = xs
        n = q.shape[0]
        mixed = np.concatenate([x.reshape(n, -1) for x in (q, k, v)], axis=1)  # all three in the input dtype
        a, b = raw_gdn_terms(g, beta)
        return to_torch(mixed, self.device), to_torch(a, self.device), to_torch(b, self.device)

    def run(self, plan, call, dtype):
        q, k, v, g, beta = gdn_inputs(call, dtype)
        B, T, HV, V = v.shape
        o = np.zeros((B, T, HV, V), v.dtype)
        scale = float(q.shape[-1] ** -0.5 if call.scale is None else call.scale)
        windowed = bool(plan.rows) and plan.rows[0].window
        loaded = {p for p, _ in plan.loads}
        commits = dict(plan.commits)
        for r in plan.rows:  # vLLM commits every row: a window not accepted from commits 0 tokens
            if r.slot != NULL_SLOT and r.slot not in loaded and self.verified[r.slot]:
                commits.setdefault(r.slot, 0)
        if commits:
            slots, acc = zip(*sorted(commits.items()))
            self.kernel.commit(*self.cursors, self._ints(acc), self._ints(slots), **self._limits(),
                               cache_buf_len=self.buf)
            self.verified[list(slots)] = False
        if plan.loads:
            self._load(plan.loads, windowed)
        if windowed:
            return self._windows(plan, (q, k, v, g, beta), o, scale)
        rows = list(plan.rows)
        for t in range(max((r.length for r in rows), default=0)):
            step = [r for r in rows if r.length > t]
            xs = [np.stack([x[r.row, r.start + t] for r in step]) for x in (q, k, v, g, beta)]
            mixed, a, b = self._packed(xs)
            out = self._zeros((len(step), 1, HV, V), self._dtype(np.dtype(v.dtype).name))
            wp = [self.decoded[r.slot] % self.capacity if r.slot != NULL_SLOT else 0 for r in step]
            self.kernel.recurrent(mixed, a, b, self.A_log, self.dt_bias, scale, *self.one, out,
                                  self._ints([r.slot for r in step]), self._ints(wp),
                                  use_qk_l2norm_in_kernel=False, **self.launch)
            res = to_numpy(out)
            for i, r in enumerate(step):
                o[r.row, r.start + t] = res[i, 0]
                if r.slot != NULL_SLOT:
                    self.decoded[r.slot] += 1
        return o

    def _load(self, loads, windowed):
        """The prefill hand-off: ``checkpoint[slot] = state`` (``[HV, V, K]``), cursors reset on the window path."""
        slots = [p for p, _ in loads]
        page = self.win if windowed else self.one
        states = np.stack([np.swapaxes(S, -1, -2) for _, S in loads]).astype(np.float32)
        page[0][self._ints(slots, self.torch.long)] = to_torch(states, self.device).to(page[0].dtype)
        self.decoded[slots], self.verified[slots] = 0, False
        self.windowed[slots] = windowed
        if windowed:
            self.kernel.reset(*self.cursors, self._ints([1] * len(slots)), self._ints(slots), **self._limits())

    def _windows(self, plan, xs, o, scale):
        """One ``gdn_replayssm_spec_decode`` on the rows' windows; their outputs into ``o``."""
        rows = list(plan.rows)
        tokens = [[x[r.row, r.start:r.start + r.length] for r in rows] for x in xs]
        starts = np.concatenate([[0], np.cumsum([r.length for r in rows])])
        if starts[-1] == 0:
            return o
        mixed, a, b = self._packed([np.concatenate(t) for t in tokens])
        out = self._zeros((int(starts[-1]), self.HV, o.shape[-1]), self._dtype(np.dtype(o.dtype).name))
        self.kernel.window(mixed, a, b, self.A_log, self.dt_bias, *self.win, out, self._ints(starts),
                           self._ints([r.slot for r in rows]), *self.cursors, **self._limits(), scale=scale,
                           use_qk_l2norm_in_kernel=False)
        res = to_numpy(out)
        for i, r in enumerate(rows):
            o[r.row, r.start:r.start + r.length] = res[starts[i]:starts[i + 1]]
        self.verified[[r.slot for r in rows if r.slot != NULL_SLOT and r.length > 0]] = True
        return o

    def state(self, p, ahead):
        if not self.windowed[p]:
            raw = [to_numpy(t[p]) for t in self.one]
            return encode(*raw, 0, self.decoded[p] % self.capacity + ahead)
        raw = [to_numpy(t[p]) for t in self.win]
        wp, base, flush = (int(t[p]) for t in self.cursors)
        if self.verified[p] and flush:  # the window's flush folded the history into the checkpoint already
            return encode(*raw, base + wp, ahead)
        return encode(*raw, base, wp + ahead)
