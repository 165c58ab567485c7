"""FLA's GDN-2, KDA and Gated DeltaNet kernels as peers, through the torch bridge (optional extra: ``pip install
'.[fla]'``).

flash-linear-attention (PyPI ``fla-core``, import name ``fla``) ships, per model, a token-by-token
reference and a chunked reference in pure PyTorch (``fla/ops/<model>/naive.py``) and the Triton
kernels it trains (chunk) and decodes (fused recurrent) with. Registered names (``kernels.get(name, **options)``;
options are the torch bridge's, ``kernels/torch_bridge.py``, e.g. ``device=cpu``, plus ``chunk_size`` for the
chunked ones; the Triton ones take ``interpret=1``):

* ``fla-gdn2-naive-recurrent`` -- ``fla.ops.gdn2.naive.naive_recurrent_gdn2``;
* ``fla-gdn2-naive-chunk``     -- ``fla.ops.gdn2.naive.naive_chunk_gdn2`` (``chunk_size``, default 64);
* ``fla-gdn2-chunk``           -- ``fla.ops.gdn2.chunk_gdn2`` (Triton: a CUDA device, or ``interpret=1``);
* ``fla-kda-naive-recurrent``  -- ``fla.ops.kda.naive.naive_recurrent_kda``;
* ``fla-kda-naive-chunk``      -- ``fla.ops.kda.naive.naive_chunk_kda`` (``chunk_size``, default 64);
* ``fla-kda-chunk``            -- ``fla.ops.kda.chunk_kda`` (Triton);
* ``fla-kda-fused-recurrent``  -- ``fla.ops.kda.fused_recurrent_kda`` (Triton; forward only);
* ``fla-gdn-naive-recurrent``  -- ``fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule``;
* ``fla-gdn-naive-chunk``      -- ``fla.ops.gated_delta_rule.naive.naive_chunk_gated_delta_rule`` (``chunk_size``);
* ``fla-gdn-chunk``            -- ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (Triton);
* ``fla-gdn-fused-recurrent``  -- ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule`` (Triton; forward
  only).

FLA's GDN-2 signature is the suite's (``q, k, v, g, b, w, scale, initial_state, output_final_state``),
so the GDN-2 peers are ``torch:`` kernels with ``output_final_state=True`` and nothing else.
The KDA and GDN peers are family kernels (kernels/families.py: called like ``chunk_kda`` /
``chunk_gated_delta_rule``, ``family`` "kda" / "gdn"; :class:`torch_bridge.FamilyTorchKernel`, which passes
``output_final_state=True``). The naive references get FLA's beta sigmoid, L2 norm and gate transcribed in torch
around them (:data:`FAMILY_NOTE`); GDN's have no GVA, so the adapter repeats q, k to the value heads. The Triton
ones are called as they are, with the flags, ``A_log``/``dt_bias``/``lower_bound`` and ``cu_seqlens`` (B = 1,
states ``[N, HV, K, V]``) passed through (:data:`TRITON_FAMILY_NOTE`); ``fused_recurrent_gated_delta_rule`` takes
``beta`` after ``gk, gv``, so it gets ``g`` and ``beta`` by keyword. FLA's fused-recurrent kernels have no
backward, so those peers are forward only: their VJP is a ValueError with the reason (:data:`NO_BACKWARD`), and a
case that differentiates them (every ``validate`` family case) reports that. ``fla-kda-naive-*[signature=gdn2]``
and ``fla-kda-chunk[signature=gdn2]`` take the GDN-2 contract instead: one gate ``beta`` per head and token, so
they cover the suite's KDA problems, ``b = w = beta * 1`` (:data:`KDA_NOTE`), and refuse other cases by name.

Loading: importing ``fla.ops`` or ``fla.ops.<model>`` runs their ``__init__.py``, which import the
Triton kernels (and so Triton, and a GPU). The naive references need only torch and einops, so we
locate the package with ``importlib.util.find_spec`` (which does not execute it) and load
``ops/<model>/naive.py`` by file path. The Triton kernels import ``fla.ops`` as usual, only where CUDA
is present -- or, with ``interpret=1``, in Triton's interpreter on the CPU (``kernels/triton_interpret.py``:
``TRITON_INTERPRET=1`` is set before Triton is imported, two shims make FLA's kernels run there; float32
only, every floating tensor argument is checked, :data:`INTERPRET_NOTE`; device ``cpu`` unless given). Needs
Triton (``pip install --no-deps triton==3.9.0``). The variable stays set for the process, so the compiled
``fla-*-chunk`` / ``fla-*-fused-recurrent`` are refused in a process that interprets.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

from . import triton_interpret
from .torch_bridge import FamilyTorchKernel, TorchKernel, import_torch

_EXTRA = "install the fla extra: pip install 'gdn2-oracle[fla]' (fla-core, torch)"

KDA_NOTE = ("KDA peer: takes one gate beta per head and token, so it covers b = w = beta * 1 (the suite's KDA "
            "problems) and refuses other cases; beta is read from b[..., 0], so its gradient d beta = "
            "sum_c db_c + sum_c dw_c comes back in db[..., 0] with the rest of db and all of dw zero: db and dw "
            "cannot match the per-channel oracle and fail by construction; o, final_state, dq, dk, dv, dg, dh0 "
            "are comparable")
INTERPRET_NOTE = ("run in Triton's interpreter on the CPU (interpret=1; kernels/triton_interpret.py): float32 "
                  "only, bfloat16 calls are refused: " + triton_interpret.BF16_DOT_NOTE)
SIGNATURES = ("kda", "gdn2")  # the KDA references' signatures: FLA's chunk_kda (the default), or the GDN-2 contract
CHUNK_NOTE = ("naive_chunk_kda needs T % chunk_size == 0: the adapter pads T with identity tokens "
              "(q=k=v=0, g=0, beta=0), exact")


def fla_root():
    """The directory of the installed ``fla`` package, found without importing it."""
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError) as exc:
        raise ValueError(f"name: FLA is not importable ({type(exc).__name__}: {exc}); {_EXTRA}") from None
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"name: the FLA package 'fla' is not installed; {_EXTRA}")
    return Path(list(spec.submodule_search_locations)[0])


def load_naive(model):
    """FLA's pure-PyTorch ``fla/ops/<model>/naive.py`` as a module, loaded by path (``fla/__init__`` not run)."""
    name = f"gdn2_oracle_fla_{model}_naive"  # its own name: ``fla.*`` stays free for a real import of FLA
    if name in sys.modules:
        return sys.modules[name]
    path = fla_root() / "ops" / model / "naive.py"
    if not path.is_file():
        raise ValueError(f"name: this FLA has no {model} reference ({path} is missing); {_EXTRA}")
    import_torch()
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - e.g. einops missing
        raise ValueError(f"name: cannot load {path} ({type(exc).__name__}: {exc}); {_EXTRA}") from None
    sys.modules[name] = module
    return module


