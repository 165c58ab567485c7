"""Calling a kernel with another signature or another shape than the contract's (docs/DESIGN.md §2, "Mapping
and padding options").

``mapped(fn, order=, layout=, scale_arg=, state_arg=, decay_base=)``: a JAX function with its own positional
order (``order=qkvwbgsh``: the six tensors, then ``s`` the scale and ``h`` the initial state positionally),
head-major layout (``layout=bhtk``), the scale or state under other keywords, or ``exp2`` log-decays.
``padded(fn, pad="K128V128T256")``: a kernel that needs K, V and T to be multiples, run on zero channels and
identity tokens appended at the end and sliced back. Exact: a zero key channel has ``q = k = b = 0, g = 0`` and
a zero ``h0`` row, so its state row stays 0 and it adds nothing to any read or output; a zero value channel has
``v = w = 0`` and a zero ``h0`` column, so its column stays 0; an identity token (``q = k = v = b = w = 0,
g = 0``) leaves the state unchanged and its output is sliced away. The VJP of padding is the slice, so the
gradients are exact too. ``o_dtype="float32"``: the kernel returns ``o`` in float32 for bfloat16 inputs (FLA's
naive references do); the harness then judges that ``o`` as float32 (``fn.o_dtype``).
"""

from __future__ import annotations

import functools
import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

TENSORS = ("q", "k", "v", "g", "b", "w")
EXTRAS = ("s", "h")  # scale and initial state, when the kernel takes them positionally
LAYOUTS = ("bthk", "bhtk")
MAPPING = ("order", "layout", "scale_arg", "state_arg", "decay_base")
WRAPPING = ("pad", "o_dtype", "modes", "rename", "interpret")
O_DTYPES = ("float32",)
_PAD = re.compile(r"([KVT])(\d+)")


def parse_order(order):
    """``"qkvwbg"``/``"qkvwbgsh"`` -> letters: the six tensors in the kernel's positional order, then optionally
    ``s`` (scale) and ``h`` (initial state) positionally; ValueError naming ``order``."""
    letters = tuple(order) if isinstance(order, str) else tuple(order or ())
    tensors = [c for c in letters if c not in EXTRAS]
    extras = [c for c in letters if c in EXTRAS]
    if sorted(tensors) != sorted(TENSORS) or len(set(extras)) != len(extras) or letters[:6] != tuple(tensors):
        raise ValueError(f"order: {order!r} is not the six letters q k v g b w in the kernel's positional order, "
                         "optionally followed by s (scale) and h (initial state), e.g. order=qkvwbgsh")
    return letters


def parse_pad(pad):
    """``"K128V128T256"`` -> ``{"K": 128, "V": 128, "T": 256}``; ValueError naming ``pad``."""
    text = str(pad).replace(" ", "").replace("/", "").replace("+", "")
    items = _PAD.findall(text)
    if not items or "".join(f"{a}{n}" for a, n in items) != text:
        raise ValueError(f"pad: {pad!r} is not multiples as K128V128T256 (any of K, V, T, each once)")
    out = {}
    for axis, n in items:
        if axis in out or int(n) < 1:
            raise ValueError(f"pad: {pad!r} gives {axis} twice or a multiple below 1")
        out[axis] = int(n)
    return out


def _keyword(name, value):
    if value is not None and not (isinstance(value, str) and value.isidentifier()):
        raise ValueError(f"{name}: expected a keyword name or None, got {value!r}")
    return value


