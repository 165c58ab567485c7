"""Regenerate (or check) the golden corpus from the mpmath oracle.

    gdn2-oracle golden regenerate [--case NAME ...] [--jobs N] [--check] [--force] [--root DIR]

Without ``--check``: compute every selected case whose file is missing or out of date (its recipe
checksum, the generator version or the precision changed, or the file no longer matches the
manifest's sha256) -- all selected cases with ``--force`` -- write ``<root>/data/<case>.npz`` and
update ``<root>/MANIFEST.json``. When the whole catalogue is selected, files and manifest entries
of cases no longer in the catalogue are removed.

With ``--check``: recompute the selected cases and compare every stored array bit for bit (and
the file's sha256 with the manifest's); print each difference, naming the case and the array,
and exit 1 if there is any.

``main(argv)`` returns the exit status (0 ok, 1 differences/failures, 2 usage error).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
from pathlib import Path

import mpmath
import numpy as np

from gdn2_oracle.oracle import GRADS, INPUTS, RESULTS, mp
from . import catalogue
from .catalogue import GENERATOR_VERSION, PRECISION_BITS
from .load import decode, encode, read_manifest, sha256

FORMAT = ("zip (stored) of .npy v1.0 float64 members in fixed order, dated 1980-01-01; "
          "err_<result> = max per-element |x_prec - x_2prec| (absolute); see golden/load.py")


# --- computing one case ---------------------------------------------------------------------

def compute(case: catalogue.Case) -> tuple[bytes, dict]:
    """``(file bytes, manifest entry)`` of one case, from the mpmath oracle at PRECISION_BITS."""
    p, do, dfs = case.build()
    fwd, grads = mp.forward_and_vjp(p, do, dfs, prec=PRECISION_BITS)
    arrays = {n: getattr(p, n) for n in INPUTS}
    arrays["scale"] = np.float64(p.scale)
    if p.initial_state is not None:
        arrays["initial_state"] = p.initial_state
    arrays.update(do=do, dfinal_state=dfs, o=fwd.o, final_state=fwd.final_state)
    arrays.update({n: getattr(grads, n) for n in GRADS})
    errors = {**fwd.errors, **grads.errors}
    max_abs, max_rel, worst = 0.0, 0.0, None
    for n in RESULTS:
        err = float(np.max(errors[n]))
        arrays[f"err_{n}"] = np.float64(err)
        ref = float(np.max(np.abs(arrays[n])))
        rel = err / ref if ref > 0 else (0.0 if err == 0 else float("inf"))
        max_abs = max(max_abs, err)
        if worst is None or rel > max_rel:
            max_rel, worst = rel, n
    data = encode(arrays)
    entry = {
        "sha256": sha256(data),
        "bytes": len(data),
        "recipe": case.fields(),
        "recipe_sha256": case.checksum(),
        "description": case.purpose,
        "generator_version": GENERATOR_VERSION,
        "precision_bits": PRECISION_BITS,
        "mpmath_version": mpmath.__version__,
        "max_error_abs": max_abs,
        "max_error_rel": max_rel,
        "max_error_rel_array": worst,
    }
    return data, entry


def _work(name: str):
    """Process-pool worker: compute a case by name; returns ``(name, bytes, entry, seconds)``."""
    t0 = time.perf_counter()
    data, entry = compute(catalogue.get(name))
    return name, data, entry, time.perf_counter() - t0


def _run_all(names, jobs, desc):
    """Yield ``_work`` results for ``names`` (largest first), in ``jobs`` processes, with progress."""
    order = sorted(names, key=lambda n: -catalogue.get(n).cost())
    if not order:
        return
    bar = _Progress(len(order), desc)
    try:
        if jobs <= 1 or len(order) <= 1:
            for n in order:
                bar.start(n)
                result = _work(n)
                bar.done(n, result[3])
                yield result
        else:
            with cf.ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(_work, n) for n in order]
                try:
                    for fut in cf.as_completed(futures):
                        result = fut.result()
                        bar.done(result[0], result[3])
                        yield result
                except BaseException:
                    for fut in futures:
                        fut.cancel()
                    raise
    finally:
        bar.close()


class _Progress:
    """tqdm when importable, else one line per finished case on stderr."""

    def __init__(self, total, desc):
        self.total, self.count, self.desc = total, 0, desc
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, desc=desc, unit="case", file=sys.stderr, dynamic_ncols=True)

    def start(self, name):
        if self.bar is not None:
            self.bar.set_postfix_str(name)

    def done(self, name, seconds):
        self.count += 1
        if self.bar is not None:
            self.bar.set_postfix_str(f"{name} {seconds:.1f}s")
            self.bar.update(1)
        else:
            print(f"{self.desc}: [{self.count}/{self.total}] {name} ({seconds:.1f}s)", file=sys.stderr)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# --- files ------------------------------------------------------------------------------------

def _write_atomic(path: Path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def manifest_text(manifest: dict) -> str:
    """Deterministic JSON of the manifest (sorted keys, indent 2, trailing newline)."""
    return json.dumps(manifest, sort_keys=True, indent=2, allow_nan=False) + "\n"


def _write_manifest(path: Path, manifest: dict):
    manifest["format"] = FORMAT
    _write_atomic(path, manifest_text(manifest).encode("utf-8"))


def _up_to_date(case, entry, path: Path) -> bool:
    if not entry or not path.exists():
        return False
    if (entry.get("recipe_sha256") != case.checksum() or entry.get("generator_version") != GENERATOR_VERSION
            or entry.get("precision_bits") != PRECISION_BITS):
        return False
    return sha256(path.read_bytes()) == entry.get("sha256")


# --- commands ---------------------------------------------------------------------------------

def regenerate(names, *, root: Path, jobs=1, force=False, prune=False, out=None) -> int:
    out = out or sys.stdout
    data_dir, manifest_path = root / "data", root / "MANIFEST.json"
    manifest = read_manifest(manifest_path)
    cases = manifest.setdefault("cases", {})
    todo = []
    for n in names:
        case = catalogue.get(n)
        if force or not _up_to_date(case, cases.get(n), data_dir / f"{n}.npz"):
            todo.append(n)
        else:
            cases[n]["description"] = case.purpose
    if prune:
        keep = set(catalogue.names())
        for n in sorted(set(cases) - keep):
            del cases[n]
            print(f"removed manifest entry of {n!r} (no longer in the catalogue)", file=out)
        if data_dir.exists():
            for f in sorted(data_dir.glob("*.npz")):
                if f.stem not in keep:
                    f.unlink()
                    print(f"removed {f} (no longer in the catalogue)", file=out)
    skipped = len(names) - len(todo)
    t0 = time.perf_counter()
    for name, data, entry, _ in _run_all(todo, jobs, "regenerate"):
        _write_atomic(data_dir / f"{name}.npz", data)
        cases[name] = entry
        _write_manifest(manifest_path, manifest)  # after every case: an interrupted run keeps its work
    _write_manifest(manifest_path, manifest)
    total = sum(e["bytes"] for e in cases.values())
    print(f"golden: {len(todo)} regenerated, {skipped} up to date, {time.perf_counter() - t0:.1f}s; "
          f"corpus {len(cases)} cases, {total / 1e6:.2f} MB", file=out)
    return 0


def check(names, *, root: Path, jobs=1, full=False, out=None) -> int:
    out = out or sys.stdout
    data_dir, manifest_path = root / "data", root / "MANIFEST.json"
    cases = read_manifest(manifest_path).get("cases", {})
    problems = []
    if full:
        keep = set(catalogue.names())
        problems += [f"{n}: in the manifest but not in the catalogue" for n in sorted(set(cases) - keep)]
        if data_dir.exists():
            problems += [f"{f.stem}: file {f} is not in the catalogue" for f in sorted(data_dir.glob("*.npz"))
                         if f.stem not in keep]
    for name, data, entry, _ in _run_all(names, jobs, "check"):
        problems += _compare(name, data, entry, cases.get(name), data_dir / f"{name}.npz")
    for p in problems:
        print(f"DIFFERENCE {p}", file=out)
    print(f"golden check: {len(names)} cases recomputed, "
          f"{'OK' if not problems else f'{len(problems)} difference(s)'}", file=out)
    return 1 if problems else 0


def _compare(name, data, entry, stored_entry, path: Path) -> list[str]:
    """Differences between a recomputed case and the stored one, each naming the case and what differs."""
    if stored_entry is None:
        return [f"{name}: not in the manifest"]
    if not path.exists():
        return [f"{name}: file {path} is missing"]
    diffs = []
    for key in ("recipe_sha256", "generator_version", "precision_bits"):
        if stored_entry.get(key) != entry[key]:
            diffs.append(f"{name}: manifest {key} {stored_entry.get(key)!r} != current {entry[key]!r}")
    stored_bytes = path.read_bytes()
    actual = sha256(stored_bytes)
    if actual != stored_entry.get("sha256"):
        diffs.append(f"{name}: file sha256 {actual} != manifest sha256 {stored_entry.get('sha256')}")
    try:
        stored = decode(stored_bytes)
    except Exception as exc:  # noqa: BLE001
        return diffs + [f"{name}: cannot read {path}: {type(exc).__name__}: {exc}"]
    fresh = decode(data)
    for n in sorted(set(fresh) | set(stored)):
        if n not in stored:
            diffs.append(f"{name}: array {n!r} missing from the stored file")
        elif n not in fresh:
            diffs.append(f"{name}: array {n!r} stored but not produced by the generator")
        else:
            a, b = fresh[n], stored[n]
            if a.shape != b.shape or a.dtype != b.dtype:
                diffs.append(f"{name}: array {n!r} is {b.dtype}{b.shape}, recomputed {a.dtype}{a.shape}")
            elif a.tobytes() != b.tobytes():
                ne = a != b
                worst = float(np.max(np.abs(a - b)))
                diffs.append(f"{name}: array {n!r} differs in {int(np.sum(ne))} of {a.size} elements "
                             f"(max abs diff {worst:.3e})")
    if not diffs and data != stored_bytes:
        diffs.append(f"{name}: arrays agree but the file bytes differ (format change?)")
    return diffs


def _parser():
    ap = argparse.ArgumentParser(prog="gdn2-oracle golden regenerate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--check", action="store_true", help="recompute and verify the stored goldens bit for bit")
    ap.add_argument("--force", action="store_true", help="recompute even up-to-date cases")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent,
                    help="directory holding data/ and MANIFEST.json (default: the golden package)")
    ap.add_argument("--list", action="store_true", help="list the catalogue's cases and exit")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for c in catalogue.CASES:
            r = c.recipe
            print(f"{c.name:28s} {str(r.shape):22s} {r.decay:9s} {r.gates:11s} {r.precision:9s} "
                  f"{r.reduction or '':4s} {c.purpose}")
        return 0
    if args.jobs < 1:
        print(f"--jobs: expected a positive integer, got {args.jobs}", file=sys.stderr)
        return 2
    names = args.case or catalogue.names()
    try:
        for n in names:
            catalogue.get(n)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    names = list(dict.fromkeys(names))
    full = not args.case
    if args.check:
        return check(names, root=args.root, jobs=args.jobs, full=full)
    return regenerate(names, root=args.root, jobs=args.jobs, force=args.force, prune=full)


if __name__ == "__main__":
    sys.exit(main())
