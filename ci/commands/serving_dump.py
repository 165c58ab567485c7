"""The plot ``validate --dump`` draws of a serving case not graded PASS: where, call by call, it went wrong.

:func:`plot_serving` reads the per-call arrays a serving case captured (``ci/running/serving.py``,
``SessionRun.arrays``: ``call{i}_ratio_o``, ``call{i}_ratio_state``, the bookkeeping, the pools; as in the dump's
``arrays.npz``) and draws two heat maps coloured by log10(error / tolerance): ``o`` per sequence (rows) and token
(columns, the calls side by side), and the state per pool slot (rows) and call (columns), each call's slots read
marked, so the wrong call, sequence and slot show at a glance.
"""

from __future__ import annotations

import textwrap

import numpy as np

from gdn2_oracle.oracle import serving

# Label every call on the x axes up to this many calls (with its accept counts), every k-th one beyond.
LABELLED_CALLS = 24
# Draw the call boundaries on the o panel, and the slots read, up to this many calls.
BOUNDED_CALLS = 200


def n_calls(arrays):
    """How many calls ``arrays`` holds the results of (``call{i}_got_o`` for i = 0, 1, ...)."""
    n = 0
    while f"call{n}_got_o" in arrays:
        n += 1
    return n


def call_plan(arrays, i):
    """The :class:`oracle.serving.Plan` of call ``i`` of the captured ``arrays`` (its sequences, reads and writes)."""
    key = f"call{i}_"
    o, q, pool = arrays[key + "got_o"], arrays[key + "input_q"], arrays[key + "got_pool"]
    B, T, HV, V = np.shape(o)
    return serving.plan((B, T, HV, np.shape(q)[3], V), np.shape(pool)[0], arrays[key + "state_indices"],
                        arrays.get(key + "cu_seqlens"), arrays.get(key + "num_accepted_tokens"))


