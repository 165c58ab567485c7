"""vLLM 0.33.0's and SGLang 0.5.23's Triton GDN / KDA kernels, read from their wheels, as registered family peers.

Registered names (``kernels.get(name, **options)``; options are the torch bridge's, kernels/torch_bridge.py; the
device is ``cpu``); each runs the engine's own kernel file, loaded by kernels/third_party.py from the wheel in
``$GDN2_PEERS/wheels`` (``make peers``), in Triton's interpreter:

* ``vllm-gdn-chunk``             -- ``vllm/third_party/flash_linear_attention/ops/chunk.py``: vLLM's prefill,
  ``chunk_gated_delta_rule``;
* ``vllm-gdn-fused-recurrent``   -- ``ops/fused_recurrent.py``: ``fused_recurrent_gated_delta_rule`` as vLLM
  serves with it, on an in-place state pool (``ssm_state_indices``; slot 0 is vLLM's null block);
* ``vllm-gdn-fused-recurrent-pool`` -- the same kernel on the suite's serving sessions (:class:`VllmPoolKernel`: FLA's
  fused recurrent serving signature, the suite's slots, ``ssm_state_indices`` and ``num_accepted_tokens``; serving
  only);
* ``vllm-gdn-fused-sigmoid-gating`` -- ``ops/fused_sigmoid_gating.py``: ``fused_sigmoid_gating_delta_rule_update``,
  vLLM's decode kernel on raw gates (``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``; FLA's
  ``use_gate_in_kernel`` / ``use_beta_sigmoid_in_kernel`` pass through, otherwise the adapter inverts ``g``, ``beta``
  into raw gates: :func:`raw_gates`), on the same in-place pool;
* ``vllm-kda-chunk``             -- ``ops/kda.py``: ``chunk_kda`` (no grouped value heads: q, k repeated);
* ``sglang-gdn-fused-recurrent`` -- ``sglang/kernels/ops/attention/fla/fused_recurrent.py``:
  ``fused_recurrent_gated_delta_rule``.

Not registered: SGLang's chunk prefill (``fla/chunk.py``), :data:`SGLANG_CHUNK_NOTE`.

Each is a :class:`torch_bridge.FamilyTorchKernel` (``family`` "gdn" / "kda") over a small adapter in the family's
signature (``q, k, v, g, beta, scale=, initial_state=, output_final_state=, cu_seqlens=,
use_qk_l2norm_in_kernel=``: the only flag these entry points take, so validate runs the cases without the others'
flags and lists the rest). The adapters change the call, never the arithmetic: the states go in and out as
``[N, HV, V, K]`` (both engines' layout; the family's is ``[N, HV, K, V]``: a transpose); a missing initial state
is zeros; a pool where the kernel writes its final states in place. All four are inference kernels (their autograd
Functions have no backward): ``no_backward``, so validate judges o and the final state.

dtypes: vLLM's public ``chunk_gated_delta_rule`` asserts their inputs are not float32 ("Please use
bfloat16"); for float32 inputs the adapter calls the autograd Function right below that assertion (the same
forward, in float32); bfloat16 inputs go through the public function. bfloat16 runs here only with
kernels/third_party.py's fix for the interpreter's bfloat16 ``tl.dot`` (without it: errors of order 1e9, the
interpreter's, :data:`triton_interpret.BF16_DOT_NOTE`).
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np

from . import third_party
from .adapt import TINY
from .family_decode import V_FIRST
from .torch_bridge import FamilyTorchKernel, import_torch, to_numpy, to_torch

VLLM_OPS = "vllm.third_party.flash_linear_attention.ops."
SGLANG_FLA = "sglang.kernels.ops.attention.fla."
NO_BACKWARD = ("inference only: the engine's autograd Function defines no backward, so o and final_state are its "
               "results (validate judges those); its VJP is refused with this reason")
SGLANG_CHUNK_NOTE = ("SGLang 0.5.23's FLA chunk path (fla/chunk.py and every kernel file it calls: the chunk, "
                     "cumsum and WY files) is written with tl.make_block_ptr, which Triton 3.9 removed (\"Block "
                     "pointers have been removed in favor of the tensor descriptor API\"), compiled and interpreted "
                     "alike; it loads, but runs only on the Triton its torch==2.14.1 pin brings")
STATE_NOTE = ("the engine's states are [N, HV, V, K]: the adapter transposes the family's [N, HV, K, V] in and out "
              "and passes zeros for a missing initial state")


def _v_first(state):
    """A family state ``[..., K, V]`` as the engines' ``[..., V, K]`` (contiguous), or back."""
    return state.transpose(-1, -2).contiguous()


