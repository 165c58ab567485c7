"""Every ``gdn2-oracle``, ``make``, ``pytest`` and ``python -m gdn2_oracle...`` command the documentation shows --
README.md and the pages ``docs/*.md`` (but :data:`EXCLUDED`) -- read from those files when the tests are
collected (code blocks, indented or fenced, with ``\\`` continuations; and inline code spans). Leading
environment assignments (``PYTHONPATH=. gdn2-oracle ...``, ``XLA_FLAGS=... pytest ...``) are kept with the
command. A command shown on several pages is checked once, under its first place (README first).

What is checked, and what is not:

* ``gdn2-oracle ...``: every command parses with the real argparse parser (``ci.cli.build_parser``;
  ``golden`` arguments with the golden parser); its kernel specs parse and name a registered kernel or a
  ``package.module:attr``, registered ones build (the optional peers only when installed), its
  ``--tiles`` pass ``bench.check_tiles`` and its ``--json``/``--plot`` paths ``output_path``. Then the
  cheap ones run for real, in-process, in a temporary directory: ``golden list``; ``golden regenerate``
  on a copy of the corpus (``--root``; nothing is out of date, so nothing is recomputed); ``golden
  check`` restricted to one case (``--case len_1``); ``validate`` with the work capped by appending
  ``--case len_1 --dtype float32``; ``bench`` with the shape, dtype and repeats overridden to a tiny
  problem and no tile sweep; ``hunt`` with a budget of 3; ``domain`` on a two-cell grid. Each must exit 0,
  except the deliberately wrong test kernels the docs show failing (:data:`EXPECTED_EXIT`). Commands naming
  a Pallas or peer kernel are only parsed and built (the Pallas interpreter is too slow here; the peers are
  an optional extra), and so are ``--distributed`` ones (ci/tests/test_multihost.py runs that option with
  two processes as two hosts) and those with an environment other than ``PYTHONPATH`` (``XLA_FLAGS`` must
  be set before JAX starts; ci/tests/test_mesh.py runs the 8-device mesh commands). The docs' placeholder
  ``mypkg.gdn:kernel`` is provided as a module wrapping our pairwise kernel (and ``chunk_gated_delta_rule``, our
  ``gdn-factorized``, for the family example), in the working directory (for
  ``PYTHONPATH=.``) and on ``sys.path``.
* ``make X``: ``X`` is a target of the Makefile and ``make -n X`` (a dry run, with the command's
  environment) succeeds; the targets themselves are what CI runs.
* ``python -m gdn2_oracle.ci.benchmarks.X ...``: the arguments parse with the script's ``build_parser()``;
  the oracle and kernel benchmarks then run in-process with a tiny shape appended (``SMALL``; the later
  option wins). The tolerance calibration (minutes: every regime, shape and seed) is only parsed.
* ``pytest ...``: each command collects (``--co``) in a subprocess with the plugin's options and the
  command's environment, so its options, kernels, profile and xfails file (the one README shows, written
  to a file) are accepted; the tests themselves are run by ``make test``.

And README.md is a front door: at most :data:`README_MAX_LINES` lines, with a table of contents whose links
resolve to its headings; every relative link of README.md and the pages (files, and ``#anchors`` of their
headings) resolves.
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

from gdn2_oracle import kernels, oracle
from gdn2_oracle.ci import cli
from gdn2_oracle.ci.commands import bench, domain, validate
from gdn2_oracle.ci.commands.output import output_path
from gdn2_oracle.ci.grading import references
from gdn2_oracle.golden import regenerate
from gdn2_oracle.kernels import KernelSpec
from gdn2_oracle.kernels.spec import split_specs

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
DOCS = REPO / "docs"
# Pages of docs/ whose commands are not checked, and why.
EXCLUDED = {
    "docs/DESIGN.md": "the design document: its command lines are grammar sketches ([--case NAME ...], a|b), "
                      "not commands",
}
PAGES = [README] + sorted(p for p in DOCS.glob("*.md") if p.relative_to(REPO).as_posix() not in EXCLUDED)
# Pages README links to that other engineers are still writing: a link to them may dangle until they land.
PENDING = {DOCS / "modes.md", DOCS / "serving.md"}
README_MAX_LINES = 220
PROGRAMS = ("gdn2-oracle", "make", "pytest", ".venv/bin/pytest", "python")
PLACEHOLDER_MODULE = "mypkg.gdn"  # the docs' example of a user's kernel module
# Kernels that cannot be built here: the atomic-ops peers (extra `peers`, not installed by make test)
# and FLA's Triton kernels (need CUDA); they are parsed only.
OPTIONAL = {"atomic-ops", "atomic-gdn2", "fla-gdn2-chunk", "fla-kda-chunk"}
# FLA's package modules import Triton; vLLM and SGLang are not installed here (their GDN kernels are FLA copies)
OPTIONAL_PREFIXES = ("torch:fla.", "torch:vllm.", "torch:sglang.")
# Environment a command may carry and still run in this process (the placeholder module is importable here).
IN_PROCESS_ENV = {"PYTHONPATH"}
# Deliberately wrong test kernels the docs show failing, and the exit status their commands must give.
EXPECTED_EXIT = {"gdn2_oracle.kernels.testing:restarting": cli.EXIT["fail"]}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def readme_commands(text):
    """``[(line, env, argv)]`` of the commands a Markdown ``text`` shows (programs in :data:`PROGRAMS`), with
    their leading environment assignments as ``env``."""
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
        env = {}
        while argv and ASSIGNMENT.match(argv[0]):
            key, value = argv.pop(0).split("=", 1)
            env[key] = value
        key = (tuple(sorted(env.items())), tuple(argv))
        if len(argv) >= 2 and argv[0] in PROGRAMS and key not in seen:
            seen.add(key)
            out.append((n, env, argv))
    return out


class Command:
    """A command shown in the docs: where (page, line), its environment and its argv."""

    def __init__(self, page, line, env, argv):
        self.page, self.line, self.env, self.argv = page, line, env, argv

    def __repr__(self):
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{self.page}:L{self.line}: {env + ' ' if env else ''}{' '.join(self.argv)}"


def doc_commands(pages=PAGES):
    """The commands of every page, each (environment and argv) once, under its first place."""
    out, seen = [], set()
    for page in pages:
        for n, env, argv in readme_commands(page.read_text(encoding="utf-8")):
            key = (tuple(sorted(env.items())), tuple(argv))
            if key not in seen:
                seen.add(key)
                out.append(Command(page.relative_to(REPO).as_posix(), n, env, argv))
    return out


COMMANDS = doc_commands()


def _param(c):
    return pytest.param(c, id=repr(c)[:110])


def _of(*programs):
    return [_param(c) for c in COMMANDS if c.argv[0] in programs]


def test_the_docs_show_commands_of_each_kind():
    assert {c.argv[0] for c in COMMANDS if c.page == "README.md"} >= {"gdn2-oracle", "make", "pytest"}
    assert {c.page for c in COMMANDS} > {"README.md"}, "no command of docs/*.md was found"
    assert readme_commands("    gdn2-oracle bench --kernel a \\\n        --batch 1   # comment\n`make test` and "
                           "`pytest --pyargs x\ny`\n`PYTHONPATH=. gdn2-oracle validate`\n") == [
        (1, {}, ["gdn2-oracle", "bench", "--kernel", "a", "--batch", "1"]), (3, {}, ["make", "test"]),
        (3, {}, ["pytest", "--pyargs", "x", "y"]), (5, {"PYTHONPATH": "."}, ["gdn2-oracle", "validate"])]


@pytest.fixture(scope="module")
def user_pkg(tmp_path_factory):
    """A directory on ``sys.path`` with the docs' placeholder kernel module (kept for the module, so the
    kernel is compiled once) and the xfails file README shows."""
    root = tmp_path_factory.mktemp("user")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "gdn.py").write_text(
        '"""A user\'s kernel module (README placeholders): our pairwise kernel, a Gated DeltaNet kernel."""\n'
        "from gdn2_oracle import kernels\n\nkernel = kernels.get('pairwise')\n"
        "chunk_gated_delta_rule = kernels.get('gdn-factorized')\n")
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
    """A fresh working directory (outputs land here) holding the user's package (for ``PYTHONPATH=.``) and
    xfails file, with the package importable in this process."""
    shutil.copy(user_pkg / "gdn2-xfails.txt", tmp_path / "gdn2-xfails.txt")
    shutil.copytree(user_pkg / "mypkg", tmp_path / "mypkg")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _kernel_specs(args):
    named = getattr(args, "kernel", None) or kernels.DEFAULTS
    return [KernelSpec.parse(k) for k in ([named] if isinstance(named, str) else named)]


