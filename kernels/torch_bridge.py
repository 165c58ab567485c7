"""PyTorch (and Triton) GDN-2 kernels behind the JAX contract: ``torch:pkg.mod:attr[options]``.

A ``jax.custom_vjp`` around two ``jax.pure_callback``s: the forward runs the torch function, the backward runs
it again under autograd for all seven gradients. Arrays cross exactly; ``order``/``layout``/``decay_base`` and
the keyword options map another signature onto the contract. The options, the probe and what is checked
where: docs/DESIGN.md §2, "PyTorch kernels".

FLA ``chunk_gdn2``'s training-call modes (docs/DESIGN.md §2, "Call modes (training)") pass through with FLA's
keyword names (:data:`MODE_KEYWORDS`): ``cu_seqlens`` (host-readable ints, B == 1, handed to torch as a
LongTensor on the device; states ``[N, H, K, V]``), ``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel`` with
``A_log [H]`` / ``dt_bias [H*K]`` (differentiated: their gradients come back from ``torch.autograd.grad``
with the others) and ``lower_bound``, ``state_v_first`` (states ``[..., V, K]``), ``return_intermediate_states``
(a third result; forward only, run under ``torch.inference_mode()`` as FLA requires). A kernel declares in its
``__signature__`` only the mode keywords its torch function takes (a ``**kwargs`` takes them all), so
``ci.running.modes.accepted_modes`` reads what the torch function accepts.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np

from . import kernel_warnings, triton_interpret
from .adapt import LAYOUTS, TENSORS, parse_order
from .contract import check_finite_values, check_inputs
from .families import FAMILIES, check_family_call, check_family_values
from .family_keywords import FAMILY_KEYWORDS, GATE_KEYWORDS, declared_flags, hidden_keywords  # noqa: F401 - re-export
from .modes import check_cu_seqlens, check_gate, check_state
from .spec import inner_callable, resolve, signature_of

RESULT_NAMES = ("o", "final_state", "intermediate_states")
# FLA chunk_gdn2's training-call keywords and their defaults (the plain contract).
MODE_KEYWORDS = {"cu_seqlens": None, "use_qk_l2norm_in_kernel": False, "use_gate_in_kernel": False, "A_log": None,
                 "dt_bias": None, "lower_bound": None, "state_v_first": False, "return_intermediate_states": False}
MODE_FLAGS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "state_v_first", "return_intermediate_states")
PARAMS = ("A_log", "dt_bias")  # the differentiated gate parameters
DECAY_BASES = ("e", 2)
LOG2E = 1.0 / math.log(2.0)  # g / ln 2 = g * log2(e)
MAPPING_OPTIONS = ("order", "scale_arg", "state_arg", "layout", "decay_base", "device")
_BF16 = np.dtype(jnp.bfloat16)
_INSTALL = "install PyTorch: pip install 'gdn2-oracle[torch]'"


class TorchContractError(ValueError):
    """A torch kernel's result breaks the contract where only torch can see it (type, device, autograd)."""


def import_torch():
    """The ``torch`` module, or a ValueError saying how to install it."""
    try:
        return importlib.import_module("torch")
    except Exception as exc:  # noqa: BLE001 - any import failure: say what to install
        raise ValueError(f"name: torch kernels need PyTorch ({type(exc).__name__}: {exc}); {_INSTALL}") from None


def to_torch(x, device):
    """An exact torch copy of array ``x`` on ``device`` (bfloat16 through its 16-bit pattern)."""
    torch = import_torch()
    a = np.asarray(x)
    if a.dtype == _BF16:
        return torch.from_numpy(np.array(a.view(np.uint16))).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.array(a)).to(device)


def to_numpy(t):
    """An exact NumPy copy of tensor ``t`` (bfloat16 as ``jnp.bfloat16``)."""
    torch = import_torch()
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def numpy_dtype(dtype):
    """The NumPy dtype of a floating torch dtype the bridge hands over, or None."""
    torch = import_torch()
    return {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
            torch.bfloat16: _BF16, torch.float16: np.dtype(np.float16)}.get(dtype)


