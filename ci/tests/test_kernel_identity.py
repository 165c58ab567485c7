"""Two kernel objects that compare equal are two kernels: each is traced, compiled and judged on its own.

A frozen dataclass kernel with a field left out of ``__eq__`` (``out_scale``) makes ``good == bad`` although ``bad``
scales ``o`` by 1.5. Programs compiled ahead (``ci/running/ahead.py``), their signatures and ``validate``'s keys are
held per kernel *object* (``per_kernel.Identity``), so ``bad`` never runs ``good``'s program nor the other way,
with or without the program cache, in either order.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.running.ahead import Ahead
from gdn2_oracle.ci.testing import console

EXIT_FAIL = 1

MODULE = """\
from dataclasses import dataclass, field

from gdn2_oracle import kernels

_pairwise = kernels.get("pairwise")


@dataclass(frozen=True)
class Kernel:
    out_scale: float = field(default=1.0, compare=False)

    def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, s = _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        return o * self.out_scale, s


good = Kernel()
bad = Kernel(out_scale=1.5)
"""


def validate(tmp_path, kernels, *extra):
    """``(exit status, {kernel: grade}, output)`` of the console script ``validate`` on one small golden case, with
    fresh caches under ``tmp_path`` and the module :data:`MODULE` on ``PYTHONPATH``."""
    (tmp_path / "eqkernel.py").write_text(MODULE)
    proc = console(tmp_path, "validate", "--kernel", ",".join(f"eqkernel:{k}" for k in kernels), "--case", "kv_32x8",
                   "--dtype", "float32", *extra, timeout=300, PYTHONPATH=str(tmp_path))
    out = proc.stdout + proc.stderr
    grades = dict(re.findall(r"^eqkernel:(\w+): (\w+) \(", out, re.MULTILINE))
    return proc.returncode, grades, out


@pytest.mark.parametrize("cache", [True, False], ids=["program-cache", "no-program-cache"])
@pytest.mark.parametrize("order", [("good", "bad"), ("bad", "good")], ids=["good-first", "bad-first"])
def test_equal_kernel_objects_are_judged_each_on_its_own_program(tmp_path, order, cache):
    code, grades, out = validate(tmp_path, order, *(() if cache else ("--no-program-cache",)))
    assert grades == {"good": "PASS", "bad": "FAIL"}, out
    assert code == EXIT_FAIL, out


def _equal_pair():
    """Two kernels that compare equal (one hash) but differ: the second scales ``o`` by 1.5."""
    class Kernel:
        def __init__(self, out_scale):
            self.out_scale = out_scale

        def __eq__(self, other):
            return isinstance(other, Kernel)

        def __hash__(self):
            return 0

        def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None):
            from gdn2_oracle.kernels import get

            o, s = get("pairwise[chunk_size=16]")(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
            return o * self.out_scale, s

    return Kernel(1.0), Kernel(1.5)


def test_ahead_keeps_a_program_per_kernel_object():
    from gdn2_oracle.ci.running.per_kernel import Identity

    good, bad = _equal_pair()
    assert good == bad and Identity(good) != Identity(bad) and Identity(good) == Identity(good)
    p = oracle.make_problem(1, 16, 1, 8, 8, decay="moderate", seed=0)
    do, dfs = oracle.random_cotangents(p)
    assert harness.program_signature(good, p, "float32") != harness.program_signature(bad, p, "float32")

    def prepare(fn):
        return harness.program_signature(fn, p, "float32"), lambda: harness.lower(fn, p, "float32")

    with Ahead([((Identity(fn), 0), functools.partial(prepare, fn)) for fn in (good, bad)], workers=1) as ahead:
        got = {name: harness.kernel_results(fn, p, do, dfs, program=lambda fn=fn: ahead.compiled((Identity(fn), 0)))
               for name, fn in (("good", good), ("bad", bad))}
    np.testing.assert_allclose(got["bad"]["o"], 1.5 * got["good"]["o"], rtol=1e-5)  # not good's program
    np.testing.assert_array_equal(got["bad"]["final_state"], got["good"]["final_state"])


def test_identity_is_the_object_not_its_value():
    from gdn2_oracle.ci.running.per_kernel import Identity

    obj = [1, 2]  # unhashable itself: the handle hashes by identity
    handle = Identity(obj)
    assert handle.obj is obj and handle == Identity(obj) and hash(handle) == hash(Identity(obj))
    assert handle != Identity([1, 2]) and handle != obj
