"""Regenerate (or check) the golden corpus from the mpmath oracle: the dense cases (``golden/catalogue.py``,
manifest section ``cases``), the training-call mode cases (``golden/mode_catalogue.py``, section
``mode_cases``) and the family cases (``golden/family_catalogue.py``, sections ``gdn_cases`` and ``kda_cases``),
one command for all; ``--case NAME`` takes a name of any.

    gdn2-oracle golden regenerate [--case NAME ...] [--jobs N] [--check] [--force] [--root DIR]

Without ``--check``: compute every selected case whose file is missing or out of date (its recipe
checksum, the generator version or the precision changed, or the file no longer matches the
manifest's sha256) -- all selected cases with ``--force`` -- write ``<root>/data/<case>.npz`` and
update ``<root>/MANIFEST.json``. When the whole catalogue is selected, files and manifest entries
of cases no longer in the catalogue are removed.

With ``--check``: recompute the selected cases and compare every stored array bit for bit (and
the file's sha256 with the manifest's); print each difference, naming the case and the array,
and exit 1 if there is any.

``main(argv)`` returns the exit status (0 ok, 1 differences/failures or a corrupt manifest, 2 usage
error, 130 interrupted). Regenerations may run concurrently (different ``--case``s): every manifest
update is a read-modify-write under an exclusive ``flock`` of the corpus directory, written to a
temporary file and moved into place (``os.replace``), so no entry is lost and no reader sees half a
file. An interrupted regeneration keeps every case it finished (file and manifest entry).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import time
from pathlib import Path

import mpmath
import numpy as np

from gdn2_oracle.oracle import GRADS, INPUTS, RESULTS, families_mp, mp
from gdn2_oracle.oracle.modes import mp_forward_and_vjp_modes

from . import catalogue, family_catalogue, mode_catalogue
from .catalogue import GENERATOR_VERSION, PRECISION_BITS
from .load import (
    FAMILY_ARRAY_ORDER,
    FAMILY_INPUT_ARRAYS,
    FAMILY_OPTIONAL_ARRAYS,
    FAMILY_OPTIONAL_INPUTS,
    FAMILY_RESULT_ARRAYS,
    FAMILY_SECTIONS,
    MODE_ARRAY_ORDER,
    MODE_OPTIONAL_ARRAYS,
    MODE_RESULT_ARRAYS,
    MODE_SECTION,
    SECTION,
    GoldenError,
    decode,
    encode,
    read_manifest,
    sha256,
)
from .processes import default_jobs, exit_status, is_interrupt, terminate_as_interrupt, terminate_workers
from .progress import Progress

PROG = "gdn2-oracle golden regenerate"

FORMAT = ("zip (stored) of .npy v1.0 float64 members in fixed order, dated 1980-01-01; "
          "err_<result> = max per-element |x_prec - x_2prec| (absolute); see golden/load.py")
MODE_FORMAT = ("as format, members in the order of golden/load.py MODE_ARRAY_ORDER, only those the call has "
               "(cu_seqlens, gate parameters, initial_state, intermediate_states, dA_log, ddt_bias)")
FAMILY_FORMAT = ("as format, members in the order of golden/load.py FAMILY_ARRAY_ORDER, only those the call has "
                 "(A_log, dt_bias, lower_bound, initial_state, dA_log, ddt_bias); results from oracle.families_mp")


# --- the catalogues -----------------------------------------------------------------------

def all_names() -> list[str]:
    """Every case: the dense catalogue's, then the mode catalogue's, then the family catalogue's."""
    return catalogue.names() + mode_catalogue.names() + family_catalogue.names()


def sections() -> dict:
    """``{manifest section: the names of the cases it holds}``, every section."""
    return {SECTION: catalogue.names(), MODE_SECTION: mode_catalogue.names(),
            **{sec: family_catalogue.names(f) for f, sec in FAMILY_SECTIONS.items()}}


def get_case(name):
    """The dense (``catalogue.Case``), mode (``mode_catalogue.ModeGoldenCase``) or family
    (``family_catalogue.FamilyGoldenCase``) case called ``name``."""
    for cat in (catalogue, mode_catalogue, family_catalogue):
        try:
            return cat.get(name)
        except ValueError:
            pass
    raise ValueError(f"golden: unknown case {name!r} ({len(catalogue.CASES)} cases, {len(mode_catalogue.CASES)} "
                     f"mode cases and {len(family_catalogue.CASES)} family cases; see `gdn2-oracle golden list`)")


def is_mode(case) -> bool:
    """Whether ``case`` is a mode case (a training call)."""
    return isinstance(case, mode_catalogue.ModeGoldenCase)