@pytest.mark.parametrize("command", _of("gdn2-oracle"))
def test_gdn2_oracle_command_parses_and_its_arguments_are_valid(command, user_dir):
    argv = command.argv
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


def _buildable(argv):
    """Whether a command's kernels can be built here and it needs no other host: no peer or FLA kernel (the
    peers are optional, FLA's Triton kernels need CUDA, the KDA peers refuse most cases) and no
    ``--distributed`` (its other hosts: ci/tests/test_multihost.py runs two)."""
    return "--distributed" not in argv and not any(k.startswith(("atomic-", "fla-") + OPTIONAL_PREFIXES)
                                                   for a in argv for k in a.split(","))


# Kernels run under Triton's interpreter, which must not be enabled in a test worker (TRITON_INTERPRET cannot be
# undone): ci/tests/test_serving_judge.py and kernels/tests/test_fla_interpret.py run them in subprocesses.
INTERPRETED = "fla_fused_recurrent"


def _runnable(command):
    """Whether a command is cheap enough to run here in this process on ``--case len_1``: buildable, no Pallas
    kernel (the Pallas interpreter is slow) and no environment that must be set before JAX starts."""
    return (_buildable(command.argv) and set(command.env) <= IN_PROCESS_ENV
            and not any(k.startswith("pallas-") for a in command.argv for k in a.split(","))
            and not any(INTERPRETED in a for a in command.argv))