def _initial(initial_state, N, HV, K, V, like):
    """The engines' initial states ``[N, HV, V, K]`` (float32 zeros when none is given)."""
    torch = import_torch()
    if initial_state is None:
        return torch.zeros(N, HV, V, K, dtype=torch.float32, device=like.device)
    return _v_first(initial_state)


def _shape(q, v, cu_seqlens):
    """``(N, H, HV, K, V)`` of a family call."""
    B, _, H, K = q.shape
    return (B if cu_seqlens is None else len(cu_seqlens) - 1), H, v.shape[2], K, v.shape[3]


def _on_engine_states(run, q, v, initial_state, cu_seqlens):
    """``run(h0)`` on the engines' initial states ``[N, HV, V, K]``; its ``(o, final)``, final as ``[N, HV, K, V]``."""
    N, _, HV, K, V = _shape(q, v, cu_seqlens)
    o, final = run(_initial(initial_state, N, HV, K, V, q))
    return o, _v_first(final)


def vllm_chunk_adapter(module):
    """vLLM's ``chunk_gated_delta_rule`` (module ``ops/chunk.py``) in the gdn family's signature."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None,
               use_qk_l2norm_in_kernel=False):
        torch = import_torch()
        scale = q.shape[-1] ** -0.5 if scale is None else scale

        def run(h0):
            if q.dtype == torch.float32:  # below the public function's float32 assertion: the same forward
                return module.ChunkGatedDeltaRuleFunction.apply(q, k, v, g, beta, scale, h0, True, cu_seqlens, None,
                                                                None, use_qk_l2norm_in_kernel, None)
            return module.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                                 output_final_state=True, cu_seqlens=cu_seqlens,
                                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

        return _on_engine_states(run, q, v, initial_state, cu_seqlens)

    kernel.__name__ = "vllm_chunk_gated_delta_rule_gdn"
    return kernel


def vllm_fused_recurrent_adapter(module):
    """vLLM's ``fused_recurrent_gated_delta_rule`` in the gdn family's signature, as vLLM serves: B sequences
    packed (``cu_seqlens``), a pool ``[N + 1, HV, V, K]`` whose slot 0 is the null block, sequence n on slot
    n + 1 for every token (``ssm_state_indices [N, T]``), the final states written in place."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None,
               use_qk_l2norm_in_kernel=False):
        torch = import_torch()
        B, T = q.shape[:2]
        N, H, HV, K, V = _shape(q, v, cu_seqlens)
        if cu_seqlens is None:  # B equal-length sequences packed, as vLLM calls it
            cu_seqlens = torch.arange(B + 1, dtype=torch.long, device=q.device) * T
            q, k, v, g, beta = (x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, g, beta))
        h0 = _initial(initial_state, N, HV, K, V, q).to(torch.float32)
        pool = torch.cat([torch.zeros_like(h0[:1]), h0])
        slots = torch.arange(1, N + 1, dtype=torch.int32, device=q.device)
        indices = slots[:, None].expand(N, max(int(q.shape[1]), 1)).contiguous()
        o, pool = module.fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=pool,
                                                          inplace_final_state=True, cu_seqlens=cu_seqlens,
                                                          ssm_state_indices=indices,
                                                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        return o.reshape(B, T, HV, V), _v_first(pool[1:])

    kernel.__name__ = "vllm_fused_recurrent_gated_delta_rule_gdn"
    return kernel


POOL_NAME = "vllm-gdn-fused-recurrent-pool"
NULL_BLOCK = 0  # vLLM's null slot: the kernel skips a sequence, or a token's store, whose index is <= 0
# deliberate bugs around vLLM's call (its kernel unchanged), for the tests
POOL_MUTANTS = {
    "slots_shifted": "every slot index passed one slot up: each sequence reads and writes its neighbour's slot",
    "accepted_ignored": "num_accepted_tokens not passed: a window always starts from its first draft slot",
}


