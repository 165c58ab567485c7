"""Adapters for the published Atomic Ops GDN-2 Pallas kernels (optional extra: ``pip install .[peers]``).

Both live in the PyPI distribution ``atomic-ops``: version 0.2.0 ships the 0.1.0 package
``atomic_ops`` unchanged (byte-identical sources) next to the new ``atomic_gdn2``, so installing
``atomic-ops==0.2.0`` provides both peers and nothing needs to be vendored.

Registered names (``kernels.get(name, **options)``):

* ``atomic-ops``  -- ``atomic_ops.gdn2_pallas_forward_trainable`` (the pairwise-decay baseline;
  fused Pallas forward and backward). Options: ``config`` (an ``atomic_ops.KernelConfig`` or one of
  ``"small"``/``"medium"``/``"large"``; default their ``DEFAULT_CONFIG`` = KAGGLE_MEDIUM, ``bt=256``,
  ``wy_eps=1e-3``), or any ``KernelConfig`` field (``bt``, ``bc``, ``mb``, ``clip``, ``wy_eps``)
  overriding it; ``interpret`` (``None``: interpret mode unless the backend is a TPU).
* ``atomic-gdn2`` -- ``atomic_gdn2.make_blr_trainable`` (block-local-rescaling kernels).
  Options: any ``BLRConfig`` field via ``atomic_gdn2.make_cfg`` (their PROD preset: ``bt=128``,
  ``bs2=32``, ``wy_eps=1e-3``, ``g_max=5``), ``interpret`` as above.

Mapping to the contract of docs/DESIGN.md §2: argument order ``(q, k, v, g, b, w)`` -> theirs
``(q, k, v, w, b, g)``; ``atomic_gdn2`` takes head-major ``[B, H, T, D]``; both need ``K == V ==
128`` and ``T`` a multiple of their chunk ``bt``. The adapter pads ``T`` with identity tokens
(``q = k = v = b = w = 0``, ``g = 0``: the state passes through unchanged) and ``K``, ``V`` to 128
with zero channels (a zero key channel never writes its state row; a zero value column stays zero),
both exact, and drops the padding from every result and gradient. It does NOT clamp ``g`` or
change their damping: the kernels run as published, and where they disagree with the oracle that
is a finding (:data:`DOMAIN_NOTES` lists their declared domain).

Two PyPI distributions install a top-level ``atomic_ops``: ``atomic-ops`` and ``gdn2-pallas``. Before importing it,
the ``atomic-ops`` peer checks which installed distribution provides it (:func:`atomic_ops_distribution`): another
one, or several at once (their files overwrite each other), is a ValueError naming them; its note names the version
of ``atomic-ops`` found (``importlib.metadata``).

:data:`ATOMIC_OPS_SPEC`: both distributions judged by their own entry point through a spec of options alone
(docs/third-party.md lists it with deltanet-tpu's); the refusal above names it.

``atomic_ops`` has no ``interpret`` switch; off-TPU the adapter swaps the ``pl`` module those two
modules use for a proxy whose ``pallas_call`` defaults to ``interpret=True`` (a module-local shim:
``jax.experimental.pallas`` itself is untouched).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import types

import jax
import jax.numpy as jnp

from . import kernel_warnings
from .contract import check_inputs

WIDTH = 128


# The spec judging a top-level atomic_ops by its own entry point, with its folder on PYTHONPATH (docs/third-party.md):
# atomic-ops 0.2.0 and gdn2-pallas 0.1.1 both ship gdn2_pallas_forward_trainable, a custom_vjp of Pallas TPU calls.
ATOMIC_OPS_SPEC = ("atomic_ops:gdn2_pallas_forward_trainable"
                   "[order=qkvwbgs,state_arg=h0,pad=K128V128T256,interpret=1,o_dtype=float32]")
ATOMIC_OPS_DISTRIBUTIONS = ("atomic-ops", "gdn2-pallas")


def _run_by_spec(dist):
    """How to judge distribution ``dist`` (one that installs an ``atomic_ops``) by its own entry point."""
    if _normal(dist) not in ATOMIC_OPS_DISTRIBUTIONS:
        return f"run {dist} by its own spec, docs/third-party.md"
    return (f"judge {dist} by its own entry point, with its folder on PYTHONPATH: --kernel '{ATOMIC_OPS_SPEC}', "
            "docs/third-party.md")


DISTRIBUTION = "atomic-ops"  # the PyPI distribution the atomic-ops peer's top-level package atomic_ops must come from
PINNED = "atomic-ops==0.2.0"  # what the peers extra installs

DOMAIN_NOTES = {
    "atomic-ops": (
        "atomic_ops declared domain (atomic-ops 0.1.0; 0.2.0 ships it unchanged): K = V = 128 (adapter "
        "zero-pads), T % bt == 0 (adapter pads identity tokens); pairwise decay exponent clipped to [-20, 20] "
        "inside a chunk; WY solve damped by wy_eps (default 1e-3, i.e. solves (I + (1-eps) T) not (I + T)); every "
        "stage clips values to +-clip (1e4) and maps NaN to 0"),
    "atomic-gdn2": (
        "atomic-gdn2 0.2.0 declared domain: K = V = 128, T % bt == 0 (adapter pads); g <= 0 and "
        "beta*||k||^2 <= 2; BTL half span 0.5*bs2*|g| < 88 (their layer clamps |g| <= g_max = 160/bs2 = 5; "
        "the adapter passes g unclamped); WY solve damped by wy_eps = 1e-3; bf16x3 matmuls in the "
        "solve and backward; values clipped to +-1e4, NaN mapped to 0"),
}


def _import(module, name):
    """Import an optional peer package, or raise ValueError saying how to install it."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure: say what to install
        raise ValueError(f"name: kernel {name!r} needs the module {module!r} ({type(exc).__name__}: {exc}); "
                         f"install the peers extra: pip install 'gdn2-oracle[peers]' (atomic-ops==0.2.0)") from None