def is_family(case) -> bool:
    """Whether ``case`` is a family case (a KDA or Gated DeltaNet call)."""
    return isinstance(case, family_catalogue.FamilyGoldenCase)


def section(case) -> str:
    """The manifest section holding ``case``'s entry."""
    if is_family(case):
        return FAMILY_SECTIONS[case.family]
    return MODE_SECTION if is_mode(case) else SECTION


def generator_version(case) -> str:
    """The generator version of ``case``'s catalogue."""
    if is_family(case):
        return family_catalogue.GENERATOR_VERSION
    return mode_catalogue.GENERATOR_VERSION if is_mode(case) else GENERATOR_VERSION


# --- computing one case ---------------------------------------------------------------------

def compute(case) -> tuple[bytes, dict]:
    """``(file bytes, manifest entry)`` of one case (dense, mode or family), from the mpmath oracle at
    PRECISION_BITS."""
    if is_mode(case):
        return compute_mode(case)
    if is_family(case):
        return compute_family(case)
    p, do, dfs = case.build()
    fwd, grads = mp.forward_and_vjp(p, do, dfs, prec=PRECISION_BITS)
    arrays = {n: getattr(p, n) for n in INPUTS}
    arrays["scale"] = np.float64(p.scale)
    if p.initial_state is not None:
        arrays["initial_state"] = p.initial_state
    arrays.update(do=do, dfinal_state=dfs, o=fwd.o, final_state=fwd.final_state)
    arrays.update({n: getattr(grads, n) for n in GRADS})
    errors = {**fwd.errors, **grads.errors}
    data = encode(_with_estimates(arrays, errors, RESULTS))
    return data, _entry(case, data, arrays, errors, RESULTS)


def compute_mode(case: mode_catalogue.ModeGoldenCase) -> tuple[bytes, dict]:
    """``(file bytes, manifest entry)`` of one mode case, from ``oracle.modes.mp_forward_and_vjp_modes`` at
    PRECISION_BITS (the states at chunk starts at the recipe's ``intermediate_chunk_size``)."""
    call, do, dfs = case.build()
    fwd, grads = mp_forward_and_vjp_modes(call, do, dfs, prec=PRECISION_BITS)
    arrays = {n: getattr(call, n) for n in INPUTS}
    arrays["scale"] = np.float64(call.scale)
    if call.cu_seqlens is not None:
        arrays["cu_seqlens"] = call.cu_seqlens
    for n in ("A_log", "dt_bias", "lower_bound", "initial_state"):
        if getattr(call, n) is not None:
            arrays[n] = np.asarray(getattr(call, n), np.float64)
    arrays.update(do=do, dfinal_state=dfs)
    results = {**fwd._asdict(), **grads._asdict()}
    present = tuple(n for n in MODE_RESULT_ARRAYS if results[n] is not None)
    arrays.update({n: results[n] for n in present})
    errors = {**fwd.errors, **grads.errors}
    data = encode(_with_estimates(arrays, errors, present), MODE_ARRAY_ORDER, MODE_OPTIONAL_ARRAYS)
    return data, _entry(case, data, arrays, errors, present)


def compute_family(case: family_catalogue.FamilyGoldenCase) -> tuple[bytes, dict]:
    """``(file bytes, manifest entry)`` of one family case, from ``oracle.families_mp.forward_and_vjp`` at
    PRECISION_BITS."""
    fcall, do, dfs = case.build()
    fwd, grads = families_mp.forward_and_vjp(fcall, do, dfs, prec=PRECISION_BITS)
    arrays = {n: getattr(fcall, n) for n in FAMILY_INPUT_ARRAYS if n not in FAMILY_OPTIONAL_INPUTS}
    arrays["scale"] = np.float64(fcall.scale)
    for n in FAMILY_OPTIONAL_INPUTS:
        if getattr(fcall, n) is not None:
            arrays[n] = np.asarray(getattr(fcall, n), np.float64)
    arrays.update(do=do, dfinal_state=dfs)
    results = {"o": fwd.o, "final_state": fwd.final_state, **grads._asdict()}
    present = tuple(n for n in FAMILY_RESULT_ARRAYS if results[n] is not None)
    arrays.update({n: results[n] for n in present})
    errors = {**fwd.errors, **grads.errors}
    data = encode(_with_estimates(arrays, errors, present), FAMILY_ARRAY_ORDER, FAMILY_OPTIONAL_ARRAYS)
    return data, _entry(case, data, arrays, errors, present)