def _kernel_args(argv):
    return [spec for i, a in enumerate(argv[:-1]) if a == "--kernel" for spec in split_specs(argv[i + 1])]


def _attribute_family(spec):
    """The family a registered kernel declares by its ``family`` attribute (``replay-recurrent``: gdn), else None."""
    name = KernelSpec.parse(spec).name
    if name not in kernels.names():
        return None
    family = getattr(kernels.get(spec), "family", None)
    return family if family in oracle.families.MAPPED else None


def _first_case(argv):
    """The case a validate command is capped to: ``len_1``, or with ``--modes`` lacking ``dense`` the first case
    of its set and modes, or for a family kernel (``[family=...]``) the first case of its family."""
    modes = argv[argv.index("--modes") + 1] if "--modes" in argv else "dense"
    kind = argv[argv.index("--cases") + 1] if "--cases" in argv else "quick"
    families = [KernelSpec.parse(a).options.get("family") for a in argv if "family=" in a]
    families += [f for f in (_attribute_family(a) for a in _kernel_args(argv)) if f]
    if families:
        selected = validate.modes_arg(modes) if "dense" not in modes.split(",") else None
        return validate.build_cases(kind, ("float32",), families=families, modes=selected)[0].name
    if "dense" in modes.split(","):
        return "len_1"
    return validate.build_cases(kind, ("float32",), modes=validate.modes_arg(modes))[0].name


TINY = ["--batch", "1", "--seq", "32", "--heads", "1", "--dim", "16", "--dtype", "float32", "--repeats", "1",
        "--tiles", ""]