def _normal(dist):
    """A distribution name compared as PyPI does: case and runs of ``-``, ``_``, ``.`` aside (PEP 503)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def atomic_ops_distribution(top="atomic_ops"):
    """``(distribution, version)`` of the installed distribution ``atomic-ops`` providing the top-level package
    ``top``, read from ``importlib.metadata`` before anything is imported; None when no installed distribution
    provides it (absent, or on ``sys.path`` from a checkout). ValueError naming ``name`` when another distribution
    provides it (``gdn2-pallas`` installs an ``atomic_ops`` too), or several do (their files overwrite each other)."""
    found = sorted(set(importlib.metadata.packages_distributions().get(top, ())), key=_normal)
    if not found:
        return None
    ours = [d for d in found if _normal(d) == _normal(DISTRIBUTION)]
    others = [d for d in found if d not in ours]
    named = ", ".join(f"{d} {_version(d)}" for d in others)
    peer = f"name: kernel 'atomic-ops': the top-level package {top} here"
    if not ours:
        source = f"comes from {named}" if len(others) == 1 else f"comes from several distributions ({named})"
        raise ValueError(f"{peer} {source}, not {DISTRIBUTION}: the 'atomic-ops' peer needs `pip install {PINNED}` "
                         f"(or {_run_by_spec(others[0])})")
    if others:
        raise ValueError(f"{peer} is installed by several distributions ({ours[0]} {_version(ours[0])}, {named}), "
                         f"whose files overwrite each other: the 'atomic-ops' peer needs it from {DISTRIBUTION} alone: "
                         f"`pip uninstall {' '.join(others)}`, then `pip install --force-reinstall {PINNED}` (or "
                         f"install {others[0]} in a folder of its own and {_run_by_spec(others[0])})")
    return ours[0], _version(ours[0])


def _interpret_default(interpret):
    return jax.default_backend() != "tpu" if interpret is None else bool(interpret)


def _pad_tokens_channels(x, Tp, Dp):
    """``[B, T, H, D] -> [B, Tp, H, Dp]`` with zeros."""
    B, T, H, D = x.shape
    if Tp == T and Dp == D:
        return x
    return jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, Dp - D)))


def _pad_state(s, Kp, Vp):
    B, H, K, V = s.shape
    if Kp == K and Vp == V:
        return s
    return jnp.pad(s, ((0, 0), (0, 0), (0, Kp - K), (0, Vp - V)))


def _prepare(q, k, v, g, b, w, scale, initial_state, bt):
    """Contract checks, float32 state, padding; returns padded arrays plus the unpadding sizes."""
    shape, scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    B, T, H, K, V = shape
    if K > WIDTH or V > WIDTH:
        raise ValueError(f"q/v: the atomic-ops kernels support head width <= {WIDTH} (K={K}, V={V})")
    Tp = -(-T // bt) * bt
    dt = q.dtype
    # Their kernels assume one dtype for all six inputs (v/w share q's shape and dtype).
    padded = [_pad_tokens_channels(x.astype(dt), Tp, WIDTH) for x in (q, k, v, g, b, w)]
    h0 = jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None else initial_state
    h0 = _pad_state(h0.astype(jnp.float32), WIDTH, WIDTH)
    return padded, h0, scale, (B, T, H, K, V)


def _unpad(o, hT, sizes, dtype):
    """Drop the padding; ``o`` in the input dtype ``dtype`` as the contract says (the peers return float32)."""
    B, T, H, K, V = sizes
    return o[:, :T, :, :V].astype(dtype), hT[:, :, :K, :V]


# --- atomic_ops (0.1.0) ---------------------------------------------------------------------

class _InterpretPallas(types.ModuleType):
    """A stand-in for ``jax.experimental.pallas`` whose ``pallas_call`` defaults to interpret mode."""

    def __init__(self, pl):
        super().__init__("pallas_interpret_shim")
        self._pl = pl

    def __getattr__(self, name):
        return getattr(self._pl, name)

    def pallas_call(self, *args, **kwargs):
        if not kwargs.get("interpret"):
            kwargs["interpret"] = True
        kwargs.pop("compiler_params", None)
        return self._pl.pallas_call(*args, **kwargs)


def _shim_atomic_ops():
    """Route atomic_ops' pallas_calls through interpret mode (idempotent)."""
    for mod_name in ("atomic_ops.gdn2_fwd", "atomic_ops.gdn2_bwd"):
        mod = importlib.import_module(mod_name)
        if not isinstance(mod.pl, _InterpretPallas):
            mod.pl = _InterpretPallas(mod.pl)


