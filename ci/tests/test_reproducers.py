"""Reproducers are self-contained: a kernel whose module is found only through ``PYTHONPATH`` (a kernel author's
repository, run as ``PYTHONPATH=. pytest ...``) gets a reproducer that says so (``kernels.spec.runnable``), and the
line runs from anywhere in a fresh shell; an installed or registered kernel's does not need one."""

from __future__ import annotations

import os
import subprocess
import sys

from gdn2_oracle.ci.commands import hunt
from gdn2_oracle.kernels.spec import module_root
from gdn2_oracle.oracle import Recipe
from gdn2_oracle.property_tests import strategies


def test_a_kernel_outside_the_installed_packages_gets_its_pythonpath(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "userkern").mkdir(parents=True)
    (repo / "userkern" / "__init__.py").write_text("")
    (repo / "userkern" / "k.py").write_text("from gdn2_oracle import kernels\n\nfn = kernels.get('pairwise')\n")
    monkeypatch.syspath_prepend(str(repo))
    spec = "userkern.k:fn"
    assert module_root(spec) == str(repo.resolve())
    recipe = Recipe(1, 8, 1, 8, 8, decay="moderate", gates="uniform", initial_state=False, precision="float32",
                    seed=1)
    line = strategies.repro(recipe, spec)
    assert line.startswith(f"PYTHONPATH={repo.resolve()} python -c"), line
    assert hunt.reproducer(recipe, spec)[0] == line
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(line.replace("python -c", f"{sys.executable} -c", 1), shell=True, cwd=elsewhere,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "PASS" in out.stdout, out.stdout + out.stderr


def test_installed_and_registered_kernels_need_no_pythonpath():
    for spec in ("pairwise", "gdn2_oracle.kernels.testing_layouts:mixed_gdn[layout=mixed_qkv]", "numpy:sum",
                 "torch:gdn2_oracle.kernels.serving_bridge:fla_naive_decode"):
        assert module_root(spec) is None, spec
