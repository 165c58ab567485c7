"""Third-party kernels run from spec options alone (docs/third-party.md): each stand-in below keeps a convention of a
package we cannot install here, and ``gdn2-oracle validate`` judges it with the spec option that maps it (and, where
that is the point, fails or refuses it without).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from gdn2_oracle.kernels import spec

HERE = __name__  # the CLI resolves "module:attr" specs of this module by this name
_pairwise = spec.get("pairwise")


def float32_o(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """A correct kernel that returns o in float32 whatever its inputs (FLA's naive references do)."""
    o, state = _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
    return o.astype(jnp.float32), state


def validate(cli, kernel, *cases, dtype="float32", case_set="quick"):
    """``(exit status, stdout + stderr)`` of ``validate`` on the named cases of ``case_set``."""
    named = [a for c in cases for a in ("--case", c)]
    code, out, err = cli("validate", "--kernel", kernel, "--cases", case_set, *named, "--dtype", dtype, "--no-progress")
    return code, out + err


def test_a_float32_o_error_names_the_option_that_accepts_it(cli):
    code, text = validate(cli, f"{HERE}:float32_o", "bf16_moderate", dtype="bfloat16")
    assert code != 0 and "expected bfloat16 (v's dtype)" in text and "o_dtype=float32" in text, text
    code, text = validate(cli, f"{HERE}:float32_o[o_dtype=float32]", "bf16_moderate", dtype="bfloat16")
    assert code == 0 and "PASS" in text, text


def one_state_per_row(q, k, v, g, b, w, *, scale=None, initial_state=None, cu_seqlens=None):
    """A correct dense kernel whose ``cu_seqlens`` means something else (one state per batch row, as
    deltanet-tpu's): it ignores FLA's packed sequences, so packed calls come out wrong."""
    return _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


def test_modes_opts_a_kernel_out_of_the_packed_cases(cli):
    cases = ("decay_moderate", "varlen_quick")
    code, text = validate(cli, f"{HERE}:one_state_per_row", *cases)
    assert code != 0 and "FAIL" in text, text
    code, text = validate(cli, f"{HERE}:one_state_per_row[modes=dense]", *cases)
    assert code == 0 and "PASS" in text and "FAIL" not in text, text


def test_modes_cannot_opt_in_to_a_mode_the_signature_lacks(cli):
    code, text = validate(cli, f"{HERE}:one_state_per_row[modes=dense+l2norm]", "decay_moderate")
    assert code == 2 and "modes:" in text and "use_qk_l2norm_in_kernel" in text, text
    code, text = validate(cli, f"{HERE}:one_state_per_row[modes=dense+varlenn]", "decay_moderate")
    assert code == 2 and "modes: unknown call mode" in text, text


def qk_l2norm_kernel(q, k, v, g, b, w, *, scale=None, initial_state=None, qk_l2norm=False):
    """A correct kernel that calls FLA's ``use_qk_l2norm_in_kernel`` ``qk_l2norm``."""
    return _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state, use_qk_l2norm_in_kernel=qk_l2norm)


def test_rename_maps_a_keyword_to_flas_and_modes_are_read_through_it(cli):
    from gdn2_oracle.ci.running.modes import accepted_modes
    from gdn2_oracle.oracle import call_modes

    l2norm = next(m.name for m in call_modes.REGISTRY if m.keywords == ("use_qk_l2norm_in_kernel",))
    assert l2norm not in accepted_modes(spec.get(f"{HERE}:qk_l2norm_kernel"))
    renamed = f"{HERE}:qk_l2norm_kernel[rename=qk_l2norm:use_qk_l2norm_in_kernel]"
    assert l2norm in accepted_modes(spec.get(renamed))
    code, text = validate(cli, renamed, "mode_l2norm_near_zero", case_set="full")
    assert code == 0 and "PASS" in text and "not accepted" not in text, text
    code, text = validate(cli, f"{HERE}:qk_l2norm_kernel[rename=qk_norm:use_qk_l2norm_in_kernel]", "len_1")
    assert code == 2 and "rename: the kernel's signature has no keyword ['qk_norm']" in text, text


@dataclasses.dataclass(frozen=True)
class Config:
    """A package's kernel configuration object (not a literal: it reaches the spec as a reference)."""

    sign: float = 1.0


