"""The ``domain`` heat maps (PNG): one panel per sweep, rows = results, colour = log10(error / tolerance)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..grading.grades import FAIL, PASS, PRECISION
from .domain_report import panel_results


def _short(x):
    """Two significant digits, without an exponent from 10 to 1e6 (a tick label)."""
    return f"{float(f'{x:.2g}'):.0f}" if 10 <= x < 1e6 else f"{x:.2g}"


def _panel_image(ax, panel, names, cmap, norm, chunk):
    """Draw one sweep: rows = results, columns = swept values, colour = log10(error / tolerance)."""
    cells = panel["cells"]
    data = np.full((len(names), len(cells)), np.nan)
    for j, c in enumerate(cells):
        for i, n in enumerate(names):
            if c["results"] is not None and n in c["results"]:
                r = float(c["results"][n]["ratio"])  # inf (NaN/inf in a result, a raising kernel): "over"
                data[i, j] = norm.vmin if r <= 0 else 2 * norm.vmax if not math.isfinite(r) else np.log10(r)
    image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for j, c in enumerate(cells):
        for i, n in enumerate(names):
            g = c["results"][n]["grade"] if c["results"] is not None and n in c["results"] else PASS
            if g != PASS:
                ax.text(j, i, "x" if g == FAIL else "~", ha="center", va="center", fontsize=9, color="white",
                        fontweight="bold")
    strength = panel["field"] == "strength"
    labels = [f"{c['label']}\n{_short(c['span'])}" if strength else c["label"] for c in cells]
    ax.set_xticks(range(len(cells)), labels, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel(panel["label"] + (f"  /  {chunk}-token log-decay span" if strength else ""), fontsize=8)
    ax.set_title(f"{panel['label']} ({panel['dtype']})", fontsize=9)
    return image


def plot(report, path):
    """Heat maps (PNG): one panel per sweep, rows = results, colour = log10(error / tolerance), marks = grade."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    cmap = plt.get_cmap("RdYlGn_r").with_extremes(over="#3b0000", bad="#c8c8c8")
    norm = Normalize(vmin=-3, vmax=3)
    ps = report.panels
    if not ps:  # interrupted before the first cell, or no sweep the kernel accepts: a page that says so
        fig = plt.figure(figsize=(6, 1.5))
        fig.text(0.5, 0.5, f"{report.kernel}: no cell to map", ha="center", va="center")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    # Long sweeps take a whole row, short ones share a row two by two.
    rows = [[i, i] for i, p in enumerate(ps) if len(p["cells"]) > 8]
    short = [i for i, p in enumerate(ps) if len(p["cells"]) <= 8]
    rows += [[short[j], short[j + 1] if j + 1 < len(short) else "."] for j in range(0, len(short), 2)]
    width = max(12.0, 0.5 * max(len(p["cells"]) for p in ps))  # about half an inch per column
    fig, axes = plt.subplot_mosaic(rows, figsize=(width, 2.7 * len(rows) + 1.0), layout="constrained",
                                   empty_sentinel=".")
    images = [_panel_image(axes[i], p, panel_results(p), cmap, norm, report.chunk) for i, p in enumerate(ps)]
    fig.suptitle(f"{report.kernel}: error / tolerance ({report.grid} grid; x = {FAIL}, ~ = {PRECISION}, "
                 "grey = not judged)", fontsize=10)
    fig.colorbar(images[0], ax=list(axes.values()), orientation="horizontal", fraction=0.03, aspect=60,
                 extend="both", label="log10(error / tolerance)   (0 = at tolerance)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
