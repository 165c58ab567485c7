"""``gdn2-oracle cost``: operation counts and a roofline TPU time ESTIMATE of a Pallas kernel (docs/DESIGN.md §8).

The counting and the chip figures are ``ci/running/cost_model.py``; this module is the command and its table.
"""

from __future__ import annotations

import argparse

from ..running.cost_model import CHIPS, estimate
from . import args as cli_args
from .output import EXIT, UsageError

TILE_KEYS = ("chunk_size", "split", "leaf")
HEADER = (f"{'method':<10} {'tiles':<22} {'chip':<4} {'dtype':<8} {'MXU GF':>9} {'VPU Gop':>9} {'exp G':>8} "
          f"{'HBM MB':>8} {'VMEM':>6} {'steps':>6} {'est ms':>9} {'serial':>9} {'bnd':>4}")


def format_row(e: dict) -> str:
    """One estimate as a table row."""
    c, s = e["counts"], e["seconds"]
    tiles = ",".join(f"{k}={v}" for k, v in e["tiles"].items()) or "default"
    return (f"{e['method']:<10} {tiles:<22} {e['chip']:<4} {e['dtype']:<8} "
            f"{sum(c['mxu_flops'].values()) / 1e9:9.1f} {c['vector_ops'] / 1e9:9.2f} {c['transcendentals'] / 1e9:8.3f} "
            f"{(c['hbm_read'] + c['hbm_write']) / 1e6:8.1f} {c['vmem_bytes'] / 2**20:6.1f} "
            f"{c['depth_per_chunk']:6.0f} {s['max'] * 1e3:9.3f} {s['serial'] * 1e3:9.3f} {s['bound']:>4}")


def parse_shape(text: str):
    """``B,T,H,K,V`` -> a 5-tuple of positive ints."""
    try:
        vals = tuple(int(t) for t in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 5 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected B,T,H,K,V (five positive ints), got {text!r}")
    return vals


def parse_tiles(text: str) -> dict:
    """One tile configuration in the ``--tiles`` grammar (``args.tiles``): one value per key."""
    grid = cli_args.tiles(text)
    out = {}
    for key, values in grid.items():
        if key not in TILE_KEYS:
            raise argparse.ArgumentTypeError(f"expected chunk_size=/split=/leaf= items, got {key!r}")
        if len(values) != 1:
            raise argparse.ArgumentTypeError(f"{key}: expected one value, got {values}")
        if values[0] is not None and (isinstance(values[0], bool) or not isinstance(values[0], int)):
            raise argparse.ArgumentTypeError(f"{key}: expected an int, got {values[0]!r}")
        out[key] = values[0]
    return out


def add_parser(sub):
    """``gdn2-oracle cost``."""
    p = sub.add_parser("cost", help="operation counts and a roofline TPU time ESTIMATE of a Pallas kernel",
                       description="Walk the kernel's traced forward+backward program (pallas_call bodies and "
                                   "grids): MXU FLOPs by dtype, vector and transcendental ops, dependent steps, "
                                   "HBM bytes, VMEM; a roofline ESTIMATE per chip (figures: docs/DESIGN.md §8) "
                                   "and the factorized / pairwise ratio.")
    p.add_argument("--kernel", default="pallas-factorized", choices=("pallas-factorized", "pallas-pairwise"))
    p.add_argument("--chip", action="append", choices=tuple(CHIPS), help="repeatable (default: all)")
    p.add_argument("--shape", type=parse_shape, default=(4, 4096, 6, 128, 128), metavar="B,T,H,K,V",
                   help="default 4,4096,6,128,128")
    p.add_argument("--dtype", type=cli_args.dtypes, default=["float32", "bfloat16"], metavar="LIST",
                   help="input dtypes, comma-separated (default float32,bfloat16)")
    p.add_argument("--tiles", type=parse_tiles, default={}, metavar="key=v,...",
                   help="tile options, e.g. chunk_size=128,leaf=32 (default: the kernel's defaults)")


def run(args) -> int:
    """Print the cost table of ``args.kernel`` and the estimated factorized / pairwise ratio."""
    method = args.kernel.removeprefix("pallas-")
    try:
        from gdn2_oracle.kernels.pallas import TileConfig  # Pallas only for this command

        TileConfig(method=method, **args.tiles)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--tiles: {exc}") from None
    print("ESTIMATE (roofline from published chip figures, not a measurement; docs/DESIGN.md §8)")
    print(f"shape B,T,H,K,V = {','.join(map(str, args.shape))}; forward + backward")
    print(HEADER)
    for chip in args.chip or tuple(CHIPS):
        for dt in args.dtype:
            e = estimate(method, args.shape, dt, chip, args.tiles)
            print(format_row(e))
            if method == "factorized":
                base = estimate("pairwise", args.shape, dt, chip)
                print(f"{'':<10} estimated factorized / pairwise ({chip}, {dt}): "
                      f"{e['seconds']['max'] / base['seconds']['max']:.3f} "
                      f"(pairwise {base['seconds']['max'] * 1e3:.3f} ms)")
    return EXIT["pass"]