@pytest.mark.slow
@pytest.mark.parametrize("command", [p for p in _of("gdn2-oracle") if _runnable(p.values[0])])
def test_gdn2_oracle_command_runs(command, user_dir, tmp_path, capsys, monkeypatch):
    argv = command.argv
    subcommand = next(a for a in argv[1:] if not a.startswith("-"))  # after global options
    extra = []
    if subcommand == "validate":
        extra = ["--case", _first_case(argv), "--dtype", "float32"]
    elif subcommand == "bench":
        extra = TINY
    elif subcommand == "golden" and argv[2] == "regenerate":
        # a copy of the corpus; --force recomputes, so it is limited to the cheapest case
        root = tmp_path / "golden_copy"
        shutil.copytree(Path(regenerate.__file__).parent / "data", root / "data")
        shutil.copy(Path(regenerate.__file__).parent / "MANIFEST.json", root / "MANIFEST.json")
        extra = ["--root", str(root)] + (["--case", "len_1"] if "--force" in argv else [])
    elif subcommand == "golden" and argv[2] == "check":
        extra = ["--case", "len_1"]
    elif subcommand == "hunt":
        extra = ["--budget", "3", "--seed", "0", "--no-progress"]
    elif subcommand == "domain":  # both grids replaced by a two-cell one (ci/tests/test_domain.py maps for real)
        tiny = domain.Grid("quick", (domain.Axis("strength", "log-decay strength s", (0.1, 1.0)),),
                           seeds=1, base=domain.Point(T=16), shape=(1, 1, 8, 8))
        monkeypatch.setitem(domain.GRIDS, "quick", tiny)
        monkeypatch.setitem(domain.GRIDS, "full", tiny._replace(name="full"))
        family = domain.FamilyGrid("quick", decays=("moderate",), betas=("uniform", "near_two"), groups=(2,),
                                   shape=(1, 16, 2, 8, 8))  # a family kernel's map: two cells too
        monkeypatch.setitem(domain.FAMILY_GRIDS, "quick", family)
        monkeypatch.setitem(domain.FAMILY_GRIDS, "full", family._replace(name="full"))
        extra = ["--no-progress"]
    code = cli.main([*argv[1:], *extra])
    out, err = capsys.readouterr()
    expected = next((c for k, c in EXPECTED_EXIT.items() if any(k in a for a in argv)), 0)
    assert code == expected, out + err
    assert "Traceback" not in out + err
    if subcommand == "golden" and argv[2] == "regenerate":
        assert ("1 regenerated" if "--force" in argv else "0 regenerated") in out
    args = cli.build_parser().parse_args(argv[1:])
    for opt in ("json", "plot"):
        if getattr(args, opt, None):
            assert Path(getattr(args, opt)).stat().st_size > 0


MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w.-]*):", (REPO / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("command", _of("make"))
def test_make_command_names_a_target_that_dry_runs(command):
    targets = command.argv[1:]
    assert set(targets) <= MAKE_TARGETS, f"{targets} not in the Makefile's targets {sorted(MAKE_TARGETS)}"
    dry = subprocess.run(["make", "-n", *targets], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, **command.env})
    assert dry.returncode == 0, dry.stderr


# Collect each command in one process per environment (JAX is imported once): ``--pyargs`` ones from the
# user's directory (as a user runs them), the others (paths of this repository) from its root.
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
    groups = {}
    for c in (p.values[0] for p in _of("pytest", ".venv/bin/pytest")):
        if _buildable(c.argv):
            groups.setdefault(tuple(sorted(c.env.items())), []).append(
                (str(user_dir if "--pyargs" in c.argv else REPO), c.argv[1:]))
    assert groups
    for env, runs in groups.items():
        # PYTHONPATH=. in a command: "." is the user's directory, where the subprocess starts
        proc = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(runs)], capture_output=True, text=True,
                              timeout=600, cwd=user_dir, env={**os.environ, "PYTHONPATH": str(user_pkg), **dict(env)})
        codes = json.loads(proc.stdout.rsplit("CODES", 1)[1]) if "CODES" in proc.stdout else None
        assert codes == [0] * len(runs), (env, runs, proc.stdout[-3000:], proc.stderr[-3000:])