def vllm_slots(ssm_state_indices, lengths):
    """vLLM's ``ssm_state_indices`` (int32) for the suite's slots on the pool shifted one up behind the null block:
    each index + 1 (the suite's -1 padding becomes :data:`NULL_BLOCK`); ``[N]`` indices with a sequence of several
    tokens become ``[N, max T_n]`` rows, the slot at token 0 (read) and token ``T_n - 1`` (the final state), the null
    block between (vLLM's ``[N]`` form writes token t's state to ``idx[n + t]``: docs/DESIGN.md §2)."""
    idx = np.asarray(ssm_state_indices).astype(np.int64) + 1
    lengths = np.asarray(lengths, np.int64)
    if idx.ndim == 1 and lengths.size and lengths.max() > 1:
        rows = np.full((idx.size, int(lengths.max())), NULL_BLOCK, np.int64)
        rows[:, 0] = idx
        last = np.maximum(lengths - 1, 0)
        rows[np.arange(idx.size), last] = idx
        idx = rows
    return np.ascontiguousarray(idx, np.int32)


class VllmPoolKernel:
    """``vllm-gdn-fused-recurrent-pool``: vLLM's ``fused_recurrent_gated_delta_rule`` called on the suite's slot pool
    as vLLM's layer calls it, in FLA's fused recurrent serving signature (kernels/family_decode.py's): the pool
    ``[P, HV, K, V]`` goes in as vLLM's ``[P + 1, HV, V, K]`` (slot 0 its null block, a transpose; none with FLA's
    ``[V, K]`` pool keyword, :data:`family_decode.V_FIRST`: vLLM's own layout), the slots and
    ``num_accepted_tokens`` as :func:`vllm_slots` and as given, the pool read back after the in-place call. Serving
    sessions only (no dense call); ``mutant``: one of :data:`POOL_MUTANTS`.

    ``padding_output = "unwritten"``: its contract leaves o unwritten at a null-block row (padding), which vLLM never
    reads: ``fused_recurrent_gated_delta_rule_fwd_kernel`` returns before any store when ``state_idx <= 0``
    (vllm/third_party/flash_linear_attention/ops/fused_recurrent.py, lines 114-116 in vllm 0.33.0), and the wrapper
    allocates o with ``q.new_empty`` (line 202), so the judge does not judge those rows (its pool still must not
    change: ``untouched``)."""

    family = "gdn"
    state_dtype = "float32"
    padding_output = "unwritten"
    serving_only = ("vLLM's fused recurrent kernel as it serves: on a state pool only (the calls without one: "
                    "vllm-gdn-fused-recurrent)")
    interpreted = True  # in Triton's interpreter: validate's time estimate counts its work

    def __init__(self, session_size="small", mutant=None):
        if mutant is not None and mutant not in POOL_MUTANTS:
            raise ValueError(f"mutant: {mutant!r} not one of {tuple(POOL_MUTANTS)}")
        module = VLLM_OPS + "fused_recurrent"
        loaded = third_party.load("vllm", [module], who=f"kernel {POOL_NAME!r}")
        self.run = loaded.module(module).fused_recurrent_gated_delta_rule
        self.session_size, self.mutant = session_size, mutant
        self.__name__ = POOL_NAME if mutant is None else f"{POOL_NAME}[mutant={mutant}]"
        self.device = "cpu"
        self.modules = (__name__, third_party.__name__)
        # FLA's [V, K] pool keyword (kernels/family_decode.py's V_FIRST) named in the signature the judge reads
        sig = inspect.signature(type(self).__call__)
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD and p.name != "self"]
        self.__signature__ = sig.replace(parameters=[*params, inspect.Parameter(
            V_FIRST, inspect.Parameter.KEYWORD_ONLY, default=False)])
        self.notes = [f"{module.replace('.', '/')}.py read from {loaded.wheel.name} (sha256 "
                      f"{third_party.wheel_hash(loaded.wheel)[:16]}), run in Triton's interpreter; "
                      "the pool as vLLM's [P + 1, HV, V, K] behind its null slot 0 (slots + 1, -1 padding -> 0)"]

    def __repr__(self):
        return f"VllmPoolKernel(session_size={self.session_size!r}, mutant={self.mutant!r})"

    def __call__(self, q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True, cu_seqlens=None,
                 ssm_state_indices=None, num_accepted_tokens=None, **layout):
        """``(o [B, T, HV, V], new pool [P, HV, K, V] or [P, HV, V, K])`` as NumPy arrays: vLLM's kernel run on the
        pool (class docstring)."""
        torch = import_torch()
        v_first = bool(layout.pop(V_FIRST, False))
        if layout:
            raise ValueError(f"{sorted(layout)[0]}: not a keyword of {POOL_NAME!r}")
        if ssm_state_indices is None or initial_state is None:
            raise ValueError(f"ssm_state_indices: {POOL_NAME!r} runs on a state pool only (initial_state [P, HV, K, "
                             "V] and its slots): give validate the serving --modes")
        if not inplace_final_state:
            raise ValueError("inplace_final_state: vLLM serves with the pool updated in place")
        B, T = np.shape(q)[:2]
        cu = None if cu_seqlens is None else np.asarray(cu_seqlens).astype(np.int64)
        lengths = np.full(B, T) if cu is None else np.diff(cu)
        idx = vllm_slots(ssm_state_indices, lengths) + (1 if self.mutant == "slots_shifted" else 0)
        pool = to_torch(np.asarray(initial_state), "cpu")
        pool = pool if v_first else pool.transpose(-1, -2)  # vLLM's [P, HV, V, K]
        vpool = torch.cat([torch.zeros_like(pool[:1]), pool])
        accepted = None if num_accepted_tokens is None or self.mutant == "accepted_ignored" else torch.as_tensor(
            np.asarray(num_accepted_tokens).astype(np.int32))
        xs = [to_torch(np.asarray(x), "cpu") for x in (q, k, v, g, beta)]
        with torch.no_grad(), unwritten_as_nan(torch):
            o, vpool = self.run(*xs, scale=scale, initial_state=vpool, inplace_final_state=True,
                                cu_seqlens=None if cu is None else torch.as_tensor(cu),
                                ssm_state_indices=torch.as_tensor(idx), num_accepted_tokens=accepted)
        return to_numpy(o), to_numpy(vpool[1:] if v_first else vpool[1:].transpose(-1, -2))


