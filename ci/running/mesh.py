"""Device meshes for validation and benchmarks: ``--mesh data=2,seq=4`` parsed, built and used to shard inputs.

Axis names and what they shard are the context-parallel kernel's (kernels/context_parallel.py): ``seq`` the
sequence T, ``data`` the batch B, ``heads`` the heads H. Meshes use ``AxisType.Auto`` (shardings are hints,
not part of array types), so any kernel runs on them; inputs are placed with ``NamedSharding``.
"""

from __future__ import annotations

import contextlib
import re

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from gdn2_oracle.kernels.context_parallel import AXIS_ROLES, BATCH_AXIS, HEAD_AXIS, SEQ_AXIS

_ITEM = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(\d+)\s*$")


def parse_mesh(spec):
    """``"data=2,seq=4"`` -> ``{"data": 2, "seq": 4}`` (axis order kept); ValueError naming ``mesh`` if malformed."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh: expected AXIS=SIZE[,AXIS=SIZE...], got {spec!r}")
    axes = {}
    for item in spec.split(","):
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"mesh: {item.strip()!r} of {spec!r} is not AXIS=SIZE")
        name, size = m.group(1), int(m.group(2))
        if name not in AXIS_ROLES:
            raise ValueError(f"mesh: unknown axis {name!r}; axes: "
                             + ", ".join(f"{a} ({r})" for a, r in AXIS_ROLES.items()))
        if name in axes:
            raise ValueError(f"mesh: axis {name!r} given twice in {spec!r}")
        if size < 1:
            raise ValueError(f"mesh: axis {name!r} needs a positive size, got {size}")
        axes[name] = size
    return axes


def build_mesh(spec, devices=None):
    """The ``jax.sharding.Mesh`` of a spec (string or dict) over the first prod(sizes) of ``devices`` (default: all)."""
    axes = parse_mesh(spec) if isinstance(spec, str) else dict(spec)
    devices = list(jax.devices() if devices is None else devices)
    n = 1
    for size in axes.values():
        n *= size
    if n > len(devices):
        raise ValueError(f"mesh: {format_mesh(axes)} needs {n} devices, {len(devices)} available")
    return jax.make_mesh(tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes),
                         devices=devices[:n])


def format_mesh(mesh):
    """``"data=2,seq=4"`` of a mesh or an axis dict."""
    axes = dict(mesh.shape) if hasattr(mesh, "axis_names") else dict(mesh)
    return ",".join(f"{a}={s}" for a, s in axes.items())


def sequence_spec(mesh, shape):
    """PartitionSpec of a ``[B, T, H, dim]`` array: B over ``data``, T over ``seq``, H over ``heads``, each
    only where the mesh has the axis and it divides that dimension (else replicated)."""
    sizes = dict(mesh.shape)
    axes = [a if sizes.get(a, 1) > 1 and n % sizes[a] == 0 else None
            for a, n in zip((BATCH_AXIS, SEQ_AXIS, HEAD_AXIS), shape[:3])]
    return PartitionSpec(*axes, *[None] * (len(shape) - 3))


def state_spec(mesh, shape):
    """PartitionSpec of a ``[B, H, K, V]`` state: B over ``data``, H over ``heads`` where they divide."""
    b, _, h, *_ = sequence_spec(mesh, (shape[0], 1, shape[1]))
    return PartitionSpec(b, h, None, None)


def place(mesh, inputs, h0):
    """``(inputs, h0)`` placed on the mesh with NamedSharding (``inputs`` are ``[B, T, H, dim]`` arrays)."""
    def put(x, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))

    return (tuple(put(x, sequence_spec(mesh, x.shape)) for x in inputs), put(h0, state_spec(mesh, h0.shape)))


def using(mesh):
    """Context manager: ``jax.set_mesh(mesh)``, or nothing when ``mesh`` is None."""
    return jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()


def to_host(x):
    """``x`` as a NumPy array on this process: gathered from every process when it spans several hosts."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils  # only on multi-process runs

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def current():
    """The concrete mesh set by ``jax.set_mesh`` (None outside one)."""
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


def place_args(args):
    """Runner arguments ``(inputs, h0, do, dfinal_state)`` placed on the current mesh (unchanged outside one)."""
    mesh = current()
    if mesh is None:
        return args
    inputs, h0, do, dfs = args
    (*inputs, do), h0 = place(mesh, (*inputs, do), h0)
    return tuple(inputs), h0, do, dfs
