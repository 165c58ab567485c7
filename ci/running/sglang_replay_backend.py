"""SGLang's own GDN ReplaySSM (``kernels/sglang_replayssm.py``) as a replay backend (docs/drivers.md).

:class:`SglangReplayBackend` has the interface of ``replay_backends.JaxReplayBackend`` (``ci/running/drivers.py``'s
``ReplayDriver`` drives it) and calls SGLang's functions with the arguments SGLang's layer passes, on torch tensors
shaped as SGLang's mamba pool allocates them (one layer):

* the checkpoint ``temporal [1, slots, HV, V, K]`` float32, keyed by the *state slot* (SGLang's mamba slot: here the
  replay slot p); padding rows get state slot -1 (SGLang's null block);
* the window path's rings ``d [1, rows, HV, L, V]``, ``k [1, rows, H, L, K]``, ``g [1, rows, HV, L]`` (float32,
  ``L = capacity``) and its cursors ``write_pos``, ``cache_base`` (int32) and ``is_flush`` (int8), keyed by the
  *replay index* (SGLang's request slot: here :func:`replay_row`, a different number than the state slot, so a
  kernel that mixes the two keys reads another sequence's ring); ``rawv``, ``rawk``, ``beta`` are None, as SGLang
  allocates them for a float32 checkpoint;
* the one-token path's rings ``d [slots, HV, L, V]``, ``k [slots, H, L, K]``, ``g [slots, HV, L]``, keyed by the
  state slot (SGLang's decode ring), with no cursors (the caller's ``write_pos``).

Per call: the commits of the previous windows, as SGLang commits after acceptance (``commit_gdn_replayssm_spec`` with
``num_accepted``, ``fold_every_commit=False``, ``null_block_id=-1``; then ``commit_gdn_replayssm_circular``, which
folds the rows whose ``is_flush`` the commit set and resets their ring); the loads (the prefill hand-off:
``temporal[slot] = state`` as ``[HV, V, K]``, cursors zeroed as SGLang's ``alloc`` zeroes a fresh request's); then
either one ``gdn_replayssm_spec_decode(..., launch_mode="verify", null_block_id=-1)`` over the rows' windows (split
``q, k, v [tokens, heads, dim]``, ``query_start_loc`` from their lengths) or, one token per row per launch,
``fused_recurrent_gdn_replayssm_decode`` (packed ``mixed_qkv``; ``write_pos`` = tokens since the slot's load modulo
L, a flush at ``L - 1``, as SGLang's decode metadata advances it). Gates go in raw (``A_log = dt_bias = 0``, ``a, b``
from ``replayssm_backend.raw_gdn_terms``), ``use_qk_l2norm_in_kernel=False`` (the sessions' q, k as they are; SGLang's
layer passes True on its un-normalised q, k), ``scale`` the session's. At K = 16 both launches get ``nk=1``
(SGLang's default ``nk=2`` needs K tiles of at least 16). ``state(p, ahead)`` folds (float64) the checkpoint and the
live ring entries.
"""

from __future__ import annotations

import numpy as np

from gdn2_oracle.kernels.sglang_replayssm import SglangReplaySSMKernel
from gdn2_oracle.kernels.torch_bridge import import_torch, to_numpy, to_torch
from gdn2_oracle.oracle.replay_slots import NULL_SLOT

from .replayssm_backend import FAMILY, encode, gdn_inputs, raw_gdn_terms

SGLANG_NULL = -1  # SGLang's padding slot (its valid slots start at 0)


def drives(fn):
    """Whether kernel ``fn`` is ``sglang-gdn-replayssm`` (this backend's)."""
    return isinstance(fn, SglangReplaySSMKernel)


def replay_row(p, slots):
    """SGLang's replay index (request slot) of replay slot ``p`` among ``slots``: the slots in reverse order."""
    return slots - p