def resolve_device(device):
    """The torch device: ``device`` if given, else CUDA when available, else the CPU (CUDA with its index).
    ValueError naming ``device`` when it is no torch device or this host cannot hold a tensor there and read it
    back (a backend torch lacks here, ``meta``, a CUDA index past the last GPU)."""
    torch = import_torch()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: {device!r} is not a torch device ({_first_line(exc)})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for CUDA, but torch.cuda.is_available() is False")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    try:  # one value there and back: a kernel's results are read on the host
        torch.zeros(1, device=dev).cpu()
    except Exception as exc:  # noqa: BLE001 - any backend's refusal is this option's usage error
        raise ValueError(f"device: {device!r} is not usable on this host ({type(exc).__name__}: "
                         f"{_first_line(exc)})") from None
    return dev


def _first_line(exc, limit=160):
    """The first line of an exception's message, at most ``limit`` characters (torch's run on for pages)."""
    line = (str(exc).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _refused_keywords(fn, keywords):
    """The ``keywords`` a torch function's signature (read through pass-through wrappers) cannot take (none when it
    has ``**kwargs`` or no signature)."""
    try:
        params = signature_of(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return sorted(k for k in keywords if k not in names)


def accepted_mode_keywords(fn, _depth=0):
    """The keywords of :data:`MODE_KEYWORDS` torch function ``fn`` takes: those its signature names; with
    ``**kwargs``, all of them (FLA's ``chunk_gdn2`` names most and takes ``A_log``/``dt_bias`` through
    ``**kwargs``) -- except a pass-through wrapper (``**kwargs`` and no mode keyword named) around one function
    (its ``__wrapped__``, else the one callable it closes over), which takes what that function takes (FLA's
    peers wrap ``chunk_gdn2`` in a float32 check and the KDA kernels in a GDN-2 signature); none without a
    signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    named = tuple(k for k in MODE_KEYWORDS if k in names)
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return named
    inner = inner_callable(fn)
    if named or inner is None or _depth >= 8:
        return tuple(MODE_KEYWORDS)
    return accepted_mode_keywords(inner, _depth + 1)


def _nonzero_probe(names, zeros):
    """Probe inputs with every value nonzero (q, k, v, b, w = 0.5, g = -0.1, h0, A_log, dt_bias = 0.5) in the
    zeros' shapes."""
    values = dict(zip(TENSORS, (0.5, 0.5, 0.5, -0.1, 0.5, 0.5)))
    return [z.detach().clone().fill_(values.get(n, 0.5)).requires_grad_(z.requires_grad)
            for n, z in zip(names, zeros)]


class TorchKernel:
    """A torch callable ``fn`` behind the JAX contract of docs/DESIGN.md §2 (options: the module docstring)."""

    no_backward = None  # why the torch function has no backward (a forward-only kernel), or None

    def __init__(self, fn, *, name, options=None, note=None, modules=None, mode_keywords=None):
        if not callable(fn):
            raise ValueError(f"name: {name!r} is not callable ({type(fn).__name__})")
        options = dict(options or {})
        self.fn = fn
        self.order = parse_order(options.pop("order", "qkvgbw"))
        self.scale_arg = options.pop("scale_arg", "scale")
        self.state_arg = options.pop("state_arg", "initial_state")
        for key in ("scale_arg", "state_arg"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and value.isidentifier()):
                raise ValueError(f"{key}: expected a keyword name or None, got {value!r}")
        self.layout = str(options.pop("layout", "bthk")).lower()
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: {self.layout!r} not one of {LAYOUTS}")
        base = options.pop("decay_base", "e")
        self.decay_base = {"e": "e", "natural": "e", 2: 2, "2": 2}.get(base)
        if self.decay_base is None:
            raise ValueError(f"decay_base: {base!r} not one of 'e' (natural log-decay) or 2")
        self.device = resolve_device(options.pop("device", None))
        self.kwargs = options  # passed through to fn
        refused = _refused_keywords(fn, [*options, *(k for k in (self.scale_arg, self.state_arg) if k)])
        if refused:
            raise ValueError(f"options: {name!r} does not accept the keyword(s) {refused} (its signature has no such "
                             "parameter and no **kwargs)")
        self.__name__ = name
        # The mode keywords the torch function takes (``mode_keywords`` overrides what its signature says).
        self.mode_keywords = accepted_mode_keywords(fn) if mode_keywords is None else tuple(mode_keywords)
        bad = [m for m in self.mode_keywords if m not in MODE_KEYWORDS]
        if bad:
            raise ValueError(f"mode_keywords: {bad} not among FLA's mode keywords {list(MODE_KEYWORDS)}")
        self.__signature__ = _signature(self.mode_keywords)
        self.modules = tuple(modules) if modules else _module_names(fn)
        self._note_prefix = f"{note + '; ' if note else ''}torch {import_torch().__version__} on {self.device}"
        self._calls = {}
        self.notes = []

    @property
    def note(self):
        """What a report says about this kernel: its torch version, device and mapping, and what was learned
        while running it."""
        mapping = ", ".join(f"{k}={v}" for k, v in self.mapping().items())
        return "; ".join([f"{self._note_prefix} through the torch bridge ({mapping})", *self.notes])

    def mapping(self):
        """The argument mapping in force (for notes and reports)."""
        return {"order": "".join(self.order), "scale_arg": self.scale_arg, "state_arg": self.state_arg,
                "layout": self.layout, "decay_base": self.decay_base, **self.kwargs}

    def __repr__(self):
        return f"TorchKernel({self.__name__!r}, {self.mapping()})"

    # --- the JAX side -----------------------------------------------------------------------

    def __call__(self, q, k, v, g, b, w, *, scale=None, initial_state=None, check_values=False, **modes):
        unknown = sorted(set(modes) - set(self.mode_keywords))
        if unknown:
            raise TypeError(f"{self.__name__}: got unexpected keyword argument(s) {unknown} (its torch function "
                            f"takes the mode keywords {list(self.mode_keywords) or 'none'})")
        modes = {n: x for n, x in modes.items() if not _is_default(n, x)}
        if not modes:
            shape, scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                                        check_values=check_values)
        else:
            shape, scale, modes = self._check_modes(q, k, v, g, b, w, scale, initial_state, check_values, modes)
        if self.scale_arg is None and scale != float(shape.K) ** -0.5:
            raise ValueError(f"scale: the kernel takes no scale (scale_arg=None), so only the default "
                             f"K**-0.5 = {float(shape.K) ** -0.5} can be validated, got {scale}")
        named = dict(zip(TENSORS, (q, k, v, g, b, w)))
        if initial_state is not None:
            named["h0"] = initial_state
        for p in PARAMS:
            if modes.get(p) is not None:
                named[p] = modes.pop(p)
        names, arrays = tuple(named), tuple(named.values())
        static = tuple(sorted(modes.items()))
        key = (names, tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in arrays), scale, static)
        if key not in self._calls:
            self._calls[key] = self._build(names, arrays, scale, static)
        return self._calls[key](*arrays)

    def _check_modes(self, q, k, v, g, b, w, scale, initial_state, check_values, modes):
        """``(shape, scale, static modes)`` of a call with mode keywords (kernels/modes.py's checks): ValueError
        on a bad one; ``cu_seqlens`` becomes a tuple of ints (it must be host-readable: it fixes N and the
        results' shapes)."""
        for name in MODE_FLAGS:
            if name in modes and not isinstance(modes[name], (bool, np.bool_)):
                raise ValueError(f"{name}: expected a bool, got {modes[name]!r}")
            if name in modes:
                modes[name] = bool(modes[name])
        shape, scale = check_inputs(q, k, v, g, b, w, scale=scale)
        B, T, H, K, V = shape
        gate = modes.get("use_gate_in_kernel", False)
        if gate and self.decay_base == 2:
            raise ValueError("use_gate_in_kernel: the kernel takes base-2 log-decays (decay_base=2), but with the "
                             "in-kernel gate g is a raw pre-activation, which has no base to convert")
        lb = check_gate(gate, modes.get("A_log"), modes.get("dt_bias"), modes.get("lower_bound"), H, K)
        if lb is not None:
            modes["lower_bound"] = lb
        cu = modes.get("cu_seqlens")
        if cu is not None:
            if isinstance(cu, jax.core.Tracer):
                raise ValueError("cu_seqlens: traced; a torch kernel needs its values on the host (they fix the "
                                 "number of sequences and the results' shapes): pass it as a NumPy array")
            cu = check_cu_seqlens(np.asarray(cu), B, T, True)
            modes["cu_seqlens"] = tuple(int(x) for x in cu)
        N = B if cu is None else len(modes["cu_seqlens"]) - 1
        v_first = modes.get("state_v_first", False)
        check_state(initial_state, (N, H) + ((V, K) if v_first else (K, V)), cu is not None, v_first)
        if check_values:
            named = dict(q=q, k=k, v=v, g=g, b=b, w=w)
            if not gate:
                check_finite_values(named, initial_state)
            else:  # a raw gate may be positive: finiteness only
                for name, x in dict(named, A_log=modes.get("A_log"), dt_bias=modes.get("dt_bias"),
                                    initial_state=initial_state).items():
                    if x is not None and not bool(jnp.all(jnp.isfinite(jnp.asarray(x, jnp.float32)))):
                        raise ValueError(f"{name}: contains NaN or inf")
        return shape, scale, modes

    def _build(self, names, arrays, scale, static):
        """The custom-VJP JAX function for one signature (names, shapes, dtypes, scale, mode keywords)."""
        specs, single = self._probe(names, arrays, scale, static)
        out_avals = tuple(jax.ShapeDtypeStruct(s, d) for s, d in specs)
        in_avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays)
        n_in = len(arrays)
        refusal = self.backward_refusal(static)

        def host_forward(*xs):
            return self.host_forward(names, xs, scale, static, specs)

        def host_backward(*xs):
            return self.host_backward(names, xs[:n_in], xs[n_in:], scale, static)

        @jax.custom_vjp
        def call(*xs):
            return jax.pure_callback(host_forward, out_avals, *xs, vmap_method="sequential")

        def call_fwd(*xs):
            return call(*xs), xs

        def call_bwd(xs, cts):
            if refusal is not None:
                raise ValueError(refusal)
            return tuple(jax.pure_callback(host_backward, in_avals, *xs, *cts, vmap_method="sequential"))

        call.defvjp(call_fwd, call_bwd)
        if single:
            return lambda *xs: call(*xs)[0]
        return call

    def backward_refusal(self, static):
        """Why a call with the mode keywords ``static`` has no backward (its VJP is a ValueError saying so), or None:
        with ``return_intermediate_states``, or when the kernel is forward only (``no_backward``)."""
        if dict(static).get("return_intermediate_states", False):
            return ("return_intermediate_states: forward only (FLA returns the states at chunk starts only under "
                    "torch.inference_mode(), with no backward)")
        return self.no_backward

    # --- the torch side ---------------------------------------------------------------------

    def invoke(self, names, ts, scale, static=()):
        """Call the torch function on contract-layout tensors ``ts`` (named by ``names``: q..w[, h0][, A_log]
        [, dt_bias]) with the mapping applied and the mode keywords ``static`` (``(name, value)`` pairs)."""
        torch = import_torch()
        given = dict(zip(names, ts))
        named = {n: given[n] for n in TENSORS}
        if self.decay_base == 2:
            named["g"] = (named["g"].double() * LOG2E).float()
        if self.layout == "bhtk":
            named = {n: x.transpose(1, 2).contiguous() for n, x in named.items()}
        kwargs = dict(self.kwargs)
        has_state = "h0" in given
        named["s"], named["h"] = scale, given.get("h0")  # positional with order=...sh
        if self.scale_arg is not None and "s" not in self.order:
            kwargs[self.scale_arg] = scale
        if has_state and "h" not in self.order:
            if self.state_arg is not None:
                kwargs[self.state_arg] = named["h"]
            elif bool(torch.any(named["h"] != 0)):
                raise ValueError("initial_state: the kernel takes no initial state (state_arg=None), "
                                 "but this case has a nonzero one")
        for name, value in static:
            kwargs[name] = (torch.tensor(value, dtype=torch.long, device=self.device) if name == "cu_seqlens"
                            else value)
        for name in PARAMS:
            if name in given:
                kwargs[name] = given[name]
        return self.results(kernel_warnings.call(self.fn, self.__name__, *(named[n] for n in self.order), **kwargs))

    def results(self, out):
        """``(list of result tensors in the contract layout, single)``; TorchContractError for non-tensors
        or tensors off the device."""
        torch = import_torch()
        single = torch.is_tensor(out)
        if single:
            out = [out]
        elif not isinstance(out, (tuple, list)):
            raise TorchContractError(f"returned a {type(out).__name__}, expected a tuple (o, final_state) of tensors")
        out = list(out)
        for i, r in enumerate(out):
            name = RESULT_NAMES[i] if i < len(RESULT_NAMES) else f"result {i}"
            if r is None:
                hint = ("; FLA-style kernels return it only with output_final_state=True in the spec"
                        if i == 1 and "output_final_state" not in self.kwargs else "")
                raise TorchContractError(f"returned {name} = None, expected a tensor{hint}")
            if not torch.is_tensor(r):
                raise TorchContractError(f"returned {name} of type {type(r).__name__}, expected a torch.Tensor")
            if r.device != self.device:
                raise TorchContractError(f"returned {name} on device {r.device}, expected {self.device} "
                                         f"(where its inputs are)")
            if numpy_dtype(r.dtype) is None:
                raise TorchContractError(f"returned {name} of dtype {r.dtype}, expected a floating dtype")
        if self.layout == "bhtk" and out[0].ndim == 4:
            out[0] = out[0].transpose(1, 2)
        return out, single

    def differentiable(self, results):
        """TorchContractError unless every result carries an autograd graph."""
        for i, r in enumerate(results):
            if not r.requires_grad:
                name = RESULT_NAMES[i] if i < len(RESULT_NAMES) else f"result {i}"
                raise TorchContractError(
                    f"returned {name} without an autograd graph: it is not differentiable through torch "
                    f"autograd (computed under no_grad, detached, or by an op without a backward)")

    def _probe(self, names, arrays, scale, static):
        """Run the kernel once on zeros of the call's shapes and dtypes: ``([(shape, dtype)], single)``."""
        torch = import_torch()
        forward_only = self.backward_refusal(static) is not None
        zeros = [to_torch(np.zeros(x.shape, jnp.dtype(x.dtype)), self.device).requires_grad_(not forward_only)
                 for x in arrays]
        with _grad_mode(torch, forward_only):
            try:
                results, single = self.invoke(names, zeros, scale, static)
            except (TorchContractError, ValueError):
                raise
            except Exception:  # noqa: BLE001 - a kernel that refuses all-zero inputs: probe on nonzero ones
                results, single = self.invoke(names, _nonzero_probe(names, zeros), scale, static)
                self.notes.append("refuses all-zero inputs (its shapes were learned on a nonzero probe)")
        if not forward_only:
            self.differentiable(results)
        specs = []
        for i, r in enumerate(results):
            dt = numpy_dtype(r.dtype)
            if jax.dtypes.canonicalize_dtype(dt) != dt:
                name = RESULT_NAMES[i] if i < len(RESULT_NAMES) else f"result {i}"
                raise TorchContractError(f"returned {name} of dtype {r.dtype}, which JAX holds only with "
                                         f"jax_enable_x64; the contract wants float32 or v's dtype")
            specs.append((tuple(r.shape), dt))
        return specs, single

    def _same_as_probe(self, results, specs):
        """TorchContractError if this call's results differ in count, shape or dtype from the probe's."""
        got = [(tuple(r.shape), numpy_dtype(r.dtype)) for r in results]
        if got != list(specs):
            raise TorchContractError(f"returned results {got} on this call but {list(specs)} on zeros of the "
                                     f"same shapes (the results' shapes must not depend on the values)")

    def host_forward(self, names, xs, scale, static, specs):
        """The forward callback: NumPy inputs -> torch -> NumPy results (under ``torch.inference_mode()`` with
        ``return_intermediate_states``, as FLA requires; else ``torch.no_grad()``)."""
        torch = import_torch()
        ts = [to_torch(x, self.device) for x in xs]
        forward_only = dict(static).get("return_intermediate_states", False)
        with (torch.inference_mode() if forward_only else torch.no_grad()):
            results, _ = self.invoke(names, ts, scale, static)
        self._same_as_probe(results, specs)
        return tuple(to_numpy(r) for r in results)

    def host_backward(self, names, xs, cts, scale, static):
        """The backward callback: re-run the forward with autograd, pull the cotangents back to every input
        (the gate parameters ``A_log``/``dt_bias`` too, when the call has them)."""
        torch = import_torch()
        leaves = [to_torch(x, self.device).requires_grad_(True) for x in xs]
        with torch.enable_grad():
            results, _ = self.invoke(names, leaves, scale, static)
        self.differentiable(results)
        grads = torch.autograd.grad(results, leaves, grad_outputs=[to_torch(c, self.device) for c in cts],
                                    allow_unused=True)
        return tuple(to_numpy(torch.zeros_like(x) if d is None else d) for x, d in zip(leaves, grads))


