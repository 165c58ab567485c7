"""PyTorch serving (decode) kernels: FLA's in-place pool convention behind a functional call, and FLA's naive
recurrent reference as a decode peer.

**The convention (FLA's keywords).** A torch decode kernel is called like FLA's ``fused_recurrent_gdn2_fwd``
(fla-core 0.6.0, ``fla/ops/gdn2/fused_recurrent.py``), the path serving engines call::

    o, final_state = fn(q, k, v, g, b, w, initial_state=pool, scale=scale, cu_seqlens=cu,
                        ssm_state_indices=idx, num_accepted_tokens=acc, inplace_final_state=True)

``pool`` (``[P, H, K, V]``, in the pool's storage dtype) is updated in place; ``final_state`` is the pool itself
(FLA returns ``initial_state`` when ``inplace_final_state``) or, for a functional torch kernel, the new pool.
Keywords the function's signature does not name (and it has no ``**kwargs``) are left out, except
``initial_state`` and ``ssm_state_indices``, which a serving kernel must take by name: FLA's public
``fused_recurrent_gdn2`` swallows them in ``**kwargs`` and drops them (docs/DESIGN.md, "Decode contract"), so a
``**kwargs``-only signature does not count. Indices are int32 (as serving engines pass them), ``cu_seqlens``
int64 (FLA's LongTensor).

:class:`TorchDecode` wraps such a function into the suite's functional serving call on NumPy arrays,
``(q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None, scale=None) ->
(o, new_pool)``, on a copy of the pool (the caller's pool is never touched). Arrays cross exactly (the torch
bridge's ``to_torch`` / ``to_numpy``). Option ``state_dtype`` (float32 | bfloat16 | float16): the dtype the pool
is stored in (FLA stores in whatever dtype the engine allocated); ``device``; every other option is passed to the
function as a keyword.

:func:`fla_naive_decode` has that signature and runs FLA's pure-torch ``naive_recurrent_gdn2`` (loaded by path,
``kernels/fla_peers.py``) inside the bookkeeping of docs/DESIGN.md §2 "Decode contract": per sequence it reads
the starting slot, upcasts it, runs the tokens in float32 (one naive call for an ``[N]`` row, one per token with
``[N, S]`` draft slots so each token's state can be stored) and stores the state in the pool's dtype. It is the
peer ``torch:gdn2_oracle.kernels.serving_bridge:fla_naive_decode`` (:data:`FLA_NAIVE_SPEC`); without
``ssm_state_indices`` it is ``naive_recurrent_gdn2`` itself (the training contract).
"""

from __future__ import annotations

import inspect

import numpy as np

from .decode import PAD_SLOT, STATE_DTYPES
from .family_decode import V_FIRST
from .fla_peers import load_naive
from .torch_bridge import import_torch, numpy_dtype, resolve_device, to_numpy, to_torch

FLA_NAIVE_SPEC = "torch:gdn2_oracle.kernels.serving_bridge:fla_naive_decode"
FLA_FUSED_SPEC = "torch:gdn2_oracle.kernels.serving_bridge:fla_fused_recurrent[device=cpu]"
FLA_REQUIRED = ("initial_state", "ssm_state_indices")


def _parameters(fn):
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


def takes_fla_pool(fn):
    """Whether ``fn``'s signature names FLA's pool keywords ``initial_state`` and ``ssm_state_indices``."""
    params = _parameters(fn)
    return params is not None and all(
        n in params and params[n].kind in (params[n].KEYWORD_ONLY, params[n].POSITIONAL_OR_KEYWORD)
        for n in FLA_REQUIRED)


