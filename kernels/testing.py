"""Test support: deliberately wrong GDN-2 kernels (``gdn2_oracle.kernels.testing:perturbed``, ``...:broken``).

``perturbed`` is the pairwise kernel with its output scaled by ``1 + 1e-3``: far outside the
float32 tolerance, so ``gdn2-oracle validate`` must exit 1 and ``bench`` must refuse to time it.
"""


from .registry import get

_BASE = get("pairwise", chunk_size=16)


def perturbed(q, k, v, g, b, w, *, scale=None, initial_state=None):
    o, s = _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return (o * (1 + 1e-3)).astype(o.dtype), s


def broken(q, k, v, g, b, w, *, scale=None, initial_state=None):
    raise RuntimeError("this kernel always fails")


def correct(q, k, v, g, b, w, *, scale=None, initial_state=None):
    return _BASE(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