def _grad_mode(torch, forward_only):
    """The probe's autograd mode: inference mode for a forward-only call, else autograd on."""
    return torch.inference_mode() if forward_only else torch.enable_grad()


def _is_default(name, value):
    """Whether mode keyword ``name`` has its default value (a call with only defaults is the plain contract)."""
    default = MODE_KEYWORDS[name]
    return value is None if default is None else (isinstance(value, (bool, np.bool_)) and bool(value) == default)


def _signature(mode_keywords):
    """``TorchKernel.__call__``'s signature with ``mode_keywords`` as keyword-only parameters (no ``**modes``)."""
    params = [p for p in inspect.signature(TorchKernel.__call__).parameters.values()
              if p.name != "self" and p.kind is not p.VAR_KEYWORD]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=MODE_KEYWORDS[n]) for n in mode_keywords]
    return inspect.Signature(params)


def _module_names(fn):
    """The importable module defining ``fn`` (for the source hash of reports), if any."""
    mod = getattr(fn, "__module__", None)
    return (mod,) if isinstance(mod, str) and mod in sys.modules else ()


def torch_kernel(target, family=None, interpret=None, **options):
    """The ``torch:`` spec: ``target`` is ``package.module:attr``, a torch callable; options as documented. With
    ``family`` (``gdn`` / ``kda``) the callable is in that FLA family's signature (:class:`FamilyTorchKernel`;
    packed sequences when it names ``cu_seqlens``). ``interpret=1``: its Triton kernels run in Triton's
    interpreter on the CPU (kernels/triton_interpret.py; chosen before the module is imported, and the Triton
    functions loaded before are switched to it), which the kernel's note says."""
    note = None
    if interpret not in (None, 0, False):
        if interpret not in (1, True):
            raise ValueError(f"interpret: expected 1 (Triton's interpreter on the CPU) or 0, got {interpret!r}")
        switched = "triton" in sys.modules and not triton_interpret.interpreting()
        triton_interpret.enable(f"kernel 'torch:{target}[interpret=1]'")
        before = "; triton was imported before: its loaded JIT functions were switched to the interpreter"
        note = (f"interpret=1: its Triton kernels run in Triton's interpreter on the CPU "
                f"(kernels/triton_interpret.py{before if switched else ''}); {triton_interpret.BF16_DOT_NOTE}")
    fn = resolve(target)
    if family is None:
        return TorchKernel(fn, name=f"torch:{target}", options=options, note=note)
    return FamilyTorchKernel(fn, name=f"torch:{target}", family=family, options=options, note=note,
                             packed=_names_keyword(fn, "cu_seqlens"))


