"""The registry of call modes: the one place a mode is named (docs/adding-a-mode.md).

A call mode is a way a kernel can be called besides the plain dense contract (docs/DESIGN.md §2): FLA
``chunk_gdn2``'s training modes (packed sequences, in-kernel gate, in-kernel q/k L2 norm, ``[V, K]`` states,
states at chunk starts) and the serving modes on a state pool. :data:`REGISTRY` holds one :class:`CallMode` per
mode in report order -- the dense call first, then the training modes, then the serving modes -- with what the
judge, the runners, the CLI and the property tests need to treat every mode alike: the FLA keywords a kernel's
signature must accept to take part, the results the mode adds, whether a :class:`oracle.call.Call` uses it and
the keywords to pass a kernel for that call, and the ``domain`` sweeps over the mode's quantities.

NumPy only (docs/DESIGN.md §3): no JAX, no kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

FLA_CHUNK = 64  # FLA's chunk_gdn2 chunk size: its intermediate states are taken every 64 tokens
KINDS = ("dense", "training", "serving", "handoff")  # handoff: a prefill kernel hands its states to a serving one


def _shown(value):
    """A swept value as printed (``%g``)."""
    return f"{value:g}"


@dataclass(frozen=True)
class Sweep:
    """One ``domain`` sweep of a mode's quantity: ``name`` (``"mode.quantity"``), the swept ``values``, the panel's
    ``label``, ``build(base, value) -> (recipe, overrides)`` from a base :class:`oracle.mode_recipes.ModeRecipe`
    (``overrides``: :class:`oracle.mode_recipes.ModePoint` fields the recipe has none for), how a value is
    ``shown``, and whether the values have no order to cross (``unordered``)."""

    name: str
    values: tuple
    label: str
    build: Callable
    shown: Callable = _shown
    unordered: bool = False


def _never(call):
    return False


def _no_keywords(call):
    return {}


@dataclass(frozen=True)
class CallMode:
    """One call mode: ``name``, ``kind`` (one of :data:`KINDS`), the FLA ``keywords`` a kernel's signature must
    accept to take part, the extra ``results`` it adds, a one-line ``help``, ``active(call)`` (whether a Call uses
    it), ``call_keywords(call)`` (the non-default keywords to pass a kernel for that call), ``forward_only``
    (its keywords go to a separate forward-only call, not to the differentiated one) and its ``sweeps``."""

    name: str
    kind: str
    keywords: tuple = ()
    results: tuple = ()
    help: str = ""
    active: Callable = _never
    call_keywords: Callable = _no_keywords
    forward_only: bool = False
    sweeps: tuple = field(default=())

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: {self.kind!r} not one of {KINDS}")


C = FLA_CHUNK
MODE_T = C + 36  # the length of a swept mode call that is not packed (as mode_recipes.DENSE)


def _packed_keywords(call):
    return {} if call.cu_seqlens is None else {"cu_seqlens": np.asarray(call.cu_seqlens, np.int32)}


def _gate_keywords(call):
    if not call.gate_in_kernel:
        return {}
    return {"use_gate_in_kernel": True, **({} if call.lower_bound is None else {"lower_bound": call.lower_bound})}


def _gate_form(bound):
    return "softplus" if bound is None else f"{bound:g}"


def _on_off(value):
    return "on" if value else "off"


REGISTRY = (
    CallMode("dense", "dense", help="the plain contract"),
    CallMode(
        "varlen", "training", ("cu_seqlens",), help="packed variable-length sequences (cu_seqlens)",
        active=lambda call: call.cu_seqlens is not None, call_keywords=_packed_keywords,
        sweeps=(
            # packed lengths (3, L, 5, L): sequence starts around chunk edges
            Sweep("varlen.length", (0, 1, C - 1, C, C + 1), "varlen: packed lengths (3, L, 5, L), L",
                  lambda base, L: (base.replace(lengths=(3, L, 5, L), packed=True), {})),
            # N packed sequences of 1..9 tokens
            Sweep("varlen.sequences", (1, 2, 8, 32), "varlen: packed sequences N (1-9 tokens)",
                  lambda base, n: (base.replace(lengths=tuple(1 + (5 * i + 2) % 9 for i in range(n)), packed=True),
                                   {})),
        )),
    CallMode(
        "gate", "training", ("use_gate_in_kernel", "A_log", "dt_bias", "lower_bound"), ("dA_log", "ddt_bias"),
        help="in-kernel gate (use_gate_in_kernel, A_log, dt_bias, lower_bound)",
        active=lambda call: bool(call.gate_in_kernel), call_keywords=_gate_keywords,
        sweeps=(
            # None: the softplus form
            Sweep("gate.lower_bound", (-1.0, -5.0, -20.0, None), "gate: lower_bound",
                  lambda base, lb: (base.replace(gate="bounded" if lb is not None else "softplus", lower_bound=lb),
                                    {}), shown=_gate_form, unordered=True),
            # exp(A_log) of every head, bounded form (lower_bound -5)
            Sweep("gate.A_log", (0.01, 1.0, 16.0, 1000.0), "gate: exp(A_log) (bounded, lower_bound -5)",
                  lambda base, a: (base.replace(gate="bounded"), {"A_log": float(np.log(a))})),
        )),
    CallMode(
        "l2norm", "training", ("use_qk_l2norm_in_kernel",), help="in-kernel q/k L2 normalisation",
        active=lambda call: bool(call.qk_l2norm),
        call_keywords=lambda call: {"use_qk_l2norm_in_kernel": True} if call.qk_l2norm else {},
        sweeps=(
            # every raw q and k row scaled to this norm
            Sweep("l2norm.qk_norm", (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 0.0), "l2norm: raw q/k row norm",
                  lambda base, r: (base.replace(qk_l2norm=True), {"qk_norm": r})),
        )),
    CallMode(
        "state_v_first", "training", ("state_v_first",), help="[V, K] state layout",
        active=lambda call: bool(call.state_v_first),
        call_keywords=lambda call: {"state_v_first": True} if call.state_v_first else {},
        sweeps=(
            Sweep("state_v_first.initial_state", (False, True), "state_v_first: initial state",
                  lambda base, h: (base.replace(state_v_first=True, initial_state=h), {}), shown=_on_off,
                  unordered=True),
        )),
    CallMode(
        "intermediate", "training", ("return_intermediate_states",), ("intermediate_states",),
        help="the states at chunk starts (return_intermediate_states)",
        active=lambda call: call.intermediate_chunk_size is not None,
        call_keywords=lambda call: ({} if call.intermediate_chunk_size is None
                                    else {"return_intermediate_states": True}),
        forward_only=True,
        sweeps=(
            Sweep("intermediate.T", (1, C, C + 1, 3 * C + 8), "intermediate: length T",
                  lambda base, T: (base.replace(lengths=(T,), intermediate_chunk_size=C), {})),
        )),
    CallMode("decode", "serving", help="calls chained on a state pool"),
    CallMode("speculative", "serving", help="speculative decoding on a state pool"),
    CallMode("handoff", "handoff", help="a prefill kernel's final states handed into a serving kernel's pool"),
)
BY_NAME = {m.name: m for m in REGISTRY}
STATE_LAYOUT = BY_NAME["state_v_first"]  # the [V, K] state layout: also a family serving pool's (oracle/serving.py)
BASE = REGISTRY[0]  # the plain dense call: every kernel takes part
SWEEPS = {s.name: s for m in REGISTRY for s in m.sweeps}
UNORDERED_SWEEPS = tuple(s.name for s in SWEEPS.values() if s.unordered)


def names(kind=None):
    """The registry's mode names in report order (of one ``kind`` if given; a tuple of kinds selects several)."""
    kinds = (kind,) if isinstance(kind, str) else kind
    if kinds is not None and set(kinds) - set(KINDS):
        raise ValueError(f"kind: {kind!r} not among {KINDS}")
    return tuple(m.name for m in REGISTRY if kinds is None or m.kind in kinds)


