"""Every ``gdn2-oracle``, ``make`` and ``pytest`` command README.md shows, read from README.md when the
tests are collected (code blocks, indented or fenced, with ``\\`` continuations; and inline code spans).

What is checked, and what is not:

* ``gdn2-oracle ...``: every command parses with the real argparse parser (``ci.cli.build_parser``;
  ``golden`` arguments with the golden parser); its kernel specs parse and name a registered kernel or a
  ``package.module:attr``, registered ones build (the optional peers only when installed), its
  ``--tiles`` pass ``bench.check_tiles`` and its ``--json``/``--plot`` paths ``output_path``. Then the
  cheap ones run for real, in-process, in a temporary directory: ``golden list``; ``golden regenerate``
  on a copy of the corpus (``--root``; nothing is out of date, so nothing is recomputed); ``golden
  check`` restricted to one case (``--case len_1``); ``validate`` with the work capped by appending
  ``--case len_1 --dtype float32``; ``bench`` with the shape, dtype and repeats overridden to a tiny
  problem and no tile sweep. Commands naming a Pallas or peer kernel are only parsed and built (the
  Pallas interpreter is too slow here; the peers are an optional extra), and so are ``--distributed``
  ones (ci/tests/test_multihost.py runs that option with two processes as two hosts). The README's
  placeholder ``mypkg.gdn:kernel`` is provided as a module wrapping our pairwise kernel.
* ``make X``: ``X`` is a target of the Makefile and ``make -n X`` (a dry run) succeeds; the targets
  themselves are what CI runs.
* ``python -m gdn2_oracle.ci.benchmarks.X ...``: the arguments parse with the script's ``build_parser()``;
  the oracle and kernel benchmarks then run in-process with a tiny shape appended (``SMALL``; the later
  option wins). The tolerance calibration (minutes: every regime, shape and seed) is only parsed.
* ``pytest ...``: each command collects (``--co``) in a subprocess with the plugin's options, so its
  options, kernels, profile and xfails file (the one README shows, written to a file) are accepted;
  the tests themselves are run by ``make test``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci import cli
from gdn2_oracle.ci.commands import bench, domain
from gdn2_oracle.ci.grading import references
from gdn2_oracle.ci.commands.output import output_path
from gdn2_oracle.kernels import KernelSpec
from gdn2_oracle.golden import regenerate

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
PROGRAMS = ("gdn2-oracle", "make", "pytest", ".venv/bin/pytest", "python")
PLACEHOLDER_MODULE = "mypkg.gdn"  # README's example of a user's kernel module
# Kernels that cannot be built here: the atomic-ops peers (extra `peers`, not installed by make test)
# and FLA's Triton kernels (need CUDA); they are parsed only.
OPTIONAL = {"atomic-ops", "atomic-gdn2", "fla-gdn2-chunk", "fla-kda-chunk"}
OPTIONAL_PREFIXES = ("torch:fla.",)  # FLA's package modules import Triton


def readme_commands(text):
    """``[(line, argv)]`` of the commands README ``text`` shows (programs in :data:`PROGRAMS`)."""
    found, lines, prose, fenced, i = [], text.splitlines(), [], False, 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            start, cmd = i, line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            found.append((start + 1, cmd))
        else:
            prose.append((i + 1, line))
        i += 1
    joined = "\n".join(text for _, text in prose)
    starts = [n for n, _ in prose]
    for m in re.finditer(r"`([^`]+)`", joined):
        found.append((starts[joined.count("\n", 0, m.start())], m.group(1).replace("\n", " ")))
    out, seen = [], set()
    for n, cmd in sorted(found):
        try:
            argv = shlex.split(cmd, comments=True)
        except ValueError:
            continue
        if len(argv) >= 2 and argv[0] in PROGRAMS and tuple(argv) not in seen:
            seen.add(tuple(argv))
            out.append((n, argv))
    return out


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def _of(*programs):
    return [pytest.param(argv, id=f"L{n}:{' '.join(argv)[:70]}") for n, argv in COMMANDS if argv[0] in programs]


def test_the_readme_shows_commands_of_each_kind():
    assert {argv[0] for _, argv in COMMANDS} >= {"gdn2-oracle", "make", "pytest"}
    assert readme_commands("    gdn2-oracle bench --kernel a \\\n        --batch 1   # comment\n`make test` and "
                           "`pytest --pyargs x\ny`\n") == [
        (1, ["gdn2-oracle", "bench", "--kernel", "a", "--batch", "1"]), (3, ["make", "test"]),
        (3, ["pytest", "--pyargs", "x", "y"])]


@pytest.fixture(scope="module")
def user_pkg(tmp_path_factory):
    """A directory on ``sys.path`` with README's placeholder kernel module (kept for the module, so the
    kernel is compiled once) and the xfails file README shows."""
    root = tmp_path_factory.mktemp("user")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "gdn.py").write_text(
        '"""A user\'s kernel module (README placeholder): our pairwise kernel."""\n'
        "from gdn2_oracle import kernels\n\nkernel = kernels.get('pairwise')\n")
    (root / "mypkg" / "gdn_torch.py").write_text(
        '"""A user\'s PyTorch kernels (README placeholders): FLA\'s signature and a remapped one."""\n'
        "from gdn2_oracle.kernels.testing_torch import head_major_base2 as head_major\n"
        "from gdn2_oracle.kernels.testing_torch import recurrent as kernel\n")
    text = README.read_text(encoding="utf-8")
    block = re.search(r"^( +)# gdn2-xfails\.txt.*?(?=\n\S|\n\n)", text, re.M | re.S)
    (root / "gdn2-xfails.txt").write_text(block.group(0) if block else "")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