def mapped(fn, *, order="qkvgbw", layout="bthk", scale_arg="scale", state_arg="initial_state", decay_base="e",
           **kwargs):
    """The contract callable of a JAX kernel ``fn`` with another signature (see the module docstring);
    ``kwargs`` are passed to every call."""
    letters = parse_order(order)
    layout = str(layout).lower()
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r} not one of {LAYOUTS}")
    base = {"e": "e", "natural": "e", 2: 2, "2": 2}.get(decay_base)
    if base is None:
        raise ValueError(f"decay_base: {decay_base!r} not one of 'e' (natural log-decay) or 2")
    scale_arg, state_arg = _keyword("scale_arg", scale_arg), _keyword("state_arg", state_arg)

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        named = dict(q=q, k=k, v=v, g=g * math.log2(math.e) if base == 2 else g, b=b, w=w)
        if layout == "bhtk":
            named = {n: jnp.swapaxes(x, 1, 2) for n, x in named.items()}
        extra = {"s": scale if scale is not None else q.shape[-1] ** -0.5, "h": initial_state}
        args = [named[c] if c in named else extra[c] for c in letters]
        kw = dict(kwargs)
        if "s" not in letters and scale_arg is not None:
            kw[scale_arg] = scale
        if "h" not in letters and state_arg is not None:
            kw[state_arg] = initial_state
        o, *rest = fn(*args, **kw)
        return (jnp.swapaxes(o, 1, 2) if layout == "bhtk" else o, *rest)

    kernel.__name__ = getattr(fn, "__name__", "mapped")
    kernel.__wrapped__ = fn
    kernel.mapping = dict(order="".join(letters), layout=layout, scale_arg=scale_arg, state_arg=state_arg,
                          decay_base=base, **kwargs)
    return kernel


def _up(n, m):
    return -(-n // m) * m


def padded(fn, pad):
    """The contract callable running ``fn`` on inputs padded to the multiples of ``pad`` (exact; module docstring)."""
    multiples = parse_pad(pad)

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None, **kw):
        B, T, H, K = q.shape
        V = v.shape[-1]
        Tp, Kp, Vp = (_up(n, multiples.get(a, 1)) for a, n in (("T", T), ("K", K), ("V", V)))

        def grow(x, dim):
            return jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, dim - x.shape[-1])))

        h0 = None if initial_state is None else jnp.pad(initial_state, ((0, 0), (0, 0), (0, Kp - K), (0, Vp - V)))
        scale = K ** -0.5 if scale is None else scale  # the padded K must not change the default scale
        o, S, *rest = fn(grow(q, Kp), grow(k, Kp), grow(v, Vp), grow(g, Kp), grow(b, Kp), grow(w, Vp), scale=scale,
                         initial_state=h0, **kw)
        return (o[:, :T, :, :V], S[:, :, :K, :V], *rest)

    kernel.__name__ = getattr(fn, "__name__", "padded")
    kernel.__wrapped__ = fn
    kernel.pad = multiples
    return kernel


def with_o_dtype(fn, o_dtype):
    """``fn`` declared to return ``o`` in ``o_dtype`` (float32) whatever the input dtype; the harness reads it."""
    if o_dtype not in O_DTYPES:
        raise ValueError(f"o_dtype: {o_dtype!r} not one of {O_DTYPES}")

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        return fn(*args, **kwargs)

    kernel.o_dtype = o_dtype
    return kernel


