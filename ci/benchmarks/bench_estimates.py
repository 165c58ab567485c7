"""The estimate line against the measured time: runs ``validate`` on given kernels and sets (a script, not a test).

Each kernel runs in a fresh process with its own empty cache home (``XDG_CACHE_HOME``: JAX's compilation cache, the
program and reference caches), so the first run is *cold*; ``--warm`` runs it once more on the same home. Prints a
table: kernel, set, run, the time the line said (``ci/commands/validate.py``'s ``estimate_line``), the measured wall
time and their ratio (measured / said; the issue's goal: within 2x either way), and the per-case seconds with
``--cases-table``.

    python -m gdn2_oracle.ci.benchmarks.bench_estimates --kernel 'fla-gdn-chunk[interpret=1]' --dtype float32
    python -m gdn2_oracle.ci.benchmarks.bench_estimates --kernel gdn-factorized --warm --json est.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SAID = re.compile(r"about (\d+) (s|min)\b")


def said_seconds(line, warm=False):
    """The seconds an estimate line says (``about N s`` / ``about N min``): the first figure, the cold one, or with
    ``warm`` the second where the line gives one (compiled kernels); None without a figure."""
    figures = [int(n) * (60 if unit == "min" else 1) for n, unit in _SAID.findall(line or "")]
    if not figures:
        return None
    return figures[1] if warm and len(figures) > 1 else figures[0]


def run_validate(kernel, cases, dtype, home, extra=()):
    """One ``validate`` run in a fresh process on cache home ``home`` (``dtype`` None: every dtype): ``(estimate line,
    wall seconds, report, exit status)``, the report None when the run wrote none."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "validate.json"
        cmd = [str(Path(sys.executable).parent / "gdn2-oracle"), "validate", "--kernel", kernel, "--cases", cases,
               *(("--dtype", dtype) if dtype else ()), "--no-progress", "--json", str(report_path), *extra]
        env = {**os.environ, "XDG_CACHE_HOME": str(home)}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - t0
        line = next((s for s in proc.stdout.splitlines() + proc.stderr.splitlines()
                     if s.startswith("gdn2-oracle validate: starting")), None)
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    return line, wall, report, proc.returncode


def build_parser():
    """The script's arguments."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", action="append", required=True, help="a kernel spec (repeatable)")
    ap.add_argument("--cases", default="smoke", help="the set (default smoke)")
    ap.add_argument("--dtype", default="float32", help="validate's --dtype (default float32: interpreted peers "
                    "refuse bfloat16)")
    ap.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    ap.add_argument("--warm", action="store_true", help="run each kernel a second time on the same cache home")
    ap.add_argument("--cases-table", action="store_true", help="also print each case's seconds and shape")
    ap.add_argument("--json", help="write the rows here")
    return ap


def main(argv=None):
    """Run the kernels, print the table (and ``--json``)."""
    args = build_parser().parse_args(argv)
    extra = [a for name in args.case for a in ("--case", name)]
    rows = []
    print(f"{'kernel':50} {'set':6} {'run':5} {'said s':>7} {'measured s':>10} {'ratio':>6}")
    for kernel in args.kernel:
        with tempfile.TemporaryDirectory() as home:
            for run in ("cold", "warm") if args.warm else ("cold",):
                line, wall, report, _ = run_validate(kernel, args.cases, args.dtype, home, extra)
                said = said_seconds(line, warm=run == "warm")
                ratio = wall / said if said else None
                rows.append({"kernel": kernel, "set": args.cases, "run": run, "line": line, "said_s": said,
                             "measured_s": round(wall, 1), "ratio": ratio and round(ratio, 2),
                             "cases": [{"case": c.get("case"), "shape": c.get("shape"), "seconds": c.get("seconds")}
                                       for k in (report or {}).get("kernels", []) for c in k.get("cases", [])]})
                print(f"{kernel:50} {args.cases:6} {run:5} {said or '?':>7} {wall:10.1f} "
                      f"{f'{ratio:.2f}' if ratio else '?':>6}", flush=True)
                if args.cases_table:
                    for c in rows[-1]["cases"]:
                        print(f"    {c['case']:40} {str(c['shape']):28} {c['seconds']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