@pytest.fixture
def user_dir(user_pkg, tmp_path, monkeypatch):
    """A fresh working directory (outputs land here) with the user's package importable."""
    shutil.copy(user_pkg / "gdn2-xfails.txt", tmp_path / "gdn2-xfails.txt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _kernel_specs(args):
    named = getattr(args, "kernel", None) or kernels.DEFAULTS
    return [KernelSpec.parse(k) for k in ([named] if isinstance(named, str) else named)]


@pytest.mark.parametrize("argv", _of("gdn2-oracle"))
def test_gdn2_oracle_command_parses_and_its_arguments_are_valid(argv, user_dir):
    args = cli.build_parser().parse_args(argv[1:])
    if args.command == "golden":
        extra = {"check": ["--check"], "list": ["--list"]}.get(args.action, [])
        regenerate._parser().parse_args([*extra, *args.args])
        return
    specs = _kernel_specs(args)
    for spec in specs:
        assert spec.name in kernels.known() or ":" in spec.name, spec.spec
        if not _optional(spec.name):
            assert callable(spec.build())
    if args.command == "bench":
        bench.check_tiles([s for s in specs if not _optional(s.name)], args.tiles)
    for opt, name, suffixes in (("json", f"{args.command}.json", (".json",)), ("plot", "bench.png", (".png",))):
        if getattr(args, opt, None):
            output_path(getattr(args, opt), option=f"--{opt}", default_name=name, suffixes=suffixes)


def _optional(name):
    return name in OPTIONAL or name.startswith(OPTIONAL_PREFIXES)


def _runnable(argv):
    """Whether a README command is cheap enough to run here on ``--case len_1`` (no Pallas, peer or FLA
    kernel: the Pallas interpreter is slow, the peers optional, and the KDA peers refuse that case) in one
    process (``--distributed`` runs need their other hosts: ci/tests/test_multihost.py runs two)."""
    return "--distributed" not in argv and not any(k.startswith(("pallas-", "atomic-", "fla-", "torch:fla."))
                                                   for a in argv for k in a.split(","))


TINY = ["--batch", "1", "--seq", "32", "--heads", "1", "--dim", "16", "--dtype", "float32", "--repeats", "1",
        "--tiles", ""]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [p for p in _of("gdn2-oracle") if _runnable(p.values[0])])