def _with_estimates(arrays, errors, results):
    """``arrays`` plus ``err_<result>``: the largest per-element estimate of each result (0-d)."""
    return {**arrays, **{f"err_{n}": np.float64(float(np.max(errors[n], initial=0.0))) for n in results}}


def _entry(case, data, arrays, errors, results) -> dict:
    """The manifest entry of a case's file: hashes, recipe, versions and the largest error estimates."""
    max_abs, max_rel, worst = 0.0, 0.0, None
    for n in results:
        err = float(np.max(errors[n], initial=0.0))
        ref = float(np.max(np.abs(arrays[n]), initial=0.0))
        rel = err / ref if ref > 0 else (0.0 if err == 0 else float("inf"))
        max_abs = max(max_abs, err)
        if worst is None or rel > max_rel:
            max_rel, worst = rel, n
    return {
        "sha256": sha256(data),
        "bytes": len(data),
        "recipe": case.fields(),
        "recipe_sha256": case.checksum(),
        "description": case.purpose,
        "generator_version": generator_version(case),
        "precision_bits": PRECISION_BITS,
        "mpmath_version": mpmath.__version__,
        "max_error_abs": max_abs,
        "max_error_rel": max_rel,
        "max_error_rel_array": worst,
    }


def _work(name: str):
    """Compute a case by name; returns ``(name, bytes, entry, seconds)``."""
    t0 = time.perf_counter()
    data, entry = compute(get_case(name))
    return name, data, entry, time.perf_counter() - t0