@contextlib.contextmanager
def unwritten_as_nan(torch):
    """Within: torch's uninitialized allocations (``torch.empty``, ``new_empty``) filled with NaN (its deterministic
    mode), so an output element a kernel never stores reads NaN every run rather than whatever memory held."""
    mode, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(mode, warn_only=warn)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def raw_gates(g, beta, HV, use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False):
    """vLLM's raw gates ``(A_log, a, dt_bias, b)`` (``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``)
    of a family call: FLA's in-kernel gate and beta sigmoid pass ``g``, ``beta`` and the gate parameters as they are
    (a missing ``dt_bias`` is zeros); otherwise ``A_log = dt_bias = 0``, ``a = softplus^-1(-g)`` (``-g`` at least
    :data:`adapt.TINY`) and ``b = logit(beta)``, formed in float64 and rounded once to float32."""
    torch = import_torch()
    f32 = dict(dtype=torch.float32, device=g.device)
    if use_gate_in_kernel:
        a = g.to(torch.float32)
        A_log = A_log.to(torch.float32)
        dt_bias = torch.zeros(HV, **f32) if dt_bias is None else dt_bias.to(torch.float32)
    else:
        y = (-g.to(torch.float64)).clamp_min(TINY)
        a = (y + torch.log(-torch.expm1(-y))).to(torch.float32)
        A_log, dt_bias = torch.zeros(HV, **f32), torch.zeros(HV, **f32)
    x = beta.to(torch.float64)
    b = beta.to(torch.float32) if use_beta_sigmoid_in_kernel else (torch.log(x) - torch.log1p(-x)).to(torch.float32)
    return A_log, a, dt_bias, b


def refuses_raw_beta(inputs, keywords):
    """Why a family call is outside the raw gates' domain (``beta = sigmoid(b)`` lies in [0, 1], its ends at
    ``b = -inf, inf``; FLA's in-kernel beta sigmoid aside), or None: a ValueError names it instead of a NaN."""
    beta = inputs.get("beta")
    if keywords.get("use_beta_sigmoid_in_kernel") or beta is None or (np.all(beta >= 0) and np.all(beta <= 1)):
        return None
    return (f"beta: vLLM's fused sigmoid-gating kernel takes b with beta = sigmoid(b), which only expresses "
            f"0 <= beta <= 1; this call has beta in [{float(np.min(beta)):g}, {float(np.max(beta)):g}]: outside its "
            "domain, not run")