class SglangReplayBackend:
    """SGLang's GDN ReplaySSM functions of ``kernel`` (a ``kernels.sglang_replayssm.SglangReplaySSMKernel``)."""

    family = FAMILY

    def __init__(self, kernel):
        self.kernel = kernel
        self.name = kernel.__name__
        self.capacity = int(kernel.capacity)
        self.storage = (kernel.state_dtype, kernel.cache_dtype)
        self.state_dtype = kernel.state_dtype
        self.torch = import_torch()

    def _zeros(self, shape, dtype=None):
        return self.torch.zeros(shape, dtype=dtype or self.torch.float32)

    def _ints(self, values, dtype=None):
        return self.torch.tensor(np.asarray(values, np.int64), dtype=dtype or self.torch.int32)

    def setup(self, slots, HV, H, K, V, window):
        self.window = int(window)
        self.spec_len = max(int(self.kernel.spec_len), self.window)
        L = self.capacity
        if self.window and 2 * self.spec_len > L:
            raise ValueError(f"capacity: SGLang's ring of {L} entries is shorter than 2 * max_spec_len = "
                             f"{2 * self.spec_len} (it flushes one window early: max_cache_len >= 2 max_spec_len)")
        self.slots, self.HV = slots, HV
        rows = slots + 1  # replay rows 1..slots (replay_row)
        self.temporal = self._zeros((1, slots, HV, V, K))
        self.d, self.k, self.g = self._zeros((1, rows, HV, L, V)), self._zeros((1, rows, H, L, K)), \
            self._zeros((1, rows, HV, L))
        self.one = (self._zeros((slots, HV, L, V)), self._zeros((slots, H, L, K)), self._zeros((slots, HV, L)))
        torch = self.torch
        self.cursors = tuple(self._zeros((rows,), dt) for dt in (torch.int32, torch.int32, torch.int8))
        self.A_log, self.dt_bias = self._zeros((HV,)), self._zeros((HV,))
        self.launch = {"nk": 1} if 1 << (K - 1).bit_length() < 32 else {}
        self.decoded = np.zeros(slots, np.int64)  # one-token path: tokens since the slot's load
        self.windowed = np.zeros(slots, bool)  # the slot runs verify windows (cursors kept by the kernel)
        self.verified = np.zeros(slots, bool)  # a window ran since the slot's last commit

    def _rows(self, ps):
        """SGLang's replay indices of replay slots ``ps`` (int64, as ``req_pool_indices``)."""
        return self._ints([replay_row(p, self.slots) for p in ps], self.torch.int64)

    def _states(self, ps):
        """SGLang's state slots of replay slots ``ps``: the slot, or -1 for the null slot."""
        return self._ints([p if p != NULL_SLOT else SGLANG_NULL for p in ps], self.torch.int64)

    def run(self, plan, call, dtype):
        q, k, v, g, beta = gdn_inputs(call, dtype)
        B, T, HV, V = v.shape
        o = np.zeros((B, T, HV, V), v.dtype)
        scale = float(q.shape[-1] ** -0.5 if call.scale is None else call.scale)
        windowed = bool(plan.rows) and plan.rows[0].window
        loaded = {p for p, _ in plan.loads}
        commits = dict(plan.commits)
        for r in plan.rows:  # SGLang commits every verified row: a window none of which was accepted commits 0
            if r.slot != NULL_SLOT and r.slot not in loaded and self.verified[r.slot]:
                commits.setdefault(r.slot, 0)
        if commits:
            self._commit(*zip(*sorted(commits.items())))
        if plan.loads:
            self._load(plan.loads, windowed)
        if windowed:
            return self._windows(plan, (q, k, v, g, beta), o, scale)
        rows = list(plan.rows)
        for t in range(max((r.length for r in rows), default=0)):
            step = [r for r in rows if r.length > t]
            xs = [np.stack([x[r.row, r.start + t] for r in step]) for x in (q, k, v, g, beta)]
            n = len(step)
            mixed = np.concatenate([x.reshape(n, -1) for x in xs[:3]], axis=1)
            a, b = raw_gdn_terms(xs[3], xs[4])
            out = self._zeros((n, 1, HV, V), getattr(self.torch, np.dtype(v.dtype).name))
            wp = [self.decoded[r.slot] % self.capacity if r.slot != NULL_SLOT else 0 for r in step]
            self.kernel.one_token(mixed_qkv=to_torch(mixed, "cpu"), a=to_torch(a, "cpu"), b=to_torch(b, "cpu"),
                               A_log=self.A_log, dt_bias=self.dt_bias, scale=scale, initial_state=self.temporal[0],
                               d_cache=self.one[0], k_cache=self.one[1], g_cache=self.one[2], out=out,
                               ssm_state_indices=self._states([r.slot for r in step]), write_pos=self._ints(wp),
                               use_qk_l2norm_in_kernel=False, **self.launch)
            res = to_numpy(out)
            for i, r in enumerate(step):
                o[r.row, r.start + t] = res[i, 0]
                if r.slot != NULL_SLOT:
                    self.decoded[r.slot] += 1
        return o

    def _commit(self, slots, accepted):
        """SGLang's commit after acceptance: the cursors, then the capacity fold of the rows that reached it."""
        rows, states = self._rows(slots), self._states(slots)
        acc = self._ints(accepted)
        self.kernel.commit(*self.cursors, num_accepted=acc, replay_indices=rows, max_cache_len=self.capacity,
                           max_spec_len=self.spec_len, fold_every_commit=False, null_block_id=SGLANG_NULL)
        wp, base, flush = self.cursors
        self.kernel.fold(checkpoint_state=self.temporal, d_cache=self.d, k_cache=self.k, g_cache=self.g,
                         d_residual_cache=None, k_residual_cache=None, state_batch_indices=states,
                         replay_indices=rows, write_pos=wp, cache_base=base, is_flush=flush, accept_lens=acc,
                         null_block_id=SGLANG_NULL)
        self.verified[list(slots)] = False

    def _load(self, loads, windowed):
        """The prefill hand-off: ``temporal[slot] = state`` (``[HV, V, K]``), the slot's cursors zeroed."""
        slots = [p for p, _ in loads]
        states = np.stack([np.swapaxes(S, -1, -2) for _, S in loads]).astype(np.float32)
        self.temporal[0, self._ints(slots, self.torch.long)] = to_torch(states, "cpu")
        for c in self.cursors:
            c[self._rows(slots)] = 0
        self.decoded[slots], self.verified[slots] = 0, False
        self.windowed[slots] = windowed

    def _windows(self, plan, xs, o, scale):
        """One verify launch on the rows' windows; their outputs into ``o``."""
        rows = list(plan.rows)
        starts = np.concatenate([[0], np.cumsum([r.length for r in rows])]).astype(np.int64)
        if starts[-1] == 0:
            return o
        q, k, v, g, beta = (np.concatenate([x[r.row, r.start:r.start + r.length] for r in rows]) for x in xs)
        a, b = raw_gdn_terms(g, beta)
        out = self._zeros((int(starts[-1]), self.HV, o.shape[-1]), getattr(self.torch, np.dtype(o.dtype).name))
        ps = [r.slot for r in rows]
        launch = {"nk": 1, "nk_flush": 1} if self.launch else {}
        self.kernel.verify(q=to_torch(q, "cpu"), k=to_torch(k, "cpu"), v=to_torch(v, "cpu"), a=to_torch(a, "cpu"),
                           b=to_torch(b, "cpu"), A_log=self.A_log, dt_bias=self.dt_bias,
                           checkpoint_state=self.temporal[0], d_cache=self.d[0], k_cache=self.k[0],
                           g_cache=self.g[0], rawv_cache=None, rawk_cache=None, beta_cache=None, out=out,
                           query_start_loc=self._ints(starts), ssm_state_indices=self._states(ps),
                           replay_indices=self._rows(ps), write_pos=self.cursors[0], cache_base=self.cursors[1],
                           is_flush=self.cursors[2], max_cache_len=self.capacity, max_spec_len=self.spec_len,
                           scale=scale, use_qk_l2norm_in_kernel=False, null_block_id=SGLANG_NULL,
                           launch_mode="verify", **launch)
        res = to_numpy(out)
        for i, r in enumerate(rows):
            o[r.row, r.start:r.start + r.length] = res[starts[i]:starts[i + 1]]
        self.verified[[r.slot for r in rows if r.slot != NULL_SLOT and r.length > 0]] = True
        return o

    def state(self, p, ahead):
        raw = [to_numpy(self.temporal[0, p])]
        row = replay_row(p, self.slots)
        if not self.windowed[p]:  # the one-token path's rings, keyed by the state slot
            raw += [to_numpy(t[p]) for t in self.one]
            return encode(*raw, 0, self.decoded[p] % self.capacity + ahead)
        raw += [to_numpy(t[0, row]) for t in (self.d, self.k, self.g)]
        wp, base = (int(c[row]) for c in self.cursors[:2])
        return encode(*raw, base, wp + ahead)
