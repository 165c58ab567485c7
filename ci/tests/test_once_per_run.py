"""``ci.testing.once_per_run``: the interpreter fixtures' work (minutes each) is done once per pytest run, however
xdist deals out their modules' tests; a failed attempt leaves nothing behind."""

from __future__ import annotations

import threading
import time

import pytest

from gdn2_oracle.ci.testing import once_per_run


class Factory:
    """A stand-in for pytest's ``tmp_path_factory``: one base folder, as a worker of a run has."""

    def __init__(self, base):
        self.base = base

    def getbasetemp(self):
        return self.base


def test_two_workers_at_once_compute_it_once(tmp_path, monkeypatch):
    """Two workers of one run (their base folders side by side) asking at the same moment: one computes, the other
    waits for it and reads its result and files."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    calls, got = [], {}

    def compute(folder):
        calls.append(folder)
        time.sleep(0.3)
        (folder / "out.txt").write_text("done")
        return {"value": 42}

    def worker(name):
        base = tmp_path / name
        base.mkdir()
        result, folder = once_per_run(Factory(base), "work", compute)
        got[name] = (result, (folder / "out.txt").read_text())

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("popen-gw0", "popen-gw1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got == dict.fromkeys(("popen-gw0", "popen-gw1"), ({"value": 42}, "done")), (calls, got)


def test_a_failed_attempt_is_tried_again_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = Factory(tmp_path)

    def fails(folder):
        (folder / "partial.txt").write_text("half")
        raise RuntimeError("the subprocess failed")

    with pytest.raises(RuntimeError, match="the subprocess failed"):
        once_per_run(factory, "work", fails)
    seen = []
    result, folder = once_per_run(factory, "work", lambda f: seen.append(sorted(p.name for p in f.iterdir())) or 7)
    assert result == 7 and seen == [[]] and folder.parent == tmp_path
    assert once_per_run(factory, "work", lambda f: 8)[0] == 7  # done: never computed again in this run