def _interpret_flag(interpret):
    """The ``interpret`` option as a bool (0/1/False/True); ValueError naming it otherwise."""
    if isinstance(interpret, bool) or interpret in (0, 1):
        return bool(interpret)
    raise ValueError(f"interpret: expected 0 or 1 (run FLA's Triton kernel in Triton's interpreter on the CPU), "
                     f"got {interpret!r}")


def _triton(model, attr, name, interpret=False):
    """FLA's Triton kernel ``fla.ops.<model>.<attr>``: compiled (ValueError saying it needs CUDA when none is
    present), or with ``interpret`` in Triton's interpreter (set up before ``fla.ops`` imports Triton)."""
    if interpret:
        triton_interpret.enable(f"kernel '{name}[interpret=1]'")  # before anything imports triton
    torch = import_torch()
    if not interpret:
        if not torch.cuda.is_available():
            raise ValueError(f"name: kernel {name!r} is FLA's Triton kernel {attr}, which needs a CUDA device; "
                             f"torch.cuda.is_available() is False here (torch {torch.__version__}); on the CPU, "
                             f"{name}[interpret=1] runs it in Triton's interpreter (float32 only, slow)")
        if triton_interpret.interpreting():
            raise ValueError(f"name: {triton_interpret.ENV}=1 is set in this process, so Triton would run "
                             f"{name!r} in its interpreter, not compiled for CUDA; ask for {name}[interpret=1], "
                             f"or run the compiled kernel in a process without {triton_interpret.ENV}")
    try:
        module = importlib.import_module(f"fla.ops.{model}")
    except Exception as exc:  # noqa: BLE001 - any import failure: say what to install
        raise ValueError(f"name: cannot import fla.ops.{model} ({type(exc).__name__}: {exc}); {_EXTRA}") from None
    return getattr(module, attr)