class TorchDecode:
    """A torch decode function with FLA's keywords behind the suite's functional serving call (module docstring)."""

    def __init__(self, fn, *, name=None, device=None, options=None):
        if not callable(fn):
            raise ValueError(f"fn: {fn!r} is not callable")
        if not takes_fla_pool(fn):
            raise ValueError(f"fn: {getattr(fn, '__name__', fn)!r} does not take FLA's pool keywords "
                             f"{FLA_REQUIRED} by name (a **kwargs-only signature drops them silently)")
        options = dict(options or {})
        sd = options.pop("state_dtype", "float32")
        if sd not in STATE_DTYPES:
            raise ValueError(f"state_dtype: expected one of {STATE_DTYPES}, got {sd!r}")
        self.fn, self.state_dtype = fn, sd
        option_device = options.pop("device", None)
        self.device = resolve_device(device if device is not None else option_device)
        self.kwargs = options
        self.__name__ = name or getattr(fn, "__name__", "torch-decode")
        params = _parameters(fn)
        self._open = any(p.kind is p.VAR_KEYWORD for p in params.values())
        self._names = set(params)

    def __repr__(self):
        return f"TorchDecode({self.__name__!r}, state_dtype={self.state_dtype!r}, device={str(self.device)!r})"

    def _keywords(self, **kw):
        return {k: v for k, v in kw.items() if v is not None and (self._open or k in self._names)}

    def __call__(self, q, k, v, g, b, w, *, state_pool, state_indices, cu_seqlens=None, num_accepted_tokens=None,
                 scale=None):
        torch = import_torch()
        pool = np.asarray(state_pool)
        if pool.dtype.name != self.state_dtype:
            raise ValueError(f"state_pool: dtype {pool.dtype.name} is not the kernel's state_dtype {self.state_dtype}")
        ts = [to_torch(np.asarray(x), self.device) for x in (q, k, v, g, b, w)]
        pool_t = to_torch(pool, self.device)  # a copy: the kernel updates it in place

        def ints(x, dtype):
            return None if x is None else torch.as_tensor(np.asarray(x).astype(dtype), device=self.device)

        kwargs = {**self.kwargs, **self._keywords(
            initial_state=pool_t, scale=scale, cu_seqlens=ints(cu_seqlens, np.int64),
            ssm_state_indices=ints(state_indices, np.int32), num_accepted_tokens=ints(num_accepted_tokens, np.int32),
            inplace_final_state=True)}
        kwargs["initial_state"], kwargs["ssm_state_indices"] = pool_t, ints(state_indices, np.int32)
        with torch.no_grad():
            out = self.fn(*ts, **kwargs)
        o, new_pool = (out, None) if torch.is_tensor(out) else (out[0], out[1] if len(out) > 1 else None)
        if not torch.is_tensor(o):
            raise ValueError(f"o: the kernel returned {type(o).__name__}, expected a tensor")
        if new_pool is None or not torch.is_tensor(new_pool) or tuple(new_pool.shape) != tuple(pool_t.shape):
            new_pool = pool_t  # FLA: the pool was updated in place (final_state is initial_state)
        if numpy_dtype(new_pool.dtype) is None or new_pool.dtype != pool_t.dtype:
            raise ValueError(f"state_pool: the kernel returned the pool in {new_pool.dtype}, expected {pool_t.dtype}")
        return to_numpy(o), to_numpy(new_pool)