def parse_names(text, option):
    """``"a+b"`` -> ``("a", "b")``: ``+``-separated names; ValueError naming ``option``."""
    names = tuple(n.strip() for n in str(text).split("+"))
    if not all(n.isidentifier() for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{option}: {text!r} is not distinct names separated by '+', e.g. {option}=dense+l2norm")
    return names


def with_modes(fn, modes):
    """``fn`` declared to take part in the call modes ``modes`` only (``"dense+l2norm"``; ``chosen_modes``): the
    judge reads it besides the signature (ci/running/modes.py ``chosen_modes``)."""
    names = parse_names(modes, "modes")

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        return fn(*args, **kwargs)

    kernel.chosen_modes = names
    return kernel


def parse_renames(rename):
    """``"qk_l2norm:use_qk_l2norm_in_kernel+a:b"`` -> ``{"qk_l2norm": "use_qk_l2norm_in_kernel", "a": "b"}`` (the
    kernel's keyword -> FLA's); ValueError naming ``rename``."""
    pairs = [item.split(":") for item in str(rename).split("+")]
    if not all(len(p) == 2 and all(n.strip().isidentifier() for n in p) for p in pairs):
        raise ValueError(f"rename: {rename!r} is not MINE:FLAS pairs separated by '+', "
                         "e.g. rename=qk_l2norm:use_qk_l2norm_in_kernel")
    out = {mine.strip(): fla.strip() for mine, fla in pairs}
    if len(out) != len(pairs) or len(set(out.values())) != len(out):
        raise ValueError(f"rename: {rename!r} renames a keyword twice")
    return out


def renamed(fn, rename):
    """``fn`` called with FLA's keyword names: a keyword FLA calls Y and ``fn`` calls X (``rename=X:Y``) is accepted
    as Y and passed on as X; the signature shows Y, so the modes are read through the rename."""
    mine = parse_renames(rename)
    theirs = {fla: own for own, fla in mine.items()}

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        return fn(*args, **{theirs.get(k, k): v for k, v in kwargs.items()})

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return kernel
    missing = sorted(set(mine) - set(sig.parameters))
    if missing:
        raise ValueError(f"rename: the kernel's signature has no keyword {missing}")
    kernel.__signature__ = sig.replace(parameters=[p.replace(name=mine.get(p.name, p.name))
                                                   for p in sig.parameters.values()])
    return kernel


def interpreted(fn, interpret):
    """``fn`` with every ``pallas_call`` it traces run in Pallas's TPU interpret mode (``interpret=1``: on a CPU;
    JAX's ``pltpu.force_tpu_interpret_mode``), for a Pallas kernel with no ``interpret`` argument of its own:
    its forward and its custom backward (:func:`interpreted_vjp`); ``interpret=0``: ``fn`` unchanged."""
    if interpret in (0, False):
        return fn
    if interpret not in (1, True):
        raise ValueError(f"interpret: expected 1 (Pallas interpret mode) or 0, got {interpret!r}")
    kernel = functools.wraps(fn)(interpreted_vjp(fn, tpu_interpret_mode))
    kernel.interpret = "tpu"
    return kernel


def tpu_interpret_mode():
    """The context in which every ``pallas_call`` traced runs in Pallas's TPU interpret mode."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())


def _traced_input(x):
    """Whether argument leaf ``x`` is a primal input of :func:`interpreted_vjp`: a traced value, or a concrete JAX
    array of floats (a concrete integer array such as ``cu_seqlens``, a NumPy array or a number stays concrete)."""
    return isinstance(x, jax.core.Tracer) or (isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact))


def interpreted_vjp(fn, context):
    """``fn(*args, **kwargs)`` traced inside ``context()`` and so is its VJP: a ``jax.custom_vjp`` whose forward is
    ``jax.vjp`` of ``fn`` and whose backward applies that pullback, each inside ``context()``. A custom backward
    (a ``jax.custom_vjp`` inside ``fn``) is traced when the pullback is applied, after ``fn`` has returned, so a
    context around the call alone leaves it out. Traced and float arguments are the primal inputs; the rest (None,
    numbers, flags, concrete integer arrays) are closed over."""
    def kernel(*args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        where = [i for i, x in enumerate(leaves) if _traced_input(x)]

        def call(*arrays):
            full = list(leaves)
            for i, x in zip(where, arrays):
                full[i] = x
            a, kw = jax.tree_util.tree_unflatten(tree, full)
            with context():
                return fn(*a, **kw)

        @jax.custom_vjp
        def whole(*arrays):
            return call(*arrays)

        def forward(*arrays):
            with context():
                return jax.vjp(call, *arrays)

        def backward(pullback, cotangents):
            with context():
                return pullback(cotangents)

        whole.defvjp(forward, backward)
        return whole(*(leaves[i] for i in where))

    return kernel


MIXED_QKV = "mixed_qkv"  # layout=mixed_qkv: a Gated DeltaNet kernel taking packed q|k|v and raw gates
RAW_GATE_FLAGS = ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel")
MIXED_OWN = ("mixed_qkv", "a", "b", "A_log", "dt_bias")  # the packed kernel's own inputs (replaced by FLA's)


TINY = 1e-30  # the least -g the raw gate a = softplus^-1(-g) is formed from (float32: normal, its log finite)


def refuses_unpacked(inputs, keywords):
    """Why a family call cannot be put into raw gates (``layout=mixed_qkv`` without FLA's in-kernel beta sigmoid):
    ``beta = sigmoid(b)`` lies in (0, 1), so a call with some beta outside it is outside the layout's domain; None
    when it can be."""
    if keywords.get("use_beta_sigmoid_in_kernel"):
        return None
    beta = inputs.get("beta")
    if beta is not None and not (np.all(beta > 0) and np.all(beta < 1)):
        return (f"beta: layout={MIXED_QKV} passes beta as b with beta = sigmoid(b), which only expresses "
                f"0 < beta < 1; this call has beta in [{float(np.min(beta)):g}, {float(np.max(beta)):g}]: outside "
                "the packed layout's domain, not run")
    return None


def inverse_softplus(y):
    """``x`` with ``softplus(x) = y`` (``y > 0``): ``y + log(-expm1(-y))``, accurate for small and large ``y``."""
    return y + jnp.log(-jnp.expm1(-y))


def mixed_qkv(fn):
    """A Gated DeltaNet kernel ``fn(mixed_qkv, a, b, A_log, dt_bias, *, ...)`` in FLA's family signature
    ``(q, k, v, g, beta, *, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, ...)`` (the packed layout
    of serving engines, vLLM's ``mixed_qkv [B, T, 2 H K + HV V]`` = q | k | v, raw gates ``g = -exp(A_log)
    softplus(a + dt_bias)``, ``beta = sigmoid(b)``: docs/DESIGN.md §2, "Replay states"). FLA's in-kernel gate and
    beta sigmoid pass ``a = g``, ``b = beta`` as they are (exact); otherwise the log-decay and beta are inverted into
    raw gates in float32 (``A_log = dt_bias = 0``, ``a = softplus^-1(-g)``, ``b = logit(beta)``: one float32
    rounding of each). The state is always passed (zeros for none: the packed kernel reads ``K``, ``V`` from it, as
    vLLM's do). Keywords of ``fn`` other than its five inputs pass through."""
    def kernel(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
               use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, **kwargs):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        packed = jnp.concatenate([q.reshape(B, T, H * K), k.reshape(B, T, H * K),
                                  v.reshape(B, T, HV * V)], axis=-1)
        if use_gate_in_kernel:
            a = g
        else:  # -g clamped at 1e-30 in value only (g = 0: a stays finite, the gradient passes straight through)
            y = -g.astype(jnp.float32)
            a = inverse_softplus(y + jax.lax.stop_gradient(jnp.maximum(y, TINY) - y))
            A_log, dt_bias = jnp.zeros((HV,), jnp.float32), jnp.zeros((HV,), jnp.float32)
        b = beta if use_beta_sigmoid_in_kernel else jnp.log(beta.astype(jnp.float32)) - jnp.log1p(
            -beta.astype(jnp.float32))
        if initial_state is None:  # the packed layout reads K and V from the state, as vLLM's kernels do
            cu = kwargs.get("cu_seqlens")
            initial_state = jnp.zeros((B if cu is None else cu.shape[0] - 1, HV, K, V), jnp.float32)
        return fn(packed, a, b, A_log, dt_bias, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, **kwargs)

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ValueError(f"layout: {MIXED_QKV} needs a kernel whose signature can be read") from None
    missing = [n for n in MIXED_OWN if n not in params]
    if missing:
        raise ValueError(f"layout: {MIXED_QKV} needs a kernel taking {MIXED_OWN} (vLLM's order); "
                         f"{getattr(fn, '__name__', fn)!r} lacks {missing}")
    functools.update_wrapper(kernel, fn)
    del kernel.__wrapped__  # the signature is FLA's family call's, with fn's other keywords
    kernel.refuses = refuses_unpacked
    own = inspect.signature(kernel).parameters
    extra = [p.replace(kind=p.KEYWORD_ONLY) for n, p in params.items()
             if n not in MIXED_OWN and n not in own and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    kernel.__signature__ = inspect.Signature([p for n, p in own.items() if n != "kwargs"] + extra)
    return kernel


def wrap(fn, *, pad=None, o_dtype=None, modes=None, rename=None, interpret=None):
    """``fn`` with the wrapping options applied (``rename`` innermost, then ``pad``, ``o_dtype``, ``modes``,
    ``interpret``)."""
    if rename is not None:
        fn = renamed(fn, rename)
    if pad is not None:
        fn = padded(fn, pad)
    if o_dtype is not None:
        fn = with_o_dtype(fn, o_dtype)
    if modes is not None:
        fn = with_modes(fn, modes)
    if interpret is not None:
        fn = interpreted(fn, interpret)
    return fn
