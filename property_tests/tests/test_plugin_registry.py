"""The plugin reads the call-mode registry from its source (it imports nothing of the package in an unrelated run):
what it reads is the registry, and its --gdn2-modes help and marker line list every mode."""

from __future__ import annotations

from gdn2_oracle.oracle import call_modes
from gdn2_oracle.property_tests import plugin


def test_the_plugin_reads_the_registry_as_imported():
    assert plugin.registry_modes() == tuple((m.name, m.kind) for m in call_modes.REGISTRY)


def test_the_marker_line_lists_the_training_then_the_serving_modes():
    training, serving = (", ".join(call_modes.names(kind)) for kind in ("training", "serving"))
    assert f"({training}; {serving})" in plugin.modes_mark()