def vllm_sigmoid_gating_adapter(module):
    """vLLM's ``fused_sigmoid_gating_delta_rule_update`` (raw gates, :func:`raw_gates`) in the gdn family's
    signature, as vLLM decodes with it: the call's sequences packed (``cu_seqlens``) on an in-place pool ``[N + 1, HV,
    V, K]`` whose slot 0 is the null block, sequence n on slot n + 1 (``ssm_state_indices [N, T]``)."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None,
               use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
               use_beta_sigmoid_in_kernel=False):
        torch = import_torch()
        B, T = q.shape[:2]
        N, H, HV, K, V = _shape(q, v, cu_seqlens)
        A_log, a, dt_bias, b = raw_gates(g, beta, HV, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel)
        if cu_seqlens is None:  # B equal-length sequences packed, as vLLM calls it
            cu_seqlens = torch.arange(B + 1, dtype=torch.long, device=q.device) * T
            q, k, v, a, b = (x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, a, b))
        pool = torch.cat([torch.zeros(1, HV, V, K, dtype=torch.float32, device=q.device),
                          _initial(initial_state, N, HV, K, V, q).to(torch.float32)])
        slots = torch.arange(1, N + 1, dtype=torch.int32, device=q.device)
        indices = slots[:, None].expand(N, max(int(q.shape[1]), 1)).contiguous()
        o, pool = module.fused_sigmoid_gating_delta_rule_update(
            A_log, a, b, dt_bias, q, k, v, scale=scale, initial_state=pool, inplace_final_state=True,
            cu_seqlens=cu_seqlens, ssm_state_indices=indices, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        return o.reshape(B, T, HV, V), _v_first(pool[1:])

    kernel.__name__ = "vllm_fused_sigmoid_gating_delta_rule_update_gdn"
    return kernel


def vllm_kda_adapter(module):
    """vLLM's ``chunk_kda`` in the kda family's signature (no grouped value heads: q, k repeated to them)."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None,
               use_qk_l2norm_in_kernel=False):
        G = v.shape[2] // q.shape[2]
        if G > 1:
            q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
        return _on_engine_states(
            lambda h0: module.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True,
                                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens),
            q, v, initial_state, cu_seqlens)

    kernel.__name__ = "vllm_chunk_kda"
    return kernel


def sglang_fused_recurrent_adapter(module):
    """SGLang's ``fused_recurrent_gated_delta_rule`` in the gdn family's signature."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True, cu_seqlens=None,
               use_qk_l2norm_in_kernel=False):
        return _on_engine_states(
            lambda h0: module.fused_recurrent_gated_delta_rule(
                q, k, v, g=g, beta=beta, scale=scale, initial_state=h0, output_final_state=True,
                cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel),
            q, v, initial_state, cu_seqlens)

    kernel.__name__ = "sglang_fused_recurrent_gated_delta_rule_gdn"
    return kernel


# name: (engine, module, adapter, family, what it is)
PEERS = {
    "vllm-gdn-chunk": ("vllm", VLLM_OPS + "chunk", vllm_chunk_adapter, "gdn", "vLLM's chunk prefill"),
    "vllm-gdn-fused-recurrent": ("vllm", VLLM_OPS + "fused_recurrent", vllm_fused_recurrent_adapter, "gdn",
                                 "vLLM's fused recurrent kernel on an in-place state pool"),
    "vllm-gdn-fused-sigmoid-gating": ("vllm", VLLM_OPS + "fused_sigmoid_gating", vllm_sigmoid_gating_adapter, "gdn",
                                      "vLLM's fused sigmoid-gating kernel for one-token steps (raw gates) on an "
                                      "in-place state pool"),
    "vllm-kda-chunk": ("vllm", VLLM_OPS + "kda", vllm_kda_adapter, "kda",
                       "vLLM's chunk_kda (no grouped value heads: q, k repeated to the value heads)"),
    "sglang-gdn-fused-recurrent": ("sglang", SGLANG_FLA + "fused_recurrent", sglang_fused_recurrent_adapter, "gdn",
                                   "SGLang's fused recurrent kernel"),
}


def engine_kernel(name, **options):
    """The registered engine peer ``name`` (:data:`PEERS`) as a family kernel run in Triton's interpreter."""
    if name not in PEERS:
        raise ValueError(f"name: {name!r} not one of {tuple(PEERS)}")
    engine, module, adapter, family, what = PEERS[name]
    loaded = third_party.load(engine, [module], who=f"kernel {name!r}")
    note = (f"{what}: {module.replace('.', '/')}.py read from {loaded.wheel.name} (sha256 "
            f"{third_party.wheel_hash(loaded.wheel)[:16]}), run in Triton's interpreter (kernels/third_party.py); "
            f"{STATE_NOTE}; {NO_BACKWARD}")
    kernel = FamilyTorchKernel(adapter(loaded.module(module)), name=name, family=family,
                               options={"device": "cpu", **options}, note=note, packed=True,
                               modules=(__name__, third_party.__name__), no_backward=f"{name}: {NO_BACKWARD}")
    kernel.interpreted = True  # validate's time estimate counts its work (ci/commands/validate.py)
    return kernel


