"""Code metrics of a source tree: lines per floor, the longest functions, wide signatures in ci/, noqa comments.

Not a test and not installed: a yardstick for clean-ups, run on a checkout before and after::

    python ci/benchmarks/code_metrics.py --root /path/to/checkout --json metrics.json

Prints, for the tree's ``.py`` files (``.venv*``, ``build``, hidden folders aside):

* source lines (non-blank, not comment-only) per floor -- oracle, kernels, golden, ci/grading, ci/running,
  ci/commands, ci (everything else under ci/), property_tests, other -- with the test files (any path with a
  ``tests`` folder) counted apart;
* the ten longest functions (``file:qualified name``, lines from ``def`` to the last line of the body);
* the functions in ``ci/`` (tests aside) with more than six parameters (``self``/``cls`` not counted);
* the ``noqa`` comments, how many name no rule code and how many give no reason (a reason is text after the
  rule codes, e.g. ``# noqa: BLE001 - a worker's failure is reported, not raised``).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

FLOORS = ("oracle", "kernels", "golden", "ci/grading", "ci/running", "ci/commands", "ci", "property_tests")
SKIP_DIRS = {"build", "dist", "__pycache__", "node_modules"}
MAX_PARAMS = 6
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)", re.IGNORECASE)
NOQA_CODES = re.compile(r"^\s*:\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)(?P<reason>.*)$")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the tree to measure (default: here)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--top", type=int, default=10, help="how many of the longest functions (default 10)")
    return parser


def python_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p.startswith(".") or p in SKIP_DIRS or p.startswith(".venv") for p in rel[:-1]):
            continue
        files.append(path)
    return files


def is_test(rel: str) -> bool:
    return "tests" in rel.split("/")[:-1]


def floor_of(rel: str) -> str:
    for floor in FLOORS:
        if rel.startswith(floor + "/"):
            return floor
    return "other"


def comments(source: str) -> list[tuple[int, str]]:
    try:
        return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []


def source_lines(source: str) -> int:
    comment_only = {line for line, _ in comments(source)}
    count = 0
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not (stripped.startswith("#") and number in comment_only):
            count += 1
    return count


def noqa_of(comment: str) -> dict | None:
    """``None`` for a comment without noqa; else whether it names a rule code and gives a reason."""
    match = NOQA.search(comment)
    if match is None:
        return None
    codes = NOQA_CODES.match(match.group("rest"))
    if codes is None:
        return {"codes": [], "reason": ""}
    reason = codes.group("reason").strip().lstrip("-:—–(").strip()
    return {"codes": [c.strip() for c in codes.group("codes").split(",")], "reason": reason}


def functions(tree: ast.AST):
    """(qualified name, node) for every function, nested ones too."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def measure(root: Path, top: int = 10) -> dict:
    lines = {floor: 0 for floor in (*FLOORS, "other")}
    test_lines = {floor: 0 for floor in (*FLOORS, "other")}
    files = {floor: 0 for floor in (*FLOORS, "other")}
    longest: list[tuple[int, str]] = []
    wide: list[tuple[int, str]] = []
    noqa = {"total": 0, "without_code": [], "without_reason": []}
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8", errors="replace")
        floor = floor_of(rel)
        count = source_lines(source)
        if is_test(rel):
            test_lines[floor] += count
        else:
            lines[floor] += count
            files[floor] += 1
        for line, comment in comments(source):
            found = noqa_of(comment)
            if found is None:
                continue
            noqa["total"] += 1
            where = f"{rel}:{line}"
            if not found["codes"]:
                noqa["without_code"].append(where)
            if not found["reason"]:
                noqa["without_reason"].append(where)
        if is_test(rel):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for name, node in functions(tree):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            longest.append((length, f"{rel}:{name}"))
            if rel.startswith("ci/") and parameter_count(node) > MAX_PARAMS:
                wide.append((parameter_count(node), f"{rel}:{name}"))
    longest.sort(key=lambda item: (-item[0], item[1]))
    wide.sort(key=lambda item: (-item[0], item[1]))
    return {
        "root": str(root),
        "source_lines": lines,
        "source_lines_total": sum(lines.values()),
        "source_files": files,
        "test_lines": test_lines,
        "test_lines_total": sum(test_lines.values()),
        "longest_functions": [{"function": name, "lines": n} for n, name in longest[:top]],
        "functions": len(longest),
        "wide_functions_ci": [{"function": name, "parameters": n} for n, name in wide],
        "noqa": {"total": noqa["total"], "without_code": len(noqa["without_code"]),
                 "without_reason": len(noqa["without_reason"]),
                 "where_without_reason": noqa["without_reason"]},
    }


def format_report(figures: dict) -> str:
    out = [f"tree: {figures['root']}", "", f"{'floor':<16}{'source':>8}{'files':>7}{'tests':>8}"]
    for floor, count in figures["source_lines"].items():
        out.append(f"{floor:<16}{count:>8}{figures['source_files'][floor]:>7}{figures['test_lines'][floor]:>8}")
    out.append(f"{'total':<16}{figures['source_lines_total']:>8}{sum(figures['source_files'].values()):>7}"
               f"{figures['test_lines_total']:>8}")
    out += ["", f"longest functions (of {figures['functions']}, tests aside):"]
    out += [f"  {row['lines']:>5}  {row['function']}" for row in figures["longest_functions"]]
    out += ["", f"functions in ci/ with more than {MAX_PARAMS} parameters: {len(figures['wide_functions_ci'])}"]
    out += [f"  {row['parameters']:>5}  {row['function']}" for row in figures["wide_functions_ci"]]
    noqa = figures["noqa"]
    out += ["", f"noqa comments: {noqa['total']}, without a rule code: {noqa['without_code']}, "
                f"without a reason: {noqa['without_reason']}"]
    out += [f"  {where}" for where in noqa["where_without_reason"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    figures = measure(args.root.resolve(), top=args.top)
    print(format_report(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
