"""A program holding a primitive lowered by the user's own rule is never stored in the program cache.

The program key (``ci/running/program_key.py``) writes what was traced; a lowering rule is not traced, and the key
covers only the versions of installed distributions. So a primitive whose lowering rule is user code (here
``x * FACTOR``, FACTOR read from the environment when the module is imported) could come back from the cache with
another run's FACTOR. Such a program is unkeyable, like a host callback: lowered every run, never stored.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from gdn2_oracle import kernels, oracle
from gdn2_oracle.ci.running import harness, program_cache, program_key
from gdn2_oracle.ci.testing import console

EXIT_PASS, EXIT_FAIL = 0, 1

MODULE = """\
import os

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from gdn2_oracle import kernels

FACTOR = float(os.environ["FACTOR"])
_pairwise = kernels.get("pairwise")

scaled_p = Primitive("user_scaled")
scaled_p.def_abstract_eval(lambda x: x)
scaled_p.def_impl(lambda x: x * FACTOR)
mlir.register_lowering(scaled_p, mlir.lower_fun(lambda x: x * FACTOR, multiple_results=False))


@jax.custom_jvp
def scaled(x):
    return scaled_p.bind(x)


@scaled.defjvp
def _scaled_jvp(primals, tangents):
    return scaled(primals[0]), tangents[0]


def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return scaled(o), s
"""


def validate(tmp_path, factor, kernels="userlowered:kernel"):
    """``(exit status, {kernel: grade}, output)`` of the console script ``validate`` on one small golden case in
    the program cache ``tmp_path/programs``, the module :data:`MODULE` on ``PYTHONPATH`` and env FACTOR=``factor``."""
    (tmp_path / "userlowered.py").write_text(MODULE)
    proc = console(tmp_path, "validate", "--kernel", kernels, "--case", "kv_32x8", "--dtype", "float32", timeout=300,
                   PYTHONPATH=str(tmp_path), FACTOR=factor)
    out = proc.stdout + proc.stderr
    return proc.returncode, dict(re.findall(r"^(\S+): (\w+) \(\d+/", out, re.MULTILINE)), out


def test_a_user_lowering_rule_is_never_read_back_from_the_program_cache(tmp_path):
    code, grades, out = validate(tmp_path, "1.0", "userlowered:kernel,pairwise")
    assert (code, grades) == (EXIT_PASS, {"userlowered:kernel": "PASS", "pairwise": "PASS"}), out
    stored = sorted((tmp_path / "programs").glob("*.exported"))
    code, grades, out = validate(tmp_path, "1.5")
    assert (code, grades) == (EXIT_FAIL, {"userlowered:kernel": "FAIL"}), out
    assert len(stored) == 1, f"pairwise's program only, never the user-lowered one: {stored}"
    assert sorted((tmp_path / "programs").glob("*.exported")) == stored


@pytest.fixture
def user_primitive(tmp_path, monkeypatch):
    """The kernel of :data:`MODULE` (FACTOR 1.0), imported in this process from ``tmp_path``."""
    (tmp_path / "userlowered_inproc.py").write_text(MODULE.replace('scaled_p = Primitive("user_scaled")',
                                                                   'scaled_p = Primitive("user_scaled_inproc")'))
    monkeypatch.setenv("FACTOR", "1.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    import userlowered_inproc

    yield userlowered_inproc
    sys.modules.pop("userlowered_inproc", None)


def test_the_key_names_the_user_lowered_primitive(user_primitive, tmp_path, monkeypatch):
    monkeypatch.setenv(program_cache.ENV, str(tmp_path / "programs"))
    p = oracle.make_problem(1, 16, 1, 8, 8, decay="moderate", seed=0)
    traced = harness.runner(user_primitive.kernel).trace(*harness.device_inputs(p, *oracle.random_cotangents(p)),
                                                         p.scale)
    with pytest.raises(program_key.Unkeyable, match="user_scaled_inproc.*lowering rule.*userlowered_inproc"):
        program_key.sha256(traced.jaxpr)
    before = program_cache.STATS["unkeyable"]
    harness.lower(user_primitive.kernel, p, "float32", cache=True)
    assert program_cache.STATS["unkeyable"] == before + 1
    assert not list((tmp_path / "programs").glob("*.exported"))


VARIANTS = """\
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.lax import sin_p  # JAX's own primitive, held here too: still JAX's


def own_rule(ctx, x):
    return mlir.lower_fun(lambda y: y * 2, multiple_results=False)(ctx, x)


by_rule_p = Primitive("variant_by_rule")  # lowered by a rule written here
mlir.register_lowering(by_rule_p, own_rule)
jax_rule_p = Primitive("variant_jax_rule")  # defined here, lowered by JAX's own function
mlir.register_lowering(jax_rule_p, mlir.lower_fun(jnp.sin, multiple_results=False))
cpu_rule_p = Primitive("variant_cpu_rule")  # defined here, a rule for one platform only
mlir.register_lowering(cpu_rule_p, own_rule, platform="cpu")
unlowered_p = Primitive("variant_unlowered")  # no rule registered: nothing to lower by
"""


@pytest.mark.parametrize(("name", "why"), [
    ("by_rule_p", r"variant_by_rule: its lowering rule \(own_rule\) is user code \(.*userlowered_variants.py\)"),
    ("jax_rule_p", "variant_jax_rule is defined in the user module userlowered_variants, with a lowering rule"),
    ("cpu_rule_p", r"variant_cpu_rule: its lowering rule \(own_rule\) is user code"),
    ("unlowered_p", None), ("sin_p", None)])
def test_which_primitives_are_lowered_by_user_code(tmp_path, monkeypatch, name, why):
    (tmp_path / "userlowered_variants.py").write_text(VARIANTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "userlowered_variants", raising=False)
    import userlowered_variants

    try:
        got = program_key.user_lowering(getattr(userlowered_variants, name))
    finally:
        sys.modules.pop("userlowered_variants", None)
    if why is None:
        assert got is None
    else:
        assert got is not None and re.search(why, got), got


def test_installed_file_refuses_a_non_name():
    assert program_key.installed_file(os.__file__) and not program_key.installed_file(__file__)
    assert not program_key.installed_file("<string>")
    with pytest.raises(ValueError, match="filename"):
        program_key.installed_file(None)


def test_a_key_that_cannot_be_formed_is_the_cache_s_loss_never_the_kernel_s(tmp_path, monkeypatch):
    """Before: an error of the key's own walk (``dictionary changed size during iteration`` while another thread
    imported a module, 1 run in 20) was raised as the kernel's error and graded FAIL. Now the program is lowered
    as usual, nothing is stored, a warning says why, and the kernel is judged."""
    monkeypatch.setenv(program_cache.ENV, str(tmp_path / "programs"))

    def breaks(*args, **kwargs):
        raise RuntimeError("dictionary changed size during iteration")

    monkeypatch.setattr(program_key, "sha256", breaks)
    p = oracle.make_problem(1, 16, 1, 8, 8, decay="moderate", seed=0)
    fn = kernels.get("pairwise")
    with pytest.warns(program_cache.ProgramCacheWarning, match="key could not be formed.*RuntimeError"):
        lowered = harness.lower(fn, p, "float32", cache=True)
    assert lowered is not None and not list((tmp_path / "programs").glob("*.exported"))
    assert harness.validate(fn, p, *oracle.random_cotangents(p)).passed