def float32_only(fn, name):
    """``fn`` refusing (ValueError) any floating tensor argument, positional or keyword, other than float32: the
    interpreter's bf16 ``tl.dot`` is wrong (:data:`triton_interpret.BF16_DOT_NOTE`), so such a call would report a
    logic error that is the interpreter's."""

    def kernel(*args, **kwargs):
        torch = import_torch()
        for i, x in [*enumerate(args), *kwargs.items()]:
            if torch.is_tensor(x) and x.is_floating_point() and x.dtype != torch.float32:
                raise ValueError(f"dtype: {name}[interpret=1] refuses {str(x.dtype).replace('torch.', '')} inputs "
                                 f"(argument {i}): {triton_interpret.BF16_DOT_NOTE}; validate it with "
                                 f"--dtype float32")
        return fn(*args, **kwargs)

    kernel.__name__ = f"{getattr(fn, '__name__', 'kernel')}_float32_only"
    return kernel


def kda_as_gdn2(kda, pad_to=None):
    """A GDN-2-signature torch function running KDA kernel ``kda(q, k, v, g, beta, scale=, initial_state=,
    output_final_state=)`` with ``beta = b[..., 0]``; refuses ``b, w`` other than ``beta * 1``. With
    ``pad_to``, ``T`` is padded to a multiple of it with identity tokens (exact)."""

    def kernel(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, **kwargs):
        torch = import_torch()
        beta = b[..., 0]
        if not (torch.equal(b, beta[..., None].expand_as(b)) and torch.equal(w, beta[..., None].expand_as(w))):
            raise ValueError("b, w: outside the KDA peer's domain: it takes one gate beta per head and token, "
                             "so b and w must both equal beta * 1 (the suite's KDA problems)")
        T = q.shape[1]
        pad = (-T) % pad_to if pad_to else 0
        if pad:
            nn = importlib.import_module("torch.nn.functional")
            q, k, v, g = (nn.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
            beta = nn.pad(beta, (0, 0, 0, pad))
        o, state = kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, **kwargs)
        return o[:, :T], state

    kernel.__name__ = f"{kda.__name__}_as_gdn2"
    return kernel


def _naive_modules(model):
    return (f"gdn2_oracle_fla_{model}_naive", __name__)


def gdn2_naive_recurrent(**options):
    """``fla-gdn2-naive-recurrent``: FLA's token-by-token GDN-2 reference."""
    fn = load_naive("gdn2").naive_recurrent_gdn2
    return TorchKernel(fn, name="fla-gdn2-naive-recurrent", options={"output_final_state": True, **options},
                       modules=_naive_modules("gdn2")[:1])


def gdn2_naive_chunk(**options):
    """``fla-gdn2-naive-chunk``: FLA's chunked GDN-2 reference (WY form, ``chunk_size`` default 64)."""
    fn = load_naive("gdn2").naive_chunk_gdn2
    return TorchKernel(fn, name="fla-gdn2-naive-chunk", options={"output_final_state": True, **options},
                       modules=_naive_modules("gdn2")[:1])


def gdn2_chunk(interpret=False, **options):
    """``fla-gdn2-chunk``: FLA's Triton chunk kernel for GDN-2 (CUDA; ``interpret=1``: Triton's interpreter on
    the CPU, float32 only, device ``cpu`` unless given)."""
    fn, options, note, modules = _triton_peer("gdn2", "chunk_gdn2", "fla-gdn2-chunk", interpret, options)
    return interpreted_float32(TorchKernel(fn, name="fla-gdn2-chunk", options={"output_final_state": True, **options},
                                           note=note, modules=modules or None), interpret)


