"""Third-party kernels run from spec options alone (docs/third-party.md): each stand-in below keeps a convention of a
package we cannot install here, and ``gdn2-oracle validate`` judges it with the spec option that maps it (and, where
that is the point, fails or refuses it without).
"""

from __future__ import annotations

import jax.numpy as jnp

from gdn2_oracle.kernels import spec

HERE = __name__  # the CLI resolves "module:attr" specs of this module by this name
_pairwise = spec.get("pairwise")


def float32_o(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """A correct kernel that returns o in float32 whatever its inputs (FLA's naive references do)."""
    o, state = _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return o.astype(jnp.float32), state


def validate(cli, kernel, case, dtype="float32", *more):
    """``(exit status, stdout + stderr)`` of ``validate`` on one case of the quick set."""
    code, out, err = cli("validate", "--kernel", kernel, "--case", case, "--dtype", dtype, "--no-progress", *more)
    return code, out + err


def test_a_float32_o_error_names_the_option_that_accepts_it(cli):
    code, text = validate(cli, f"{HERE}:float32_o", "bf16_moderate", "bfloat16")
    assert code != 0 and "expected bfloat16 (v's dtype)" in text and "o_dtype=float32" in text, text
    code, text = validate(cli, f"{HERE}:float32_o[o_dtype=float32]", "bf16_moderate", "bfloat16")
    assert code == 0 and "PASS" in text, text
