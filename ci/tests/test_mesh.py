"""Validation on a device mesh (ci/running/mesh.py): ``--mesh`` parsing and building, and ``validate --mesh``,
``bench --mesh`` and the plugin's ``--gdn2-mesh`` on 8 host devices (subprocesses started with
XLA_FLAGS=--xla_force_host_platform_device_count=8, from a directory outside the repository)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec

from gdn2_oracle.ci.running.mesh import build_mesh, format_mesh, parse_mesh, sequence_spec, state_spec

HOST_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
CLI = str(Path(sys.executable).with_name("gdn2-oracle"))
CP = "cp-factorized[chunk_size=16,leaf=4]"
WRONG = "gdn2_oracle.kernels.testing:perturbed"


def on_host_devices(cwd, *argv):
    """Run ``argv`` with 8 host devices; return (exit code, stdout + stderr)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN2_"))}, **HOST_DEVICES}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_parse_mesh_keeps_axis_order():
    assert parse_mesh("data=2, seq=4") == {"data": 2, "seq": 4}
    assert list(parse_mesh("seq=2,heads=4")) == ["seq", "heads"]


@pytest.mark.parametrize("spec", ["", "seq", "seq=0", "seq=2,seq=2", "model=2", "seq=-1", "seq=two"])
def test_bad_mesh_names_the_argument(spec):
    with pytest.raises(ValueError, match="mesh"):
        parse_mesh(spec)


def test_build_mesh_needs_enough_devices():
    mesh = build_mesh("seq=1")
    assert format_mesh(mesh) == "seq=1" and mesh.are_all_axes_auto
    with pytest.raises(ValueError, match="needs 4096 devices"):
        build_mesh("seq=4096")


def test_input_specs_shard_only_dimensions_the_axes_divide():
    mesh = {"data": 2, "seq": 4}
    fake = type("FakeMesh", (), {"shape": mesh})()
    assert sequence_spec(fake, (2, 40, 3, 8)) == PartitionSpec("data", "seq", None, None)
    assert sequence_spec(fake, (1, 37, 3, 8)) == PartitionSpec(None, None, None, None)
    assert state_spec(fake, (2, 3, 8, 8)) == PartitionSpec("data", None, None, None)


@pytest.mark.slow
def test_validate_on_a_mesh_judges_every_kernel(tmp_path):
    report = tmp_path / "validate.json"
    code, out = on_host_devices(tmp_path, CLI, "validate", "--mesh", "data=2,seq=4", "--kernel", CP, "--kernel", WRONG,
                                "--cases", "quick", "--case", "decay_extreme_h0", "--dtype", "float32",
                                "--no-progress", "--json", str(report))
    assert code == 1, out  # the perturbed kernel fails on the mesh as it does on one device
    data = json.loads(report.read_text())
    assert data["mesh"] == "data=2,seq=4" and "mesh data=2,seq=4" in out
    assert [k["passed"] for k in data["kernels"]] == [True, False], out


@pytest.mark.slow
def test_bench_on_a_mesh_times_a_validated_kernel(tmp_path):
    report = tmp_path / "bench.json"
    code, out = on_host_devices(tmp_path, CLI, "bench", "--mesh", "seq=8", "--kernel", "cp-pairwise[chunk_size=16]",
                                "--batch", "1", "--seq", "64", "--heads", "2", "--dim", "8", "--repeats", "2",
                                "--no-progress", "--json", str(report))
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["mesh"] == "seq=8" and [r["status"] for r in data["results"]] == ["ok"], out


@pytest.mark.slow
def test_plugin_runs_the_conformance_suite_on_a_mesh(tmp_path):
    code, out = on_host_devices(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                                "gdn2_oracle.property_tests", "--gdn2-kernel", CP, "--gdn2-mesh", "seq=8",
                                "-k", "test_kernel_matches_golden and len_1")
    assert code == 0 and " passed" in out, out
    assert "mesh seq=8" in out, out  # the report header
    code, out = on_host_devices(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                                "gdn2_oracle.property_tests", "--gdn2-kernel", CP, "--gdn2-mesh", "seq=16",
                                "-k", "test_kernel_matches_golden and len_1")
    assert code != 0 and "needs 16 devices" in out, out