def _triton_peer(model, attr, name, interpret, options):
    """``(torch function, bridge options, note, modules)`` of FLA's Triton kernel ``fla.ops.<model>.<attr>``,
    compiled or interpreted (``modules``: the ones the report's source hash covers besides the bridge's default)."""
    interpret = _interpret_flag(interpret)
    fn = _triton(model, attr, name, interpret)
    if not interpret:
        return fn, options, None, ()
    modules = (getattr(fn, "__module__", None), __name__, triton_interpret.__name__)
    return (float32_only(fn, name), {"device": "cpu", **options}, INTERPRET_NOTE,
            tuple(m for m in modules if isinstance(m, str) and m in sys.modules))


def interpreted_float32(kernel, interpret):
    """``kernel`` declaring its input dtypes when ``interpret`` runs it in Triton's interpreter: float32 only, the
    reason the interpreter's bf16 ``tl.dot`` (validate lists a bfloat16 case as outside its domain, not run)."""
    if _interpret_flag(interpret):
        kernel.input_dtypes, kernel.input_dtypes_reason = ("float32",), triton_interpret.BF16_DOT_NOTE
    return kernel


def _signature_option(signature, name):
    if signature not in SIGNATURES:
        raise ValueError(f"signature: {signature!r} not one of {SIGNATURES} ({name}: 'kda' is FLA's chunk_kda "
                         f"signature, 'gdn2' the GDN-2 contract on b = w = beta * 1)")
    return signature


def kda_naive_recurrent(signature="kda", **options):
    """``fla-kda-naive-recurrent``: FLA's token-by-token KDA reference in the kda family's signature
    (``signature="gdn2"``: in the GDN-2 contract, on b = w = beta * 1 only)."""
    naive = load_naive("kda").naive_recurrent_kda
    if _signature_option(signature, "fla-kda-naive-recurrent") == "kda":
        return _family_peer("fla-kda-naive-recurrent", "kda", naive, options, FAMILY_NOTE)
    return TorchKernel(kda_as_gdn2(naive), name="fla-kda-naive-recurrent",
                       options={"output_final_state": True, **options}, note=KDA_NOTE, modules=_naive_modules("kda"))


def kda_naive_chunk(chunk_size=64, signature="kda", **options):
    """``fla-kda-naive-chunk``: FLA's chunked KDA reference (T padded to the chunk) in the kda family's signature
    (``signature="gdn2"``: in the GDN-2 contract, on b = w = beta * 1 only)."""
    naive = load_naive("kda").naive_chunk_kda
    if _signature_option(signature, "fla-kda-naive-chunk") == "kda":
        return _family_peer("fla-kda-naive-chunk", "kda", naive, {"chunk_size": chunk_size, **options},
                            f"{FAMILY_NOTE}; {CHUNK_NOTE}", pad_to=chunk_size)
    return TorchKernel(kda_as_gdn2(naive, pad_to=chunk_size), name="fla-kda-naive-chunk",
                       options={"output_final_state": True, "chunk_size": chunk_size, **options},
                       note=f"{KDA_NOTE}; {CHUNK_NOTE}", modules=_naive_modules("kda"))


def kda_chunk(interpret=False, signature="kda", **options):
    """``fla-kda-chunk``: FLA's Triton ``chunk_kda`` in the kda family's signature (CUDA; ``interpret=1``: Triton's
    interpreter on the CPU, float32 only); ``signature="gdn2"``: in the GDN-2 contract, on b = w = beta * 1 only."""
    if _signature_option(signature, "fla-kda-chunk") == "kda":
        return _family_triton("kda", "chunk_kda", "fla-kda-chunk", "kda", interpret, options)
    fn, options, note, modules = _triton_peer("kda", "chunk_kda", "fla-kda-chunk", interpret, options)
    return interpreted_float32(TorchKernel(kda_as_gdn2(fn), name="fla-kda-chunk",
                                           options={"output_final_state": True, **options},
                                           note=KDA_NOTE + (f"; {note}" if note else ""),
                                           modules=modules or (__name__,)), interpret)


# --- FLA's naive references in their families' signatures (kernels/families.py) ------------------------------

