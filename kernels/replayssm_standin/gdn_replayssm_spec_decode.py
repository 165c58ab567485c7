"""The stand-in for vLLM's ``gdn_replayssm_spec_decode``: verify / flush windows, commit, reset (package docstring).

Cursors are per slot (``write_pos`` int32 committed entries, ``cache_base`` int32 circular origin, ``is_flush``
int8); the ring is ``buf = d_cache.shape[2]`` (a power of two) entries, entry ``c`` of a slot at ``(cache_base + c)
& (buf - 1)``. ``max_cache_len`` is the flush threshold L, ``max_spec_len`` the window T.
"""

from __future__ import annotations

import numpy as np

from gdn2_oracle.kernels import replay_decode
from gdn2_oracle.kernels.torch_bridge import to_torch

from .fused_recurrent_replayssm import (
    F32,
    check_int,
    check_tensor,
    gdn_terms,
    host,
    key_heads,
    normalised,
    padding_ids,
    put_back,
    replay_storage,
    storage_dims,
    unpacked,
)

LAUNCH_MODES = ("both", "verify", "flush")


def _cursors(write_pos, cache_base, is_flush, P=None):
    """The three cursor tensors, each ``[P]`` integers (``P`` their common length when not given)."""
    P = check_tensor("write_pos", write_pos, ndim=1).shape[0] if P is None else P
    for name, t in (("write_pos", write_pos), ("cache_base", cache_base), ("is_flush", is_flush)):
        check_int(name, t, (P,))
    return P