GOOD, FLIPPED = Config(), Config(sign=-1.0)


def make_kernel(*, config=GOOD, chunk=64):
    """A package's factory: the kernel for ``config`` (``FLIPPED`` makes a wrong one, so the test sees it is used)."""
    if chunk not in (16, 32, 64):
        raise ValueError(f"chunk: {chunk!r}")

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        o, state = _pairwise(q, k, v, g, b, w, scale=scale, initial_state=initial_state)
        return o * config.sign, state

    return kernel


def test_factory_is_called_with_the_options_and_references_load_objects(cli):
    code, text = validate(cli, f"{HERE}:make_kernel[factory=1,chunk=32,config=@{HERE}:GOOD]", "decay_moderate")
    assert code == 0 and "PASS" in text, text
    code, text = validate(cli, f"{HERE}:make_kernel[factory=1,config=@{HERE}:FLIPPED]", "decay_moderate")
    assert code != 0 and "FAIL" in text, text
    code, text = validate(cli, f"{HERE}:make_kernel[factory=1,config=@{HERE}:MISSING]", "decay_moderate")
    assert code == 2 and "config: @" in text and "has no attribute 'MISSING'" in text, text


def test_a_reference_is_parsed_unquoted_only():
    options = spec.parse_spec("m:f[a=@pkg.mod:CONFIG,b='@x',c=3]")[1]
    assert isinstance(options["a"], spec.Reference) and options["a"] == "@pkg.mod:CONFIG"
    assert type(options["b"]) is str and options["c"] == 3
    with pytest.raises(ValueError, match="a=@nocolon is not a reference"):
        spec.parse_spec("m:f[a=@nocolon]")


def _copy_body(x_ref, o_ref):
    o_ref[...] = x_ref[...]


@jax.custom_vjp
def pallas_copy(x):
    """``x`` copied through a ``pl.pallas_call`` (no ``interpret`` argument: off a TPU it needs interpret mode)."""
    return pl.pallas_call(_copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


pallas_copy.defvjp(lambda x: (pallas_copy(x), None), lambda _, dy: (pallas_copy(dy),))  # its backward is Pallas too


def pallas_kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """A correct kernel whose values pass through a Pallas call that takes no ``interpret`` argument."""
    return _pairwise(pallas_copy(q), k, v, g, b, w, scale=scale, initial_state=initial_state)


def test_interpret_runs_a_pallas_kernel_without_an_interpret_argument(cli):
    if jax.default_backend() != "tpu":
        code, text = validate(cli, f"{HERE}:pallas_kernel", "decay_moderate")
        assert code != 0 and "interpret mode" in text, text
    code, text = validate(cli, f"{HERE}:pallas_kernel[interpret=1]", "decay_moderate")
    assert code == 0 and "PASS" in text, text
    code, text = validate(cli, f"{HERE}:pallas_kernel[interpret=xla]", "decay_moderate")
    assert code == 2 and "interpret: expected 1" in text, text


def test_torch_family_options_flags_gva_and_interpret_are_the_torch_bridges():
    """On a ``torch:`` spec, ``flags=`` (empty: none) and ``gva=`` reach the family kernel, and ``interpret`` is the
    torch bridge's (Triton's interpreter), not wrapped as Pallas's."""
    from gdn2_oracle.kernels.torch_bridge import FamilyTorchKernel

    base = "torch:gdn2_oracle.kernels.testing_torch:perturbed[family=gdn"
    none = spec.get(base + ",flags=,gva=none]")
    assert isinstance(none, FamilyTorchKernel) and none.declared == () and none.gva == "none"
    packed = spec.get(base + ",flags=use_qk_l2norm_in_kernel+cu_seqlens,gva=repeat,interpret=0]")
    assert isinstance(packed, FamilyTorchKernel), "interpret=0 on a torch: spec must not wrap it as Pallas's"
    assert packed.declared == ("use_qk_l2norm_in_kernel", "cu_seqlens") and packed.packed
    with pytest.raises(ValueError, match=r"^interpret: expected 1 \(Triton's interpreter on the CPU\) or 0"):
        spec.get(base + ",interpret=2]")