def _log(r, log_range):
    """log10 of error / tolerance clipped to +-log_range (inf: the top; NaN: not judged, kept NaN)."""
    r = np.asarray(r, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.clip(np.log10(r), -log_range, log_range)
    return np.where(np.isinf(r), log_range, out)


def _over(r):
    """Where error / tolerance is over 1 or not finite (NaN is not judged: not over)."""
    r = np.asarray(r, np.float64)
    return np.isinf(r) | (np.nan_to_num(r, nan=0.0, posinf=np.inf) > 1)


def serving_grids(arrays, log_range=3.0):
    """``(o grid [sequences, columns], state grid [slots, calls], plans, column offsets of the calls, marks)`` of
    the captured ``arrays``; ``marks``: ``{"read": [(call, slot)], "changed": [(call, slot)], "padding": [(row of
    the o grid, column)]}`` (slots read; slots changed that the call does not write; nonzero outputs of padding)."""
    n = n_calls(arrays)
    plans = [call_plan(arrays, i) for i in range(n)]
    widths = [max([s.length for s in p.sequences] + [1]) for p in plans]
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(int)
    rows = max(len(p.sequences) for p in plans)
    P = np.shape(arrays["call0_got_pool"])[0]
    o_grid, state_grid = np.full((rows, offsets[-1]), np.nan), np.full((P, n), np.nan)
    marks = {"read": [], "changed": [], "padding": []}
    before = arrays.get("initial_pool")
    for i, p in enumerate(plans):
        key = f"call{i}_"
        ratio, got_o = np.asarray(arrays[key + "ratio_o"]), np.asarray(arrays[key + "got_o"], np.float64)
        for s in p.sequences:
            cols = offsets[i] + np.arange(s.length)
            o_grid[s.n, cols] = _log(ratio[s.row, s.start:s.start + s.length], log_range)
            if s.live:
                marks["read"].append((i, s.read))
            else:
                marks["padding"] += [(s.n, c) for c, x in zip(cols, got_o[s.row, s.start:s.start + s.length])
                                     if np.any(x != 0)]
        state_grid[:, i] = _log(arrays[key + "ratio_state"], log_range)
        after = np.asarray(arrays[key + "got_pool"])
        if before is not None:
            kept = np.setdiff1d(np.arange(P), p.written_slots)
            marks["changed"] += [(i, int(s)) for s in kept
                                 if not np.array_equal(np.asarray(before[s], np.float64), after[s], equal_nan=True)]
        before = after
    return o_grid, state_grid, plans, offsets, marks


def first_wrong(arrays, plans):
    """A line naming the first call with an output or a written state over its tolerance: its sequences (their
    accept counts and the slots they read) and slots; "" when none is."""
    for i, p in enumerate(plans):
        key = f"call{i}_"
        ratio = np.asarray(arrays[key + "ratio_o"])
        seqs = [s for s in p.sequences if s.length and _over(ratio[s.row, s.start:s.start + s.length]).any()]
        slots = np.flatnonzero(_over(arrays[key + "ratio_state"])).tolist()
        if not seqs and not slots:
            continue
        acc = arrays.get(key + "num_accepted_tokens")
        said = ", ".join(f"{s.n} (must read slot {s.read}" + (f", a={int(acc[s.n])}" if acc is not None else "") + ")"
                         for s in seqs[:6]) + (", ..." if len(seqs) > 6 else "")
        return (f"first over tolerance: call {i}" + (f", o of sequence(s) {said}" if seqs else "")
                + (f", state of slot(s) {', '.join(map(str, slots[:10]))}" + (", ..." if len(slots) > 10 else "")
                   if slots else ""))
    return ""


def _call_labels(arrays, n):
    """``(calls labelled, their labels)``: every call (with its accept counts) up to LABELLED_CALLS, else every k-th."""
    if n > LABELLED_CALLS:
        step = -(-n // LABELLED_CALLS)
        return list(range(0, n, step)), [str(i) for i in range(0, n, step)]
    labels = []
    for i in range(n):
        acc = arrays.get(f"call{i}_num_accepted_tokens")
        labels.append(f"call {i}" + (f"\na={','.join(str(int(a)) for a in acc)}" if acc is not None else ""))
    return list(range(n)), labels


def plot_serving(path, arrays, verdicts=(), *, title="", log_range=3.0):
    """A PNG of a serving case's captured ``arrays`` (module docstring): top, ``o`` per sequence and token, the
    calls side by side (boundaries drawn, each labelled with its accept counts ``a``), x a padding row's nonzero
    output; bottom, the state of each pool slot per call (written slots coloured), o the slots the call's
    sequences must read (the reference's), x a slot changed that the call does not write. Colour log10(error /
    tolerance), clipped to +-``log_range``; blank where nothing is judged. ``verdicts``: the case's (dicts), for the
    title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    o_grid, state_grid, plans, offsets, marks = serving_grids(arrays, log_range)
    n = len(plans)
    width = float(np.clip(5.0 + 0.22 * max(o_grid.shape[1], 2 * n), 8.0, 18.0))
    height = float(np.clip(2.8 + 0.22 * (o_grid.shape[0] + state_grid.shape[0]), 5.0, 14.0))
    fig, (ax_o, ax_s) = plt.subplots(2, 1, figsize=(width, height), layout="constrained",
                                     gridspec_kw={"height_ratios": [o_grid.shape[0] + 2, state_grid.shape[0] + 2]})
    cmap = plt.get_cmap("RdYlGn_r").with_extremes(bad="#ffffff")
    norm = TwoSlopeNorm(vmin=-log_range, vcenter=0.0, vmax=log_range)
    im = ax_o.imshow(o_grid, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax_s.imshow(state_grid, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    calls, labels = _call_labels(arrays, n)
    ax_o.set_xticks([(offsets[i] + offsets[i + 1] - 1) / 2 for i in calls], labels, fontsize=7)
    if n <= BOUNDED_CALLS:
        for x in offsets[1:-1]:
            ax_o.axvline(x - 0.5, color="#000000", lw=1.2)
    if o_grid.shape[0] <= 64:
        ax_o.set_yticks(range(o_grid.shape[0]), [f"seq {s}" for s in range(o_grid.shape[0])], fontsize=7)
    ax_o.set_ylabel("sequence")
    ax_o.set_title("o per sequence and token, calls side by side (x: padding output not 0)", fontsize=9, loc="left")
    if marks["padding"]:
        r, c = zip(*marks["padding"])
        ax_o.plot(c, r, "x", color="#6000a0", ms=6, mew=1.5, ls="none")
    ax_s.set_xticks(calls, labels, fontsize=7)
    P = state_grid.shape[0]
    if P <= 64:
        ax_s.set_yticks(range(P), [f"slot {s}" for s in range(P)], fontsize=7)
    ax_s.set_ylabel("pool slot")
    ax_s.set_title("state per written slot and call (o: a slot to read; x: changed, not written)", fontsize=9,
                   loc="left")
    for kind, style in (("read", dict(marker="o", mfc="none", mec="#000000", ms=6, mew=1.0)),
                        ("changed", dict(marker="x", color="#6000a0", ms=7, mew=1.8))):
        if marks[kind] and (kind != "read" or n <= BOUNDED_CALLS):  # reads of every call would hide the colours
            c, r = zip(*marks[kind])
            ax_s.plot(c, r, ls="none", **style)
    for ax in (ax_o, ax_s):
        ax.set_xlabel("call")
    cb = fig.colorbar(im, ax=[ax_o, ax_s], fraction=0.04, pad=0.02)
    cb.set_label("log10(error / tolerance)   (>0: over; top: NaN or inf)", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    grades = ", ".join(f"{v['name']} {v.get('grade', '')}" for v in verdicts)
    lines = (title + (f": {grades}" if grades else ""), first_wrong(arrays, plans))
    fig.suptitle("\n".join(textwrap.fill(x, int(width * 13)) for x in lines if x), fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["plot_serving", "serving_grids", "first_wrong", "call_plan", "n_calls"]
