"""What the reference cache saves, and that it changes no result (a script, not a timed test).

    python -m gdn2_oracle.ci.benchmarks.bench_reference_cache [--kernel factorized] [--cases quick] [--repeats 3]
    python -m gdn2_oracle.ci.benchmarks.bench_reference_cache --bits quick,golden,full --repeats 0

Timing: ``gdn2-oracle validate --kernel K --cases C`` in subprocesses on a fresh cache directory, one warm-up run
(it fills the reference cache and JAX's compilation cache), then ``--repeats`` pairs interleaved (cache read,
``--no-reference-cache``, ...) so load on the machine hits both alike: medians, their ratio, the oracle seconds the
cached run did not spend (``seconds_saved`` of its JSON report), and whether every run gave the same verdicts.

``--bits SETS``: for every dense and training-call case of those case sets, the reference, baselines, envelopes
and states at chunk starts computed with the cache bypassed, then through a cold cache (computed and stored),
then from the warm cache (read): the three must agree bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gdn2_oracle.ci.grading import reference_cache
from gdn2_oracle.oracle import RESULTS, call_modes

STATES = ("final_state", "dh0", "intermediate_states")  # results a kernel returns in float32 whatever its inputs


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="factorized", help="kernel spec validated (default factorized)")
    parser.add_argument("--cases", default="quick", help="validate's case set (default quick)")
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs (0: none)")
    parser.add_argument("--bits", default="", metavar="SETS",
                        help="case sets whose cached values are checked bit for bit, comma-separated")
    return parser


def _validate(kernel, cases, root, out, *extra):
    """``(wall seconds, JSON report)`` of one ``validate`` subprocess with the reference cache in ``root``."""
    env = {**os.environ, reference_cache.ENV: str(root)}
    argv = [sys.executable, "-m", "gdn2_oracle.ci.cli", "validate", "--kernel", kernel, "--cases", cases,
            "--no-progress", "--json", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"validate exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, json.loads(Path(out).read_text())


def _verdicts(report):
    return [[(c["case"], c["grade"], c["verdicts"]) for c in k["cases"]] for k in report["kernels"]]


def compare_timing(kernel, cases, repeats):
    """Warm-up, then ``repeats`` interleaved pairs: medians, ratio, seconds saved, same verdicts."""
    with tempfile.TemporaryDirectory(prefix="gdn2-refcache-") as tmp:
        root, out = Path(tmp) / "references", Path(tmp) / "v.json"
        _, first = _validate(kernel, cases, root, out)
        runs = {"cached": [], "bypassed": []}
        verdicts = [_verdicts(first)]
        for _ in range(repeats):
            for name, extra in (("cached", ()), ("bypassed", ("--no-reference-cache",))):
                wall, report = _validate(kernel, cases, root, out, *extra)
                runs[name].append((wall, report["environment"]["reference_cache"]))
                verdicts.append(_verdicts(report))
    med = {n: statistics.median(w for w, _ in r) for n, r in runs.items()}
    saved = statistics.median(p["seconds_saved"] for _, p in runs["cached"])
    read = runs["cached"][0][1]
    print(f"validate --kernel {kernel} --cases {cases}, {repeats} interleaved pairs after a warm-up run:")
    print(f"  reference cache read:     median {med['cached']:.1f} s (values read {read['from_cache']}, "
          f"computed {read['computed']}; oracle seconds saved, median {saved:.2f} s)")
    print(f"  --no-reference-cache:     median {med['bypassed']:.1f} s (values computed "
          f"{runs['bypassed'][0][1]['computed']})")
    print(f"  cached / bypassed:        {med['cached'] / med['bypassed']:.3f}; difference "
          f"{med['bypassed'] - med['cached']:.1f} s")
    print(f"  verdicts of all {len(verdicts)} runs identical: {all(v == verdicts[0] for v in verdicts)}")


def _values(case):
    """Every cached value of a dense or training-call case, for the result dtypes a kernel in its dtype returns."""
    names = case.names() if case.modes else RESULTS  # a case in a call mode judges the results its call has
    dt = {n: "float32" if n in STATES or case.dtype == "float32" else "bfloat16" for n in names}
    out = {"reference": case.reference(), "baseline": case.baseline(dt), "cumulative": case.cum_baseline(dt)}
    if case.modes:
        out["envelopes"] = case.envelopes()
    if "intermediate_states" in names:  # the states at chunk starts at a second chunk size too
        out["states_16"] = case.chunk_states(16)
    return out


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    x, y = np.asarray(a), np.asarray(b)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def check_bits(sets):
    """Bypassed, cold-cache and warm-cache values of every dense and training-call case agree bit for bit."""
    from gdn2_oracle.ci.commands.validate import build_cases
    from gdn2_oracle.ci.grading.modes import ALL_MODES

    with tempfile.TemporaryDirectory(prefix="gdn2-refcache-") as tmp:
        os.environ[reference_cache.ENV] = str(Path(tmp) / "references")
        for kind in sets:
            def fresh(kind=kind):
                """The case set's cases in the dense call and the training-call modes (no serving session)."""
                return build_cases(kind, modes=ALL_MODES)
            t0 = time.perf_counter()
            with reference_cache.bypassed():
                want = [_values(c) for c in fresh()]
            t1 = time.perf_counter()
            cold = [_values(c) for c in fresh()]
            t2 = time.perf_counter()
            before = reference_cache.snapshot()
            warm = [_values(c) for c in fresh()]
            t3 = time.perf_counter()
            d = reference_cache.STATS.since(before)
            bad = [i for i, (w, c, h) in enumerate(zip(want, cold, warm)) if not (_same(w, c) and _same(w, h))]
            print(f"--cases {kind}: {len(want)} {call_modes.BASE.name} and training-call cases; bypassed "
                  f"{t1 - t0:.1f} s, cold cache {t2 - t1:.1f} s, warm cache {t3 - t2:.1f} s ({d.from_cache} values "
                  f"read, {d.computed} computed); "
                  f"{'identical bit for bit' if not bad else f'{len(bad)} cases DIFFER'}")


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.bits:
        check_bits([s.strip() for s in args.bits.split(",") if s.strip()])
    if args.repeats > 0:
        compare_timing(args.kernel, args.cases, args.repeats)


if __name__ == "__main__":
    main()