def fla_naive_decode(q, k, v, g, b, w, A_log=None, dt_bias=None, initial_state=None, scale=None,
                     output_final_state=False, inplace_final_state=False, cu_seqlens=None,
                     ssm_state_indices=None, num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                     use_gate_in_kernel=False, lower_bound=None, out=None, **kwargs):
    """FLA's ``naive_recurrent_gdn2`` with ``fused_recurrent_gdn2_fwd``'s serving arguments (module docstring).

    Not covered (ValueError naming the argument): the in-kernel gate, q/k L2 normalisation, the ``[V, K]`` pool,
    ``out``, continuous batching without ``inplace_final_state``. -1 slots are padding (serving engines'
    ``PAD_SLOT_ID``); ``[N]`` indices write a sequence's final state back to its slot (docs/DESIGN.md §2).
    """
    torch = import_torch()
    naive = load_naive("gdn2").naive_recurrent_gdn2
    for name, value in (("A_log", A_log), ("dt_bias", dt_bias), ("lower_bound", lower_bound), ("out", out)):
        if value is not None:
            raise ValueError(f"{name}: not covered by the naive decode peer")
    for name, value in (("use_gate_in_kernel", use_gate_in_kernel), (V_FIRST, kwargs.get(V_FIRST, False)),
                        ("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)):
        if value:
            raise ValueError(f"{name}: not covered by the naive decode peer")
    if ssm_state_indices is None:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens: the naive peer packs sequences only with ssm_state_indices")
        return naive(q, k, v, g, b, w, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if not inplace_final_state:
        raise ValueError("inplace_final_state: the naive decode peer updates the pool in place only")
    if initial_state is None:
        raise ValueError("initial_state: the state pool is required with ssm_state_indices")
    pool = initial_state
    B, T = q.shape[:2]
    idx = ssm_state_indices.detach().cpu().numpy().astype(np.int64)
    if cu_seqlens is None:
        bounds = [(n, 0, T) for n in range(B)]
    else:
        cu = cu_seqlens.detach().cpu().numpy().astype(np.int64)
        bounds = [(0, int(cu[n]), int(cu[n + 1])) for n in range(cu.size - 1)]
    acc = None if num_accepted_tokens is None else num_accepted_tokens.detach().cpu().numpy().astype(np.int64)
    o = torch.zeros_like(v)
    with torch.no_grad():
        for n, (row, bos, eos) in enumerate(bounds):
            if eos == bos:  # FLA: T == 0 returns at once
                continue
            spec = idx.ndim == 2
            read = int(idx[n, (1 if acc is None else int(acc[n])) - 1]) if spec else int(idx[n])
            if read == PAD_SLOT:
                continue
            h = pool[read].to(torch.float32)[None]
            if spec:  # one naive call per token: every token's state is stored
                for t in range(eos - bos):
                    h = _naive_run(naive, (q, k, v, g, b, w), o, row, bos + t, bos + t + 1, h, scale)
                    if idx[n, t] != PAD_SLOT:
                        pool[int(idx[n, t])] = h[0].to(pool.dtype)
            else:
                h = _naive_run(naive, (q, k, v, g, b, w), o, row, bos, eos, h, scale)
                pool[read] = h[0].to(pool.dtype)
    return o, pool


def _naive_run(naive, xs, o, row, lo, hi, h, scale):
    """Tokens ``lo:hi`` of batch row ``row`` from float32 state ``h [1, H, K, V]``: outputs into ``o``, new state."""
    o_seq, h = naive(*(x[row:row + 1, lo:hi] for x in xs), scale=scale, initial_state=h, output_final_state=True)
    o[row, lo:hi] = o_seq[0]
    return h


def fla_fused_recurrent(q, k, v, g, b, w, initial_state=None, scale=None, cu_seqlens=None, ssm_state_indices=None,
                        num_accepted_tokens=None, inplace_final_state=False, output_final_state=False):
    """FLA's Triton ``fused_recurrent_gdn2_fwd`` (the path serving engines call), on a CPU under Triton's
    interpreter (``kernels/triton_interpret.py``; on a CUDA device as it is). Inference only (no backward), float32
    (the interpreter's bfloat16 ``tl.dot`` is wrong). FLA 0.6.0's domain: slot ``-1`` is not guarded (it reads and
    writes before the pool) and ``[N]`` indices with several tokens write token t's state to ``idx[n + t]``
    (docs/DESIGN.md §2, "Decode contract"), so only single-token ``[N]`` calls without padding, or ``[N, S]``
    draft slots, are in its domain: recipe ``serving_single_token_steps``."""
    torch = import_torch()
    if q.device.type != "cuda":
        from .triton_interpret import enable

        enable("fla_fused_recurrent")
    if q.dtype != torch.float32:
        raise ValueError(f"dtype: fla_fused_recurrent runs float32 inputs only under Triton's interpreter, "
                         f"got {q.dtype}")
    _check_fla_domain(q, cu_seqlens, ssm_state_indices)
    from fla.ops.gdn2.fused_recurrent import fused_recurrent_gdn2_fwd

    return fused_recurrent_gdn2_fwd(q, k, v, g, b, w, initial_state=initial_state, scale=scale, cu_seqlens=cu_seqlens,
                                    ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                                    inplace_final_state=inplace_final_state, output_final_state=output_final_state)


def _check_fla_domain(q, cu_seqlens, ssm_state_indices):
    """ValueError for a call outside FLA 0.6.0's fused recurrent domain, which it would answer with memory outside
    the pool (a wrong answer on a GPU, a segfault under the interpreter) instead of running it."""
    if ssm_state_indices is None:
        return
    idx = ssm_state_indices.detach().cpu().numpy()
    if (idx < 0).any():
        raise ValueError("state_indices: FLA 0.6.0's fused recurrent kernel has no guard for padding slot -1 (it reads "
                         "and writes before the pool): outside its domain")
    if idx.ndim == 1:
        lengths = (q.shape[1],) if cu_seqlens is None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        if max(lengths, default=0) > 1:
            raise ValueError("state_indices: with one slot per sequence FLA 0.6.0 writes token t's state to slot "
                             "idx[n + t] (another sequence's), so only single-token calls are in its domain")