def vllm_gdn_chunk(**options):
    """``vllm-gdn-chunk``: vLLM's Triton chunk prefill for Gated DeltaNet."""
    return engine_kernel("vllm-gdn-chunk", **options)


def vllm_gdn_fused_recurrent(**options):
    """``vllm-gdn-fused-recurrent``: vLLM's fused recurrent Gated DeltaNet kernel on an in-place pool."""
    return engine_kernel("vllm-gdn-fused-recurrent", **options)


def vllm_gdn_fused_recurrent_pool(session_size="small", mutant=None):
    """``vllm-gdn-fused-recurrent-pool``: vLLM's fused recurrent kernel on the suite's slot pool (serving sessions)."""
    return VllmPoolKernel(session_size, mutant)


def vllm_gdn_fused_sigmoid_gating(**options):
    """``vllm-gdn-fused-sigmoid-gating``: vLLM's fused sigmoid-gating Gated DeltaNet decode kernel (raw gates)."""
    kernel = engine_kernel("vllm-gdn-fused-sigmoid-gating", **options)
    kernel.refuses = refuses_raw_beta
    return kernel


def vllm_kda_chunk(**options):
    """``vllm-kda-chunk``: vLLM's Triton chunk KDA."""
    return engine_kernel("vllm-kda-chunk", **options)


def sglang_gdn_fused_recurrent(**options):
    """``sglang-gdn-fused-recurrent``: SGLang's fused recurrent Gated DeltaNet kernel (its FLA copy)."""
    return engine_kernel("sglang-gdn-fused-recurrent", **options)


# SGLang's own GDN ReplaySSM (a checkpoint plus circular rings of recent tokens, exact fold, compact commit): the
# registered kernel sglang-gdn-replayssm (kernels/sglang_replayssm.py, with its one-token file) runs it through a
# replay driver. Its entry points (sglang 0.5.23): gdn_replayssm_spec_decode(q, k, v,
# a, b, A_log, dt_bias, checkpoint_state, d_cache, k_cache, g_cache, rawv_cache, rawk_cache, beta_cache, out,
# query_start_loc, ssm_state_indices, replay_indices, write_pos, cache_base, is_flush, max_cache_len, max_spec_len,
# scale=None, use_qk_l2norm_in_kernel=True, null_block_id=0, ...), commit_gdn_replayssm_spec(write_pos, cache_base,
# is_flush, num_accepted, replay_indices, max_cache_len, max_spec_len, fold_every_commit=False, cache_buf_len=None,
# null_block_id=0), commit_gdn_replayssm_circular(*, checkpoint_state, d_cache, k_cache, g_cache, d_residual_cache,
# k_residual_cache, state_batch_indices, replay_indices, write_pos, cache_base, is_flush, accept_lens, ...,
# null_block_id=-1) and, in the fold module, commit_gdn_replayssm_fold_all_layers(checkpoint_state, rawv_cache,
# rawk_cache, g_cache, beta_cache, ssm_state_indices, accept_lens, max_cache_len, num_k_heads, ...,
# use_qk_l2norm_in_kernel=True, null_block_id=-1); commit_gdn_replayssm_fold_after_verify imports
# sglang.kernels.ops.mamba (not extracted) when called.
SGLANG_REPLAYSSM = ("sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode",
                    "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_fold")


def sglang_replayssm():
    """SGLang's GDN ReplaySSM modules ``(spec_decode, spec_fold)`` loaded from its wheel in Triton's interpreter."""
    loaded = third_party.load("sglang", SGLANG_REPLAYSSM, who="SGLang's GDN ReplaySSM")
    return tuple(loaded.module(m) for m in SGLANG_REPLAYSSM)