_PRESETS = {"small": "KAGGLE_SMALL", "medium": "KAGGLE_MEDIUM", "large": "KAGGLE_LARGE"}


def atomic_ops_kernel(config=None, *, interpret=None, **fields):
    """The ``atomic-ops`` peer: ``atomic_ops.gdn2_pallas_forward_trainable`` behind the contract."""
    provider = atomic_ops_distribution()
    atomic_ops = _import("atomic_ops", "atomic-ops")

    if config is None:
        config = atomic_ops.DEFAULT_CONFIG
    elif isinstance(config, str):
        if config not in _PRESETS:
            raise ValueError(f"config: {config!r} not one of {tuple(_PRESETS)}")
        config = getattr(atomic_ops, _PRESETS[config])
    if fields:
        import dataclasses
        try:
            config = dataclasses.replace(config, **fields)
        except TypeError as exc:
            raise ValueError(f"options: 'atomic-ops' does not accept {sorted(fields)} ({exc})") from None
    if _interpret_default(interpret):
        _shim_atomic_ops()

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        (pq, pk, pv, pg, pb, pw), h0, scale_, sizes = _prepare(q, k, v, g, b, w, scale, initial_state, config.bt)
        o, hT = kernel_warnings.call(atomic_ops.gdn2_pallas_forward_trainable, "atomic-ops", pq, pk, pv, pw, pb, pg,
                                     scale_, h0=h0, config=config)
        return _unpad(o, hT, sizes, v.dtype)

    kernel.__name__ = "atomic_ops"
    kernel.config = config
    kernel.modules = ("atomic_ops.gdn2_pipeline", "atomic_ops.gdn2_fwd", "atomic_ops.gdn2_bwd", "atomic_ops.configs")
    kernel.distribution = provider  # (name, version) of what provides atomic_ops, or None: no distribution
    found = (f"atomic_ops from {provider[0]} {provider[1]}" if provider else
             f"atomic_ops from {getattr(atomic_ops, '__file__', '?')}, of no installed distribution (version unknown)")
    kernel.note = f"{found}; {DOMAIN_NOTES['atomic-ops']}"
    return kernel


# --- atomic_gdn2 (0.2.0) --------------------------------------------------------------------

def atomic_gdn2_kernel(*, interpret=None, **fields):
    """The ``atomic-gdn2`` peer: ``atomic_gdn2.make_blr_trainable`` behind the contract."""
    atomic_gdn2 = _import("atomic_gdn2", "atomic-gdn2")

    try:
        cfg = atomic_gdn2.make_cfg(interpret=_interpret_default(interpret), **fields)
    except TypeError as exc:
        raise ValueError(f"options: 'atomic-gdn2' does not accept {sorted(fields)} ({exc})") from None
    calls = {}

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        (pq, pk, pv, pg, pb, pw), h0, scale_, sizes = _prepare(q, k, v, g, b, w, scale, initial_state, cfg.bt)
        if scale_ not in calls:
            calls[scale_] = kernel_warnings.call(atomic_gdn2.make_blr_trainable, "atomic-gdn2", cfg, scale_)
        hm = [jnp.transpose(x, (0, 2, 1, 3)) for x in (pq, pk, pv, pw, pb, pg)]
        o, hT = kernel_warnings.call(calls[scale_], "atomic-gdn2", *hm, h0)
        return _unpad(jnp.transpose(o, (0, 2, 1, 3)), hT, sizes, v.dtype)

    kernel.__name__ = "atomic_gdn2"
    kernel.config = cfg
    kernel.modules = ("atomic_gdn2.pipeline", "atomic_gdn2.fwd.scores", "atomic_gdn2.fwd.solve",
                      "atomic_gdn2.fwd.cd_slim", "atomic_gdn2.bwd.mega", "atomic_gdn2.bwd.b4",
                      "atomic_gdn2.precision", "atomic_gdn2.config")
    kernel.note = DOMAIN_NOTES["atomic-gdn2"]
    return kernel


def available():
    """``{name: None or the reason it is unavailable}`` (import check only)."""
    out = {}
    for name, mod in (("atomic-ops", "atomic_ops"), ("atomic-gdn2", "atomic_gdn2")):
        if name == "atomic-ops":
            try:
                atomic_ops_distribution()
            except ValueError as exc:
                out[name] = str(exc).removeprefix("name: ")
                continue
        try:
            importlib.import_module(mod)
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - any import failure: say what to install
            out[name] = (f"{type(exc).__name__}: {exc} (install the peers extra: "
                         f"pip install 'gdn2-oracle[peers]', i.e. atomic-ops==0.2.0)")
    return out
