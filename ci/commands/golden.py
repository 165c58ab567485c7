"""``gdn2-oracle golden list|regenerate|check``: the golden corpus's own command (``golden/regenerate.py``)."""

from __future__ import annotations

import argparse


def add_parser(sub):
    """``gdn2-oracle golden``: its arguments are passed on to the regeneration script."""
    g = sub.add_parser("golden", help="regenerate or check the golden corpus (golden.regenerate)",
                       description="regenerate [--case NAME ...] [--jobs N] [--force]; "
                                   "check [--case NAME ...] [--jobs N]")
    g.add_argument("action", choices=("regenerate", "check", "list"))
    g.add_argument("args", nargs=argparse.REMAINDER, help="passed to gdn2-oracle golden regenerate")


def run(args):
    """Run the regeneration script with the action's flag; its exit status."""
    from gdn2_oracle.golden.regenerate import main as regenerate_main  # mpmath only here

    extra = list(args.args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    flag = {"check": ["--check"], "list": ["--list"]}.get(args.action, [])
    try:
        return regenerate_main([*flag, *extra], prog=f"gdn2-oracle golden {args.action}")
    except SystemExit as exc:  # its argparse exits on bad arguments
        return exc.code if isinstance(exc.code, int) else 2