FAMILY_NOTE = ("FLA's naive reference in its family's signature; FLA fuses the beta sigmoid, the q/k L2 norm and "
               "the in-kernel gate into its Triton kernels only, so the adapter transcribes them in torch "
               "(s * sigmoid(beta); x * rsqrt(sum x^2 + float32(1e-6)); -exp(A_log) softplus(g + dt_bias), KDA's "
               "bounded lower_bound * sigmoid(exp(A_log) (g + dt_bias))) before calling it; it computes in float32")
GDN_NOTE = "naive_*_gated_delta_rule have no GVA: the adapter repeats q, k to the value heads (repeat_interleave)"
L2NORM_EPS = 1e-6


def family_adapter(naive, family, *, gva=True, pad_to=None, beta_first=False):
    """A torch function in the family signature (``q, k, v, g, beta``, FLA's flags and gate keywords) around
    FLA's naive reference ``naive``: the activations in torch (:data:`FAMILY_NOTE`), then ``naive``; without
    ``gva`` it repeats q, k to the value heads; ``pad_to`` pads T with identity tokens (exact);
    ``beta_first``: ``naive`` takes ``(q, k, v, beta, g)``."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True,
               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
               use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, **kwargs):
        torch = import_torch()
        nn = importlib.import_module("torch.nn.functional")
        if use_qk_l2norm_in_kernel:  # l2norm_fwd: eps inside the square root, in float32
            eps = float(np.float32(L2NORM_EPS))
            q, k = (x.float() * torch.rsqrt((x.float() ** 2).sum(-1, keepdim=True) + eps) for x in (q, k))
        if use_beta_sigmoid_in_kernel:  # fused_beta_sigmoid
            beta = (2.0 if allow_neg_eigval else 1.0) * torch.sigmoid(beta.float())
        if use_gate_in_kernel:
            HV = v.shape[2]
            x = g.float()
            if dt_bias is not None:
                x = x + dt_bias.float().reshape(HV, -1).reshape(x.shape[2:])
            A = None if A_log is None else A_log.float().exp().reshape((HV,) + (1,) * (x.ndim - 3))
            if lower_bound is None:
                g = -A * nn.softplus(x)
            else:
                g = lower_bound * torch.sigmoid(x if A is None else A * x)
        G = v.shape[2] // q.shape[2]
        if not gva and G > 1:
            q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
        T = q.shape[1]
        pad = (-T) % pad_to if pad_to else 0
        if pad:
            q, k, v = (nn.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
            g = nn.pad(g, (0, 0) * (g.ndim - 2) + (0, pad))
            beta = nn.pad(beta, (0, 0, 0, pad))
        args = (q, k, v, beta, g) if beta_first else (q, k, v, g, beta)
        o, state = naive(*args, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                         **kwargs)
        return o[:, :T], state

    kernel.__name__ = f"{naive.__name__}_{family}"
    return kernel


def _family_peer(name, family, naive, options, note, **adapter):
    return FamilyTorchKernel(family_adapter(naive, family, **adapter), name=name, family=family, options=options,
                             note=note, modules=_naive_modules("gated_delta_rule" if family == "gdn" else family))


# FLA's naive Gated DeltaNet references return o in float32 whatever the inputs (kernels/adapt.py's o_dtype): a
# bfloat16 call is judged on that float32 o, not refused as a broken contract.
GDN_NAIVE_O_DTYPE = "float32"


def gdn_naive_recurrent(**options):
    """``fla-gdn-naive-recurrent``: FLA's token-by-token Gated DeltaNet reference
    (``naive_recurrent_gated_delta_rule(q, k, v, beta, g)``: beta before g), in the gdn family's signature."""
    fn = load_naive("gated_delta_rule").naive_recurrent_gated_delta_rule
    kernel = _family_peer("fla-gdn-naive-recurrent", "gdn", fn, options, f"{FAMILY_NOTE}; {GDN_NOTE}", gva=False,
                          beta_first=True)
    kernel.o_dtype = GDN_NAIVE_O_DTYPE
    return kernel