def _names_keyword(fn, name):
    """Whether callable ``fn`` takes keyword ``name`` (by name or through ``**kwargs``, its signature read through
    pass-through wrappers; unknown signature: yes)."""
    try:
        params = signature_of(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


# FLA's family keywords, hidden ones and the ``flags=`` option: kernels/family_keywords.py (shared with JAX kernels)
GVA_OPTIONS = ("repeat", "none")  # no grouped value heads: q, k repeated to v's heads, or G = 1 only
_DEFAULT_ARGS = {"scale_arg": "scale", "state_arg": "initial_state"}
_NO_STATE = "initial_state: the kernel takes no initial state (state_arg=None), but this call has a nonzero one"


class FamilyTorchKernel(TorchKernel):
    """A torch function in the signature of an FLA family (``gdn`` / ``kda``; kernels/families.py) behind JAX:
    ``fn(q, k, v, g, beta, scale=, initial_state=, output_final_state=True, **flags)`` called with the family
    call's flags (``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``,
    ``use_gate_in_kernel``, and ``lower_bound``) and, differentiated like the other inputs, ``A_log`` and
    ``dt_bias``. ``order``: the positional order of the five tensors as names separated by ``,`` or a tuple
    (default ``q,k,v,g,beta``; FLA's naive GDN recurrence takes ``q,k,v,beta,g``). ``scale_arg`` / ``state_arg``:
    the keywords of the scale and the initial state (``None``: not passed; then only the default scale / a zero
    state). Options as :class:`TorchKernel`'s (``device``, keywords passed through); ``family`` is the kernel's
    attribute.

    ``flags``: the FLA keywords of :data:`FAMILY_KEYWORDS` the torch function takes (``+``-separated, empty for
    none); without it, those its signature names (read through pass-through wrappers), and those it can only take
    through ``**kwargs`` are :attr:`hidden_keywords` (the judge probes them, ``ci/running/flag_probe.py``), with
    ``scale`` when the scale's keyword is neither named nor given as ``scale_arg``. ``gva``:
    the torch function has no grouped value heads: ``repeat`` feeds it q, k repeated to v's heads (value head
    ``hv`` reads key head ``hv // G``, ``repeat_interleave``; inside torch, so the gradients sum back), ``none``
    takes only calls with as many key as value heads.

    ``packed``: ``fn`` takes FLA's ``cu_seqlens`` (packed sequences: ``B == 1``, host-readable offsets handed to
    torch as a LongTensor, states ``[N, HV, K, V]``); the kernel then takes it too. ``no_backward``: why ``fn``
    has no backward (a forward-only kernel: its VJP is a ValueError saying so)."""

    TENSORS = ("q", "k", "v", "g", "beta")

    def __init__(self, fn, *, name, family, options=None, note=None, modules=None, packed=False,
                 no_backward=None):
        if family not in FAMILIES:
            raise ValueError(f"family: {family!r} not one of {FAMILIES}")
        options = dict(options or {})
        order = options.pop("order", self.TENSORS)
        order = tuple(order.split(",")) if isinstance(order, str) else tuple(order)
        if sorted(order) != sorted(self.TENSORS):
            raise ValueError(f"order: {order!r} is not the five tensors {self.TENSORS} in some order")
        declared = declared_flags(options.pop("flags", None))
        scale_given = "scale_arg" in options
        self.gva = options.pop("gva", None)
        if self.gva is not None and self.gva not in GVA_OPTIONS:
            raise ValueError(f"gva: {self.gva!r} not one of {GVA_OPTIONS} (q, k repeated to v's heads, or only calls "
                             "with HV == H)")
        super().__init__(fn, name=name, options=options, note=note, modules=modules, mode_keywords=())
        self.family, self.order = family, order
        self.declared = declared
        self.packed = bool(packed) if declared is None else "cu_seqlens" in declared
        self.no_backward = no_backward
        # FLA's keywords the torch function takes only through **kwargs, unproven (none when declared)
        # (and "scale" when the scale keyword, not given as an option, is not named either)
        self.hidden_keywords = hidden_keywords(fn, declared=declared, packed=self.packed,
                                               scale_arg=None if scale_given else self.scale_arg)
        # the keywords the wrapper takes: those of the family call the torch function takes too (FLA's flags, the gate
        # parameters, cu_seqlens when packed), so the judge runs it on the cases it can be called on
        sig = inspect.signature(type(self).__call__)
        own = ("self", "q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "check_values")
        self.__signature__ = sig.replace(parameters=[
            p for p in sig.parameters.values() if p.name in own or self._takes(p.name)])
        if self.gva is not None:
            self.notes.append(
                "gva=repeat: no grouped value heads of its own; q, k repeated to v's heads (value head hv reads key "
                "head hv // G), inside torch" if self.gva == "repeat" else
                "gva=none: no grouped value heads; only calls with as many key as value heads (HV == H) are run")

    def _takes(self, keyword):
        """Whether the wrapper takes family keyword ``keyword``: declared (``flags=``), else the torch function
        takes it (cu_seqlens: when packed)."""
        if keyword == "cu_seqlens":
            return self.packed
        if self.declared is not None:
            return keyword in self.declared or (keyword in GATE_KEYWORDS and "use_gate_in_kernel" in self.declared)
        return _names_keyword(self.fn, keyword)

    def mapping(self):
        out = {"order": ",".join(self.order), "family": getattr(self, "family", None)}
        out.update({k: getattr(self, k) for k in ("scale_arg", "state_arg") if getattr(self, k) != _DEFAULT_ARGS[k]})
        if getattr(self, "declared", None) is not None:
            out["flags"] = "+".join(self.declared)
        if self.gva is not None:
            out["gva"] = self.gva
        return {**out, **self.kwargs}

    def __call__(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                 use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, cu_seqlens=None,
                 check_values=False):
        flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                     use_gate_in_kernel=use_gate_in_kernel)
        shape, scale, lb = check_family_call(self.family, q, k, v, g, beta, scale=scale,
                                             initial_state=None if cu_seqlens is not None else initial_state,
                                             flags=dict(flags, output_final_state=output_final_state), A_log=A_log,
                                             dt_bias=dt_bias, lower_bound=lower_bound, packed=cu_seqlens is not None)
        B, T, H, HV, K, V = shape
        if self.gva == "none" and H != HV:
            raise ValueError(f"gva: kernel {self.__name__!r} has no grouped value heads (gva=none), but this call has "
                             f"HV = {HV} value heads over H = {H} key heads")
        if self.scale_arg is None and scale != float(K) ** -0.5:
            raise ValueError(f"scale: the kernel takes no scale (scale_arg=None), so only the default "
                             f"K**-0.5 = {float(K) ** -0.5} can be validated, got {scale}")
        if (self.state_arg is None and initial_state is not None and not isinstance(initial_state, jax.core.Tracer)
                and np.any(np.asarray(initial_state) != 0)):  # traced: the callback refuses it (invoke)
            raise ValueError(_NO_STATE)
        # only the flags that are on: a torch function need not take the others
        static = {**{n: True for n, f in flags.items() if f}, **({} if lb is None else {"lower_bound": lb})}
        if cu_seqlens is not None:
            static["cu_seqlens"] = self._offsets(cu_seqlens, shape, initial_state)
        if check_values:
            check_family_values(use_gate_in_kernel, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                A_log=A_log, dt_bias=dt_bias)
        named = dict(q=q, k=k, v=v, g=g, beta=beta)
        if initial_state is not None:
            named["h0"] = initial_state
        for p, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None:
                named[p] = x
        static = tuple(sorted(static.items()))
        names, arrays = tuple(named), tuple(named.values())
        key = (names, tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in arrays), scale, static)
        if key not in self._calls:
            self._calls[key] = self._build(names, arrays, scale, static)
        o, final = self._calls[key](*arrays)
        return o, (final if output_final_state else None)

    def _offsets(self, cu_seqlens, shape, initial_state):
        """``cu_seqlens`` as a tuple of ints (kernels/modes.py's checks; the initial state ``[N, HV, K, V]``),
        ValueError naming it when the kernel takes none or it is traced (it fixes N and the results' shapes)."""
        if not self.packed:
            raise ValueError(f"cu_seqlens: kernel {self.__name__!r} takes no packed sequences")
        if isinstance(cu_seqlens, jax.core.Tracer):
            raise ValueError("cu_seqlens: traced; a torch kernel needs its values on the host (they fix the number "
                             "of sequences and the results' shapes): pass it as a NumPy array")
        B, T, _, HV, K, V = shape
        cu = check_cu_seqlens(np.asarray(cu_seqlens), B, T, True)
        check_state(initial_state, (len(cu) - 1, HV, K, V), True, False)
        return tuple(int(x) for x in cu)

    def invoke(self, names, ts, scale, static=()):
        """Call the torch function: the five tensors in ``order`` (q, k repeated to v's heads with ``gva=repeat``),
        the scale and the state (as ``scale_arg`` / ``state_arg``, unless None), the flags, the gate parameters and
        ``cu_seqlens`` (a LongTensor on the device) as keywords, ``output_final_state=True``."""
        torch = import_torch()
        given = dict(zip(names, ts))
        kwargs = {**self.kwargs, **dict(static), "output_final_state": True}
        if self.scale_arg is not None:
            kwargs[self.scale_arg] = scale
        if "cu_seqlens" in kwargs:
            kwargs["cu_seqlens"] = torch.tensor(kwargs["cu_seqlens"], dtype=torch.long, device=self.device)
        if "h0" in given and self.state_arg is not None:
            kwargs[self.state_arg] = given["h0"]
        elif "h0" in given and bool(torch.any(given["h0"] != 0)):
            raise ValueError(_NO_STATE)
        heads = given["v"].shape[2]
        if self.gva == "repeat" and given["q"].shape[2] != heads:  # value head hv reads key head hv // G
            for n in ("q", "k"):
                given[n] = given[n].repeat_interleave(heads // given[n].shape[2], dim=2)
        for name in PARAMS:
            if name in given:
                kwargs[name] = given[name]
        return self.results(kernel_warnings.call(self.fn, self.__name__, *(given[n] for n in self.order), **kwargs))
