"""The ``atomic-ops`` peer says which distribution its top-level package ``atomic_ops`` comes from (kernels/peers.py):
``gdn2-pallas`` installs an ``atomic_ops`` too, and the peer refuses it by name instead of loading it silently. The
installed distributions are simulated (``importlib.metadata``); the real package need not be installed here.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest

from gdn2_oracle.kernels import peers, spec

VERSIONS = {"gdn2-pallas": "0.1.1", "Atomic_Ops": "0.2.0", "atomic-ops": "0.2.0"}


@pytest.fixture
def installed(monkeypatch):
    """``installed(*distributions)``: those distributions (and no other) provide the top-level ``atomic_ops``."""

    def install(*dists):
        monkeypatch.setattr(importlib.metadata, "packages_distributions",
                            lambda: {"atomic_ops": list(dists), "jax": ["jax"]})

    def version(dist):
        if dist not in VERSIONS:
            raise importlib.metadata.PackageNotFoundError(dist)
        return VERSIONS[dist]

    monkeypatch.setattr(importlib.metadata, "version", version)
    return install


def test_atomic_ops_from_gdn2_pallas_is_refused_by_name(installed):
    installed("gdn2-pallas")
    with pytest.raises(ValueError) as err:
        peers.atomic_ops_distribution()
    text = str(err.value)
    assert "atomic_ops here comes from gdn2-pallas 0.1.1, not atomic-ops" in text, text
    assert "pip install atomic-ops==0.2.0" in text and "docs/third-party.md" in text, text
    assert f"--kernel '{peers.ATOMIC_OPS_SPEC}'" in text, text  # gdn2-pallas's real entry point


def test_the_peer_refuses_it_before_importing_anything(installed, monkeypatch):
    installed("gdn2-pallas")
    monkeypatch.setitem(sys.modules, "atomic_ops", None)  # an import would fail differently
    with pytest.raises(ValueError, match="comes from gdn2-pallas 0.1.1, not atomic-ops"):
        spec.KernelSpec.parse("atomic-ops").build()
    assert "gdn2-pallas 0.1.1" in peers.available()["atomic-ops"]


def test_several_distributions_are_named(installed):
    installed("gdn2-pallas", "atomic-ops")
    with pytest.raises(ValueError, match=r"several distributions \(atomic-ops 0.2.0, gdn2-pallas 0.1.1\)") as err:
        peers.atomic_ops_distribution()
    assert "pip uninstall gdn2-pallas" in str(err.value)
    installed("gdn2-pallas", "other-ops")
    with pytest.raises(ValueError, match=r"several distributions \(gdn2-pallas 0.1.1, other-ops \(version unknown"):
        peers.atomic_ops_distribution()


@pytest.mark.parametrize("dist", ["atomic-ops", "Atomic_Ops"])
def test_atomic_ops_from_atomic_ops_passes_with_its_version(installed, dist):
    installed(dist)
    assert peers.atomic_ops_distribution() == (dist, "0.2.0")


def test_no_distribution_leaves_it_to_the_import(installed):
    installed()
    assert peers.atomic_ops_distribution() is None


def test_the_peers_note_names_the_version_found(installed, monkeypatch):
    installed("atomic-ops")
    fake = types.ModuleType("atomic_ops")
    fake.DEFAULT_CONFIG = types.SimpleNamespace(bt=64)
    fake.gdn2_pallas_forward_trainable = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "atomic_ops", fake)
    kernel = peers.atomic_ops_kernel(interpret=False)
    assert kernel.distribution == ("atomic-ops", "0.2.0")
    assert kernel.note.startswith("atomic_ops from atomic-ops 0.2.0; atomic_ops declared domain"), kernel.note
