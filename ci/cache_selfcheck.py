"""The program cache never changes a verdict: ``python -m gdn2_oracle.ci.cache_selfcheck`` (a step of ``make check``).

Validates a few kernels of ``kernels/testing_factory.py`` -- correct ones and deliberately wrong ones, all closures
of one factory, so nothing but their traced programs tells them apart -- twice in one program cache (a fresh
temporary one unless ``--cache DIR``), first correct-then-wrong, then wrong-then-correct, through the real command
(``gdn2-oracle validate`` in a subprocess, the default cached path). Prints a table and exits 0 only when on both
runs every wrong kernel got a grade other than PASS and every correct one PASS; 1 otherwise.

``validate()`` and :class:`Run` are also what the staleness battery (``ci/tests/test_program_cache_staleness.py``)
runs the command with.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gdn2_oracle.kernels import testing_factory

# The cheapest golden case every factory kernel is judged on: an initial state, K != V, two heads.
CASE, DTYPE = "kv_32x8", "float32"
KERNELS = ("good", "bad_01", "bad_06", "bad_14", "bad_16", "good_too")


@dataclass
class Run:
    """One ``gdn2-oracle validate`` run: its exit status, each kernel's verdict (by spec) and its output."""

    code: int
    kernels: dict = field(default_factory=dict)
    output: str = ""

    def grade(self, spec):
        """The grade of kernel ``spec`` (None when the run did not judge it)."""
        return (self.kernels.get(spec) or {}).get("grade")


def verdicts(report):
    """``{spec: {"grade": kernel grade, "results": {dtype/result: grade}}}`` of a validate JSON report."""
    out = {}
    for kernel in report.get("kernels", []):
        results = {f"{dtype}/{name}": entry["worst"]["grade"]
                   for dtype, per in kernel.get("summary", {}).items() for name, entry in per.items()}
        out[kernel["spec"]] = {"grade": kernel["grade"], "results": results}
    return out


def validate(specs, *, env, workdir, cached=True, report=True, timeout=900, **popen):
    """Run ``gdn2-oracle validate`` on ``specs`` (``CASE`` in ``DTYPE``) in a fresh interpreter with ``env``;
    ``cached=False`` adds ``--no-program-cache``; ``report=False``: no JSON report (no verdicts read).
    ``popen``: more of :func:`subprocess.run`'s arguments."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=workdir, prefix="run-")) / "validate.json"
    argv = [sys.executable, "-m", "gdn2_oracle.ci.cli", "validate", "--kernel", ",".join(specs), "--case", CASE,
            "--dtype", DTYPE, "--no-progress", *(["--json", str(path)] if report else []),
            *([] if cached else ["--no-program-cache"])]
    done = subprocess.run(argv, env=env, cwd=workdir, capture_output=True, text=True, timeout=timeout, **popen)
    try:
        kernels = verdicts(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        kernels = {}
    return Run(done.returncode, kernels, done.stdout + done.stderr)


def environment(cache):
    """This process's environment with the program cache in ``cache`` (the other caches as they are)."""
    return {**os.environ, "GDN2_PROGRAM_CACHE": str(cache)}


def check(cache, workdir):
    """``(rows, ok, runs)``: each kernel's expected and observed grades on two runs in one cache."""
    specs = [testing_factory.spec(n) for n in KERNELS]
    env = environment(cache)
    runs = [validate(specs, env=env, workdir=workdir), validate(specs[::-1], env=env, workdir=workdir)]
    rows, ok = [], True
    for name, spec in zip(KERNELS, specs):
        want_pass = name in testing_factory.GOOD
        got = [run.grade(spec) for run in runs]
        right = all((g == "PASS") == want_pass and g is not None for g in got)
        ok &= right
        rows.append((name, testing_factory.WHAT[name], "PASS" if want_pass else "not PASS", *got, right))
    return rows, ok, runs


def table(rows):
    """The rows as an aligned text table."""
    head = ("kernel", "what", "expected", "run 1", "run 2", "ok")
    cells = [head] + [(n, w, e, str(a), str(b), "yes" if ok else "NO") for n, w, e, a, b, ok in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def build_parser():
    """The command line: ``--cache DIR``."""
    parser = argparse.ArgumentParser(prog="python -m gdn2_oracle.ci.cache_selfcheck",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, help="the program cache to use (default: a fresh temporary directory)")
    return parser


def main(argv=None):
    """Run the check; exit 0 when every kernel got its expected grade on both runs."""
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gdn2-cache-selfcheck-") as tmp:
        rows, ok, runs = check(args.cache or Path(tmp) / "programs", Path(tmp) / "work")
        print(f"program cache self-check: {len(rows)} factory kernels, case {CASE} ({DTYPE}), two runs in one cache")
        print(table(rows))
        if not ok:
            for i, run in enumerate(runs, 1):
                print(f"\n--- run {i}: exit {run.code}\n{run.output[-3000:]}", file=sys.stderr)
        print("program cache self-check: " + ("ok" if ok else "FAILED: a verdict differs from the kernel's truth"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
