"""The repository's ``conftest.py`` deals the tests out to pytest-xdist's workers: each worker's slice of the
collection (worksteal hands worker i the i-th of n equal slices) begins with its share of the heavy modules, instead
of every heavy module going to the first worker."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def dealt():
    spec = importlib.util.spec_from_file_location("repository_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dealt


class Item:
    """A collected test: its module's path and whether it is in the release group."""

    def __init__(self, path, release):
        self.path, self.release = path, release

    def get_closest_marker(self, name):
        return object() if name == "release" and self.release else None

    def __repr__(self):
        return f"{self.path}{'*' if self.release else ''}"


def collection():
    """Four heavy modules (10, 6, 5 and 3 release tests) among light ones, heavy ones first as collected."""
    out = []
    for path, heavy, light in (("h10", 10, 2), ("h6", 6, 0), ("h5", 5, 1), ("h3", 3, 0)):
        out += [Item(path, True) for _ in range(heavy)] + [Item(path, False) for _ in range(light)]
    for path in ("a", "b", "c", "d", "e"):
        out += [Item(path, False) for _ in range(8)]
    return out


def test_each_workers_slice_begins_with_its_share_of_the_heavy_modules(dealt):
    items = collection()
    order = dealt(items, 2)
    assert sorted(map(id, order)) == sorted(map(id, items))  # every test once
    first, second = order[:len(order) // 2], order[len(order) // 2:]
    heavy = {s: [p for p in dict.fromkeys(i.path for i in s) if p.startswith("h")] for s in map(tuple, (first, second))}
    assert heavy[tuple(first)] == ["h10", "h3"] and heavy[tuple(second)] == ["h6", "h5"], heavy
    assert [i.path for i in first[:16]] == ["h10"] * 12 + ["h3"] * 3 + ["a"], first
    assert [i.path for i in second[:12]] == ["h6"] * 6 + ["h5"] * 6, second
    for path in {i.path for i in items}:  # a module's tests stay together, except where the first slice ends
        at = [k for k, i in enumerate(order) if i.path == path]
        runs = [k for k in at[1:] if k - 1 not in at]  # where a second run of the module's tests starts
        assert not runs or (len(runs) == 1 and len(order) // 2 - 1 in at), (path, order)


def test_one_worker_runs_the_heavy_modules_first(dealt):
    order = dealt(collection(), 1)
    assert list(dict.fromkeys(i.path for i in order)) == ["h10", "h6", "h5", "h3", "a", "b", "c", "d", "e"]


def test_without_heavy_modules_the_collection_order_stays(dealt):
    items = [i for i in collection() if not i.path.startswith("h")]
    assert dealt(items, 2) == items