def gdn_naive_chunk(chunk_size=64, **options):
    """``fla-gdn-naive-chunk``: FLA's chunked Gated DeltaNet reference (``chunk_size``, default 64; it pads T
    itself), in the gdn family's signature."""
    fn = load_naive("gated_delta_rule").naive_chunk_gated_delta_rule
    kernel = _family_peer("fla-gdn-naive-chunk", "gdn", fn, {"chunk_size": chunk_size, **options},
                          f"{FAMILY_NOTE}; {GDN_NOTE}", gva=False)
    kernel.o_dtype = GDN_NAIVE_O_DTYPE
    return kernel


# --- FLA's Triton kernels in their families' signatures ---------------------------------------------------------

TRITON_FAMILY_NOTE = ("FLA's Triton kernel in its family's signature, called as it is: the beta sigmoid, the q/k "
                      "L2 norm and the in-kernel gate (use_gate_in_kernel with A_log, dt_bias; KDA's lower_bound) "
                      "are FLA's own, fused in its kernels; takes cu_seqlens (B = 1, states [N, HV, K, V])")
NO_BACKWARD = ("forward only: FLA's fused_recurrent kernels have no backward (fused_recurrent_gated_delta_rule's "
               "raises NotImplementedError, fused_recurrent_kda's results carry no autograd graph), so o and "
               "final_state are its results: validate judges those (ci/running/modes.py: forward_only); its VJP "
               "is refused with this reason")


def _family_triton(model, attr, name, family, interpret, options, *, adapt=None, forward_only=False):
    """A :class:`FamilyTorchKernel` around FLA's Triton kernel ``fla.ops.<model>.<attr>`` (compiled, or interpreted
    through :func:`_triton_peer`), ``adapt``-ed to the family signature where its own differs; ``forward_only``:
    its VJP is refused with :data:`NO_BACKWARD`."""
    fn, options, note, modules = _triton_peer(model, attr, name, interpret, options)
    if adapt is not None:
        fn = adapt(fn)
    notes = "; ".join(n for n in (TRITON_FAMILY_NOTE, NO_BACKWARD if forward_only else None, note) if n)
    return interpreted_float32(
        FamilyTorchKernel(fn, name=name, family=family, options=options, note=notes, modules=modules or None,
                          packed=True, no_backward=f"{name}: {NO_BACKWARD}" if forward_only else None), interpret)


def beta_by_keyword(fused_recurrent):
    """``fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, ...)`` in the gdn family's
    positional order ``(q, k, v, g, beta, ...)``: ``g`` and ``beta`` passed by keyword."""

    def kernel(q, k, v, g, beta, **kwargs):
        return fused_recurrent(q, k, v, g=g, beta=beta, **kwargs)

    kernel.__name__ = f"{getattr(fused_recurrent, '__name__', 'kernel')}_gdn"
    return kernel


def gdn_chunk(interpret=False, **options):
    """``fla-gdn-chunk``: FLA's Triton ``chunk_gated_delta_rule`` in the gdn family's signature (CUDA;
    ``interpret=1``: Triton's interpreter on the CPU, float32 only; ``chunk_size`` 16, 32 or 64 passed through)."""
    return _family_triton("gated_delta_rule", "chunk_gated_delta_rule", "fla-gdn-chunk", "gdn", interpret, options)


def gdn_fused_recurrent(interpret=False, **options):
    """``fla-gdn-fused-recurrent``: FLA's Triton ``fused_recurrent_gated_delta_rule`` in the gdn family's signature,
    forward only (CUDA; ``interpret=1``: Triton's interpreter on the CPU, float32 only)."""
    return _family_triton("gated_delta_rule", "fused_recurrent_gated_delta_rule", "fla-gdn-fused-recurrent", "gdn",
                          interpret, options, adapt=beta_by_keyword, forward_only=True)


def kda_fused_recurrent(interpret=False, **options):
    """``fla-kda-fused-recurrent``: FLA's Triton ``fused_recurrent_kda`` in the kda family's signature, forward only
    (CUDA; ``interpret=1``: Triton's interpreter on the CPU, float32 only)."""
    return _family_triton("kda", "fused_recurrent_kda", "fla-kda-fused-recurrent", "kda", interpret, options,
                          forward_only=True)