def _work_to_file(name: str, scratch: str) -> str:
    """Process-pool worker: :func:`_work`, its result pickled into a file in ``scratch``; returns the file's path.

    A worker's result crosses a pipe, and a worker stopped on Ctrl-C may be stopped in the middle of writing it: the
    pool's manager thread then waits for the rest of a message that never comes, and ``shutdown`` hangs (2 of 36
    interrupted runs on a loaded machine). A message of a path is shorter than ``PIPE_BUF`` and is written whole
    or not at all (and is sent only once the file is whole)."""
    path = os.path.join(scratch, f"{name}.pickle")
    with open(path, "wb") as f:
        pickle.dump(_work(name), f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _read_result(path: str):
    """The result :func:`_work_to_file` stored at ``path`` (the file is removed)."""
    with open(path, "rb") as f:
        result = pickle.load(f)
    os.unlink(path)
    return result


def _run_all(names, jobs, desc):
    """Yield ``_work`` results for ``names`` (largest first), in ``jobs`` processes, with progress."""
    order = sorted(names, key=lambda n: -get_case(n).cost())
    if not order:
        return
    bar = Progress(len(order), desc, unit="case")
    try:
        if jobs <= 1 or len(order) <= 1:
            for n in order:
                bar.set_postfix_str(n)
                result = _work(n)
                yield result  # counted once the caller has stored it (a progress line means "written")
                bar.set_postfix_str(f"{n} {result[3]:.1f}s")
                bar.update(1)
        else:
            yield from _in_pool(order, jobs, bar)
    finally:
        bar.close()


def _in_pool(order, jobs, bar):
    """:func:`_run_all`'s results from ``jobs`` spawned workers, through files in a scratch directory."""
    # spawn: never fork a process that may have started JAX's threads (the CLI, the tests)
    with tempfile.TemporaryDirectory(prefix="gdn2-golden-") as scratch:
        pool = cf.ProcessPoolExecutor(max_workers=jobs, initializer=_ignore_sigint,
                                      mp_context=multiprocessing.get_context("spawn"))
        futures = [pool.submit(_work_to_file, n, scratch) for n in order]
        try:
            for fut in cf.as_completed(futures):
                result = _read_result(fut.result())
                yield result
                bar.set_postfix_str(f"{result[0]} {result[3]:.1f}s")
                bar.update(1)
        except BaseException:  # interrupted (or a worker failed): stop the others now
            for fut in futures:
                fut.cancel()
            terminate_workers(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _ignore_sigint():
    """Worker initializer: Ctrl-C goes to the parent, which stops the workers (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# --- files ------------------------------------------------------------------------------------

def _write_atomic(path: Path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def manifest_text(manifest: dict) -> str:
    """Deterministic JSON of the manifest (sorted keys, indent 2, trailing newline)."""
    return json.dumps(manifest, sort_keys=True, indent=2, allow_nan=False) + "\n"


def _write_manifest(path: Path, manifest: dict):
    manifest["format"] = FORMAT
    if manifest.get(MODE_SECTION):
        manifest["mode_format"] = MODE_FORMAT
    else:  # a corpus without mode cases keeps the dense-only manifest
        manifest.pop(MODE_SECTION, None)
        manifest.pop("mode_format", None)
    for sec in FAMILY_SECTIONS.values():  # likewise each family's section, and the family format with the last
        if not manifest.get(sec):
            manifest.pop(sec, None)
    if any(sec in manifest for sec in FAMILY_SECTIONS.values()):
        manifest["family_format"] = FAMILY_FORMAT
    else:
        manifest.pop("family_format", None)
    _write_atomic(path, manifest_text(manifest).encode("utf-8"))


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive ``flock`` on ``directory`` (the corpus root, beside the manifest) while inside."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl  # POSIX only
    except ImportError:  # no flock (Windows): concurrent regenerations are not protected there
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_or_fresh(path: Path, fresh: bool) -> dict:
    """The manifest; with ``fresh``, an empty one in place of a corrupt file (``--force`` rebuilds it)."""
    try:
        return read_manifest(path)
    except GoldenError:
        if not fresh:
            raise
        return {SECTION: {}}


def update_manifest(path: Path, change, *, fresh_if_corrupt=False) -> dict:
    """Apply ``change(manifest)`` to the manifest at ``path`` under the corpus lock (read, modify and
    atomic write inside it, so concurrent regenerations never lose an entry); returns the manifest."""
    with _locked(path.parent):
        manifest = _read_or_fresh(path, fresh_if_corrupt)
        for sec in sections():
            manifest.setdefault(sec, {})
        change(manifest)
        _write_manifest(path, manifest)
    return manifest


def _up_to_date(case, entry, path: Path) -> bool:
    if not entry or not path.exists():
        return False
    if (entry.get("recipe_sha256") != case.checksum() or entry.get("generator_version") != generator_version(case)
            or entry.get("precision_bits") != PRECISION_BITS):
        return False
    return sha256(path.read_bytes()) == entry.get("sha256")


# --- commands ---------------------------------------------------------------------------------

def regenerate(names, *, root: Path, jobs=1, force=False, prune=False, out=None) -> int:
    """Recompute the out-of-date (``force``: all) cases of ``names`` into ``root``; 0, or 130 when
    interrupted (the cases finished so far are kept). A corrupt manifest raises :class:`GoldenError`
    unless ``force`` (which rebuilds it)."""
    out = out or sys.stdout
    data_dir, manifest_path = root / "data", root / "MANIFEST.json"
    if force:
        try:
            read_manifest(manifest_path)
        except GoldenError as exc:
            print(f"{exc}\n--force: starting a new manifest", file=sys.stderr)
    todo, fresh = [], {}

    def plan(manifest):
        for n in names:
            case = get_case(n)
            cases = manifest[section(case)]
            if force or not _up_to_date(case, cases.get(n), data_dir / f"{n}.npz"):
                todo.append(n)
            else:
                cases[n]["description"] = case.purpose
        if prune:
            keep = set(all_names())
            for sec, in_catalogue in sections().items():
                cases = manifest[sec]
                for n in sorted(set(cases) - set(in_catalogue)):
                    del cases[n]
                    print(f"removed manifest entry of {n!r} (no longer in the catalogue)", file=out)
            if data_dir.exists():
                for f in sorted(data_dir.glob("*.npz")):
                    if f.stem not in keep:
                        f.unlink()
                        print(f"removed {f} (no longer in the catalogue)", file=out)

    manifest = update_manifest(manifest_path, plan, fresh_if_corrupt=force)
    skipped = len(names) - len(todo)
    t0 = time.perf_counter()
    try:
        for name, data, entry, _ in _run_all(todo, jobs, "regenerate"):
            def add(m, name=name, data=data, entry=entry):
                _write_atomic(data_dir / f"{name}.npz", data)
                m[section(get_case(name))][name] = entry

            # after every case: an interrupted run keeps its work
            manifest = update_manifest(manifest_path, add, fresh_if_corrupt=force)
            fresh[name] = entry
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - only a signal's interrupt (else re-raised)
        if not is_interrupt(exc):
            raise
        print(f"{PROG}: interrupted; {len(fresh)} of {len(todo)} case(s) were finished and written "
              f"(files and manifest entries): {', '.join(fresh) or 'none'}", file=sys.stderr)
        return exit_status(exc)
    entries = [e for sec in sections() for e in manifest.get(sec, {}).values()]
    total = sum(e.get("bytes", 0) for e in entries)
    n_modes = len(manifest.get(MODE_SECTION, {}))
    n_families = sum(len(manifest.get(sec, {})) for sec in FAMILY_SECTIONS.values())
    print(f"golden: {len(todo)} regenerated, {skipped} up to date, {time.perf_counter() - t0:.1f}s; "
          f"corpus {len(entries) - n_modes - n_families} cases{f' + {n_modes} mode cases' if n_modes else ''}"
          f"{f' + {n_families} family cases' if n_families else ''}, {total / 1e6:.2f} MB", file=out)
    return 0


def check(names, *, root: Path, jobs=1, full=False, out=None) -> int:
    out = out or sys.stdout
    data_dir, manifest_path = root / "data", root / "MANIFEST.json"
    manifest = read_manifest(manifest_path)
    problems = []
    try:
        return _check(names, manifest, problems, data_dir=data_dir, jobs=jobs, full=full, out=out)
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - only a signal's interrupt (else re-raised)
        if not is_interrupt(exc):
            raise
        for p in problems:
            print(f"DIFFERENCE {p}", file=out)
        print(f"{PROG.replace('regenerate', 'check')}: interrupted; {len(problems)} difference(s) found "
              f"before the interrupt", file=sys.stderr)
        return exit_status(exc)


def _check(names, manifest, problems, *, data_dir, jobs, full, out):
    if full:
        for sec, in_catalogue in sections().items():
            problems += [f"{n}: in the manifest but not in the catalogue"
                         for n in sorted(set(manifest.get(sec, {})) - set(in_catalogue))]
        keep = set(all_names())
        if data_dir.exists():
            problems += [f"{f.stem}: file {f} is not in the catalogue" for f in sorted(data_dir.glob("*.npz"))
                         if f.stem not in keep]
    for name, data, entry, _ in _run_all(names, jobs, "check"):
        stored = manifest.get(section(get_case(name)), {}).get(name)
        problems += _compare(name, data, entry, stored, data_dir / f"{name}.npz")
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
    except Exception as exc:  # noqa: BLE001 - any damage is a reported difference
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


def _parser(prog=PROG):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
    ap.add_argument("--jobs", "-j", type=int, default=default_jobs(), help="worker processes (default: one a core)")
    ap.add_argument("--check", action="store_true", help="recompute and verify the stored goldens bit for bit")
    ap.add_argument("--force", action="store_true",
                    help="recompute even up-to-date cases (and rebuild a corrupt manifest)")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent,
                    help="directory holding data/ and MANIFEST.json (default: the golden package)")
    ap.add_argument("--list", action="store_true", help="list the catalogue's cases and exit")
    return ap


def main(argv=None, prog=PROG) -> int:
    """Run the command; returns the exit status (``prog`` names it in messages, e.g. ``gdn2-oracle golden check``)."""
    ap = _parser(prog)
    args = ap.parse_args(argv)
    if args.list:
        for c in catalogue.CASES:
            r = c.recipe
            print(f"{c.name:28s} {str(r.shape):22s} {r.decay:9s} {r.gates:11s} {r.precision:9s} "
                  f"{r.reduction or '':4s} {c.purpose}")
        for c in mode_catalogue.CASES:  # training calls: their modes in place of the reduction
            r = c.recipe
            print(f"{c.name:28s} {str(r.shape):22s} {r.decay:9s} {r.gates:11s} {r.precision:9s} "
                  f"modes {','.join(c.modes)}: {c.purpose}")
        for c in family_catalogue.CASES:  # family calls: the family and FLA's flags
            r = c.recipe
            print(f"{c.name:28s} {str(r.shape):22s} {r.decay:9s} {r.beta:11s} {r.precision:9s} "
                  f"family {c.family} {','.join(sorted(c.flags())) or '-'}: {c.purpose}")
        return 0
    if args.jobs < 1:
        print(f"{ap.format_usage()}{prog}: error: --jobs: expected a positive integer, got {args.jobs}",
              file=sys.stderr)
        return 2
    names = args.case or all_names()
    try:
        for n in names:
            get_case(n)
    except ValueError as exc:
        print(f"{ap.format_usage()}{prog}: error: --case: {exc}", file=sys.stderr)
        return 2
    names = list(dict.fromkeys(names))
    full = not args.case
    try:
        with terminate_as_interrupt():  # SIGTERM (a cancelled job, `timeout`) reports and stops the workers too
            if args.check:
                return check(names, root=args.root, jobs=args.jobs, full=full)
            return regenerate(names, root=args.root, jobs=args.jobs, force=args.force, prune=full)
    except GoldenError as exc:  # a corrupt manifest: say which file and how to restore it
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # an unwritable or unreadable corpus directory
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - only a signal's interrupt (else re-raised)
        if not is_interrupt(exc):
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return exit_status(exc)


if __name__ == "__main__":
    sys.exit(main())