def get(name):
    """The :class:`CallMode` called ``name`` (ValueError naming the known ones otherwise)."""
    if name not in BY_NAME:
        raise ValueError(f"modes: unknown call mode {name!r}; known: {', '.join(names())}")
    return BY_NAME[name]


def parse(text, allowed=None, *, all_word=None):
    """``"varlen,gate"`` -> ``("varlen", "gate")`` in registry order, among ``allowed`` (default every mode);
    ``all_word`` (e.g. ``"all"``) selects every allowed one. ValueError naming the argument ``modes`` otherwise."""
    allowed = names() if allowed is None else tuple(allowed)
    if all_word is not None and str(text).strip() == all_word:
        return allowed
    items = [m.strip() for m in str(text).split(",") if m.strip()]
    unknown = [m for m in items if m not in allowed]
    if unknown or not items:
        raise ValueError(f"modes: {', '.join(unknown) or repr(text)} not among {', '.join(allowed)}")
    return tuple(m for m in allowed if m in items)


def listed(allowed=None):
    """``"dense,varlen,..."``: mode names joined for CLI help (``allowed``, default every mode)."""
    return ",".join(names() if allowed is None else allowed)


def active(call):
    """The training modes a :class:`oracle.call.Call` uses, in registry order (empty: a dense call)."""
    return tuple(m.name for m in REGISTRY if m.active(call))


def keywords_for(call, *, forward_only=False):
    """The non-default FLA keywords to pass a kernel for ``call`` (of the modes with that ``forward_only``)."""
    out = {}
    for m in REGISTRY:
        if m.forward_only == forward_only and m.active(call):
            out.update(m.call_keywords(call))
    return out


def extra_results(names_of=None):
    """Every result a mode may add besides the dense ones, in report order (of the modes ``names_of``, default all)."""
    return tuple(r for m in REGISTRY if names_of is None or m.name in names_of for r in m.results)


def is_base(name):
    """Whether ``name`` is the plain dense call (every kernel takes part; no mode keywords)."""
    return name == BASE.name


def accepting(keyword_names, any_keyword=False):
    """The training modes whose keywords are all in ``keyword_names`` (all of them with ``any_keyword``: a
    signature with ``**kwargs``), in registry order."""
    return tuple(m.name for m in REGISTRY if m.kind == "training"
                 and (any_keyword or set(m.keywords) <= set(keyword_names)))


def help_line(allowed=None):
    """``"dense (the plain contract); varlen (...)..."``: the modes with their one-line help."""
    return "; ".join(f"{n} ({BY_NAME[n].help})" for n in (names() if allowed is None else allowed))


def sweep_label(name):
    """A sweep's panel label (the name itself for an unknown one)."""
    return SWEEPS[name].label if name in SWEEPS else name


def sweep_mode(name):
    """The mode a ``"mode.quantity"`` sweep belongs to (ValueError naming ``grid`` for one of no mode)."""
    mode = name.split(".")[0]
    if name not in SWEEPS and mode not in names("training"):
        raise ValueError(f"grid: mode sweep {name!r} is not of a mode in {names('training')}")
    return mode


def sweep_values():
    """``{"mode.quantity": values}`` of every sweep, in registry order."""
    return {s.name: s.values for s in SWEEPS.values()}