def test_gdn2_oracle_command_runs(argv, user_dir, tmp_path, capsys, monkeypatch):
    command = next(a for a in argv[1:] if not a.startswith("-"))  # after global options
    extra = []
    if command == "validate":
        extra = ["--case", "len_1", "--dtype", "float32"]
    elif command == "bench":
        extra = TINY
    elif command == "golden" and argv[2] == "regenerate":
        # a copy of the corpus; --force recomputes, so it is limited to the cheapest case
        root = tmp_path / "golden_copy"
        shutil.copytree(Path(regenerate.__file__).parent / "data", root / "data")
        shutil.copy(Path(regenerate.__file__).parent / "MANIFEST.json", root / "MANIFEST.json")
        extra = ["--root", str(root)] + (["--case", "len_1"] if "--force" in argv else [])
    elif command == "golden" and argv[2] == "check":
        extra = ["--case", "len_1"]
    elif command == "hunt":
        extra = ["--budget", "3", "--seed", "0", "--no-progress"]
    elif command == "domain":  # both grids replaced by a two-cell one (ci/tests/test_domain.py maps for real)
        tiny = domain.Grid("quick", (domain.Axis("strength", "log-decay strength s", (0.1, 1.0)),),
                           seeds=1, base=domain.Point(T=16), shape=(1, 1, 8, 8))
        monkeypatch.setitem(domain.GRIDS, "quick", tiny)
        monkeypatch.setitem(domain.GRIDS, "full", tiny._replace(name="full"))
        extra = ["--no-progress"]
    code = cli.main([*argv[1:], *extra])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "Traceback" not in out + err
    if command == "golden" and argv[2] == "regenerate":
        assert ("1 regenerated" if "--force" in argv else "0 regenerated") in out
    args = cli.build_parser().parse_args(argv[1:])
    for opt in ("json", "plot"):
        if getattr(args, opt, None):
            assert Path(getattr(args, opt)).stat().st_size > 0


MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w.-]*):", (REPO / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("argv", _of("make"))
def test_make_command_names_a_target_that_dry_runs(argv):
    targets = argv[1:]
    assert set(targets) <= MAKE_TARGETS, f"{targets} not in the Makefile's targets {sorted(MAKE_TARGETS)}"
    dry = subprocess.run(["make", "-n", *targets], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr


# Collect each command in one process (JAX is imported once): ``--pyargs`` ones from the user's
# directory (as a user runs them), the others (paths of this repository) from its root.
COLLECT = """
import json, os, sys, pytest
codes = []
for cwd, argv in json.loads(sys.argv[1]):
    os.chdir(cwd)
    codes.append(int(pytest.main([*argv, "--co", "-q", "-p", "no:cacheprovider"])))
print("CODES", json.dumps(codes))
"""


@pytest.mark.slow
def test_pytest_commands_collect_with_their_options(user_dir, user_pkg):
    # Commands naming a kernel that cannot be built here (FLA's Triton kernels: CUDA only) cannot
    # collect: the suite builds its kernels at collection. Their kernel names are checked above.
    runs = [(str(user_dir if "--pyargs" in argv else REPO), argv[1:]) for argv in
            (p.values[0] for p in _of("pytest", ".venv/bin/pytest")) if _runnable(argv) or "pallas" in " ".join(argv)]
    assert runs
    proc = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(runs)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(user_pkg)})
    codes = json.loads(proc.stdout.rsplit("CODES", 1)[1]) if "CODES" in proc.stdout else None
    assert codes == [0] * len(runs), (runs, proc.stdout[-3000:], proc.stderr[-3000:])


# Appended to the README's benchmark commands so that they run in seconds (argparse: the later option wins),
# and what their output must then say.
SMALL = {
    "gdn2_oracle.ci.benchmarks.bench_oracle": (
        ["--numpy-shape", "2,16,2,4,4", "--mp-shape", "1,4,1,2,2", "--prec", "64", "--repeats", "1"],
        r"numpy float64|mpmath"),
    "gdn2_oracle.ci.benchmarks.bench_kernels": (
        ["--batch", "1", "--seq", "32", "--heads", "1", "--dim", "8", "--chunk", "16", "--repeats", "1"],
        r"speed-up factorized vs pairwise"),
}
PYTHON_MODULES = [p for p in _of("python") if p.values[0][1:2] == ["-m"]
                  and p.values[0][2].startswith("gdn2_oracle.")]


def test_the_readme_shows_python_module_commands():
    assert {p.values[0][2] for p in PYTHON_MODULES} >= set(SMALL)


@pytest.mark.parametrize("argv", PYTHON_MODULES)
def test_python_module_command_parses(argv):
    importlib.import_module(argv[2]).build_parser().parse_args(argv[3:])


@pytest.mark.parametrize("argv", [p for p in PYTHON_MODULES if p.values[0][2] in SMALL])
def test_python_module_command_runs_at_a_small_size(argv, capsys, monkeypatch):
    monkeypatch.setattr(references, "MIN_WORK", 0)  # --jobs N: really spawn the workers
    extra, expected = SMALL[argv[2]]
    importlib.import_module(argv[2]).main(argv[3:] + extra)
    out = capsys.readouterr().out
    assert re.search(expected, out), out
    if "--jobs" in argv:
        assert "identical bit for bit" in out, out