# Appended to the docs' benchmark commands so that they run in seconds (argparse: the later option wins),
# and what their output must then say.
SMALL = {
    "gdn2_oracle.ci.benchmarks.bench_oracle": (
        ["--numpy-shape", "2,16,2,4,4", "--mp-shape", "1,4,1,2,2", "--prec", "64", "--repeats", "1",
         "--yardstick", "1000", "--bandwidth-mib", "4"],
        r"numpy float64|mpmath"),
    "gdn2_oracle.ci.benchmarks.bench_kernels": (
        ["--batch", "1", "--seq", "32", "--heads", "1", "--dim", "8", "--chunk", "16", "--repeats", "1"],
        r"speed-up factorized vs pairwise"),
}
PYTHON_MODULES = [p for p in _of("python") if p.values[0].argv[1:2] == ["-m"]
                  and p.values[0].argv[2:3] and p.values[0].argv[2].startswith("gdn2_oracle.")]


def test_the_docs_show_python_module_commands():
    assert {p.values[0].argv[2] for p in PYTHON_MODULES} >= set(SMALL)


@pytest.mark.parametrize("command", PYTHON_MODULES)
def test_python_module_command_parses(command):
    argv = command.argv
    importlib.import_module(argv[2]).build_parser().parse_args(argv[3:])


@pytest.mark.parametrize("command", [p for p in PYTHON_MODULES if p.values[0].argv[2] in SMALL])
def test_python_module_command_runs_at_a_small_size(command, capsys, monkeypatch):
    argv = command.argv
    monkeypatch.setattr(references, "MIN_WORK", 0)  # --jobs N: really spawn the workers
    extra, expected = SMALL[argv[2]]
    importlib.import_module(argv[2]).main(argv[3:] + extra)
    out = capsys.readouterr().out
    assert re.search(expected, out), out
    if "--jobs" in argv:
        assert "identical bit for bit" in out, out


# --- README as a front door, and the links between the pages ------------------------------------------

def headings(text):
    """``[(level, title)]`` of a Markdown text's ATX headings (outside fenced code blocks)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#{1,6}) +(.*?) *#*$", line)):
            out.append((len(m.group(1)), m.group(2)))
    return out


def anchors(text):
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation dropped, spaces to
    hyphens, ``-1``, ``-2``, ... for repeats."""
    out, count = set(), {}
    for _, title in headings(text):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = count.get(slug, 0)
        count[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(text):
    """``[(line, target)]`` of a Markdown text's inline links and images (outside code)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or line.startswith("    "):
            continue
        line = re.sub(r"`[^`]*`", "", line)
        out += [(n, m.group(1)) for m in re.finditer(r"\]\(([^)\s]+)\)", line)]
    return out


def test_the_anchor_rules_follow_github():
    assert anchors("# A b\n## 4. How we judge a comparison\n### PyTorch kernels (`kernels/torch_bridge.py`)\n"
                   "## The oracle on every core (`--jobs`)\n## FLA's peers\n## A b\n```\n# not a heading\n```\n") == {
        "a-b", "4-how-we-judge-a-comparison", "pytorch-kernels-kernelstorch_bridgepy",
        "the-oracle-on-every-core---jobs", "flas-peers", "a-b-1"}


def test_readme_is_short_with_a_table_of_contents_that_resolves():
    text = README.read_text(encoding="utf-8")
    n_lines = len(text.splitlines())
    assert n_lines <= README_MAX_LINES, f"README.md has {n_lines} lines; the details belong in docs/"
    hs = headings(text)
    assert [t for lvl, t in hs if lvl == 2][:1] == ["Contents"], "README.md must open with '## Contents'"
    toc = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^\s*[-*] \[([^\]]+)\]\(#([^)]+)\)", toc, re.M)
    assert entries, "the table of contents lists no '- [Title](#anchor)' entries"
    own = anchors(text)
    assert [a for _, a in entries if a not in own] == [], "table-of-contents links to no heading of README.md"
    sections = [t for lvl, t in hs if lvl == 2 and t != "Contents"]
    assert [t for t, _ in entries] == sections, "the table of contents is not README.md's sections, in order"


LINKED_PAGES = [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    bad = []
    for n, target in links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            if dest not in PENDING:
                bad.append(f"L{n}: {target}: no file {dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"L{n}: {target}: no heading with the anchor #{anchor} in {dest.name}")
    assert bad == [], "\n".join(bad)
