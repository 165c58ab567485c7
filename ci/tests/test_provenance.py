"""Provenance names the kernel under test through its wrappers: mapping and padding options, factories, partials."""

from __future__ import annotations

import functools
import sys
import textwrap

import pytest

from gdn2_oracle.ci.commands.provenance import source_lines
from gdn2_oracle.ci.running.fingerprint import kernel_modules, source_sha256
from gdn2_oracle.kernels import spec

MODULE = """
from gdn2_oracle.kernels.kernel import pairwise as _pairwise
from {helper} import factor

base = _pairwise()


def make(s):
    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, S = base(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        return o * factor(s), S
    return kernel


good = make(1.0)
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A kernel package of two modules on sys.path: ``mykern.gdn`` (a factory) and ``myhelp.scale`` (a helper it
    imports from another package)."""
    for pkg, name, text in (("mykern", "gdn", MODULE.format(helper="myhelp.scale")),
                            ("myhelp", "scale", "def factor(s):\n    return s\n")):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("mykern", "myhelp")]:
        del sys.modules[name]


@pytest.mark.parametrize("options", ["", "[pad=K32]", "[o_dtype=float32]", "[order=qkvgbw]", "[layout=bthk]"])
def test_the_kernel_under_test_is_fingerprinted_through_every_option(user_package, options):
    fn = spec.KernelSpec.parse(f"mykern.gdn:good{options}").build()
    names = [m.__name__ for m in kernel_modules(fn)]
    for module in ("mykern.gdn", "myhelp.scale", "gdn2_oracle.kernels.kernel"):
        assert module in names, f"{module} missing from {names}"
    assert ("gdn2_oracle.kernels.adapt" in names) == bool(options)
    assert not any(n.startswith(("jax", "numpy", "gdn2_oracle.ci", "gdn2_oracle.oracle")) for n in names)


def test_a_partial_and_a_callable_object_are_followed(user_package):
    from mykern import gdn

    class Wrapper:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    for fn in (functools.partial(gdn.make(2.0)), functools.wraps(gdn.good)(lambda *a, **k: gdn.good(*a, **k))):
        assert "mykern.gdn" in [m.__name__ for m in kernel_modules(fn)]
    assert __name__ in [m.__name__ for m in kernel_modules(Wrapper(gdn.good))]


def test_an_edited_helper_changes_the_fingerprint_and_the_header_names_it(user_package):
    from mykern import gdn

    before = source_sha256(gdn.good)
    (user_package / "myhelp" / "scale.py").write_text("def factor(s):\n    return 2 * s\n")
    after = source_sha256(gdn.good)
    assert before["modules"]["myhelp.scale"] != after["modules"]["myhelp.scale"]
    assert before["sha256"] != after["sha256"]
    (line,) = source_lines([{"name": "mykern.gdn:good", "source": after}])
    assert line.startswith(f"  mykern.gdn:good: source {after['sha256'][:12]} = ")
    assert f"myhelp.{{scale {after['modules']['myhelp.scale'][:8]}}}" in line
    assert "mykern.{gdn " in line