def _limits(max_cache_len, max_spec_len):
    for name, x in (("max_cache_len", max_cache_len), ("max_spec_len", max_spec_len)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {x!r}")
    return int(max_cache_len), int(max_spec_len)


def _cursor_storage(P, buf, write_pos, cache_base, is_flush):
    """A :class:`replay_decode.ReplayCache` holding the cursors (one-element heads, a ring of ``buf`` entries)."""
    z = np.zeros
    return replay_decode.ReplayCache(
        z((P, 1, 1, 1), F32), z((P, 1, buf, 1), F32), z((P, 1, buf, 1), F32), z((P, 1, buf), F32),
        *(host(t).astype(np.int32) for t in (write_pos, cache_base, is_flush)))


def _put_cursors(cache, write_pos, cache_base, is_flush):
    for t, x in zip((write_pos, cache_base, is_flush), (cache.write_pos, cache.cache_base, cache.is_flush)):
        put_back(t, np.asarray(x))


def _rows(name, ids, null_block_id, P, selected=None):
    """Our kernel's slot ids for ``ids`` (padding ``-1``), only the ``selected`` rows' when given."""
    slots = padding_ids(name, ids, null_block_id, P)
    return slots if selected is None else np.where(selected, slots, -1).astype(np.int32)


# --- the functions ------------------------------------------------------------------------------------------------


def gdn_replayssm_spec_decode(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    checkpoint_state,
    d_cache,
    k_cache,
    g_cache,
    out,
    query_start_loc,
    ssm_state_indices,
    write_pos,
    cache_base,
    is_flush,
    max_cache_len: int,
    max_spec_len: int,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = True,
    null_block_id: int = 0,
    launch_mode: str = "both",
):
    """One window per row (tokens ``query_start_loc[r]..query_start_loc[r+1]-1``, at most ``max_spec_len``)
    ``-> out``, updated in place with the checkpoint and the rings.

    A row whose slot has ``is_flush`` runs the flush launch (the committed history folded into ``checkpoint_state``,
    the window on an empty history, its entries after the folded ones); the others the verify launch (the window
    after the committed entries; checkpoint untouched). Entries go to ring positions ``(cache_base + write_pos + s)
    & (buf - 1)``. ``launch_mode``: ``"both"``, or one launch (the other rows' outputs untouched). Rows whose slot
    is ``<= null_block_id`` are padding: the verify launch writes zeros for their tokens. Cursors are read only.
    """
    if launch_mode not in LAUNCH_MODES:
        raise ValueError(f"launch_mode: expected one of {LAUNCH_MODES}, got {launch_mode!r}")
    L, T = _limits(max_cache_len, max_spec_len)
    P, H, HV, K, V, buf = storage_dims("checkpoint_state", checkpoint_state, d_cache, k_cache, g_cache)
    if buf & (buf - 1):
        raise ValueError(f"d_cache: its ring of {buf} entries is not a power of two")
    if key_heads(mixed_qkv, HV, V, K) != H:
        raise ValueError(f"mixed_qkv: its q / k columns do not make the {H} key heads of k_cache")
    N = mixed_qkv.shape[0]
    R = check_int("ssm_state_indices", ssm_state_indices, (None,)).shape[0]
    check_int("query_start_loc", query_start_loc, (R + 1,))
    _cursors(write_pos, cache_base, is_flush, P)
    check_tensor("out", out, (N, HV, V))
    starts = host(query_start_loc).astype(np.int64)
    lengths = np.diff(starts)
    if R == 0:
        return out
    if starts[0] < 0 or starts[-1] > N or (lengths < 0).any() or (lengths > T).any():
        raise ValueError(f"query_start_loc: {starts.tolist()} is not windows of at most max_spec_len = {T} tokens "
                         f"within {N}")
    scale = K**-0.5 if scale is None else float(scale)
    q, k, v = unpacked(mixed_qkv, H, HV, K, V)
    g, beta = gdn_terms(a, b, A_log, dt_bias, N, HV)
    if use_qk_l2norm_in_kernel:
        q, k = normalised(q), normalised(k)
    slots = _rows("ssm_state_indices", ssm_state_indices, null_block_id, P)
    live = slots > 0
    flush = live & (host(is_flush).astype(np.int32)[np.where(live, slots, 0)] != 0)
    run = {"both": live, "verify": live & ~flush, "flush": flush}[launch_mode]
    written = run | (~live if launch_mode != "flush" else np.zeros_like(live))  # the rows whose tokens out gets
    win = [np.zeros((R, T) + x.shape[1:], F32) for x in (q, k, v, g, beta)]
    for r in range(R):
        for w, x in zip(win, (q, k, v, g, beta)):
            w[r, :lengths[r]] = x[starts[r]:starts[r + 1]]
    cache = replay_storage(checkpoint_state, d_cache, k_cache, g_cache, write_pos, cache_base, is_flush)
    o, new = replay_decode.spec_decode(*win, cache, np.where(run, slots, -1).astype(np.int32),
                                       lengths.astype(np.int32), max_cache_len=L, max_spec_len=T, scale=scale)
    for t, x in zip((checkpoint_state, d_cache, k_cache, g_cache), new[:4]):
        put_back(t, x)
    o = np.asarray(o)
    result = host(out).copy()
    for r in np.flatnonzero(written):
        result[starts[r]:starts[r + 1]] = o[r, :lengths[r]].astype(result.dtype)
    out.copy_(to_torch(result, out.device))
    return out


def commit_gdn_replayssm_spec(
    write_pos,
    cache_base,
    is_flush,
    num_accepted,
    state_batch_indices,
    max_cache_len: int,
    max_spec_len: int,
    cache_buf_len: int | None = None,
    null_block_id: int = 0,
):
    """Cursors of the rows' slots after their windows, in place (``num_accepted [rows]`` including the bonus token):
    after a flush with ``acc > 0`` ``cache_base += write_pos`` (mod ``cache_buf_len``, default the next power of two
    ``>= max_cache_len``); ``write_pos = acc`` after a flush, else ``write_pos + acc``; then ``is_flush = write_pos +
    2 max_spec_len > max_cache_len``. Rows whose slot is ``<= null_block_id`` are skipped."""
    L, T = _limits(max_cache_len, max_spec_len)
    P = _cursors(write_pos, cache_base, is_flush)
    R = check_int("state_batch_indices", state_batch_indices, (None,)).shape[0]
    check_int("num_accepted", num_accepted, (R,))
    buf = replay_decode.ring_size(L, T) if cache_buf_len is None else int(cache_buf_len)
    if R == 0:
        return None
    slots = _rows("state_batch_indices", state_batch_indices, null_block_id, P)
    cache = _cursor_storage(P, buf, write_pos, cache_base, is_flush)
    cache = replay_decode.commit(cache, host(num_accepted).astype(np.int32), slots, max_cache_len=L, max_spec_len=T)
    _put_cursors(cache, write_pos, cache_base, is_flush)
    return None


def reset_gdn_replayssm_spec_cursors(
    write_pos,
    cache_base,
    is_flush,
    do_reset,
    state_batch_indices,
    max_cache_len: int,
    max_spec_len: int,
    null_block_id: int = 0,
):
    """Cursors of a request's first window, in place, for the rows with ``do_reset`` (``[rows]`` int or bool):
    ``write_pos = cache_base = 0``, ``is_flush = 2 max_spec_len > max_cache_len``. Rows whose slot is ``<=
    null_block_id`` are skipped."""
    L, T = _limits(max_cache_len, max_spec_len)
    P = _cursors(write_pos, cache_base, is_flush)
    R = check_int("state_batch_indices", state_batch_indices, (None,)).shape[0]
    check_tensor("do_reset", do_reset, (R,))
    slots = _rows("state_batch_indices", state_batch_indices, null_block_id, P, host(do_reset).astype(bool))
    if not (slots > 0).any():
        return None
    buf = 1 << (max(L, 2 * T) - 1).bit_length()  # any ring our reset accepts: a reset does not read it
    cache = _cursor_storage(P, buf, write_pos, cache_base, is_flush)
    cache = replay_decode.reset(cache, slots, max_cache_len=L, max_spec_len=T)
    _put_cursors(cache, write_pos, cache_base, is_flush)
    return None
