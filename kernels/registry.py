"""The kernel names: each registered name maps to the ``"module:factory"`` that builds it (docs/DESIGN.md §2).

Data only. Nothing here is imported until a name is asked for (``kernels.spec.resolve_factory``), so a
missing optional package (Pallas on an old JAX, torch, atomic-ops, FLA) costs nothing until used, and no
kernel module registers itself at import.
"""

from __future__ import annotations

# Our kernels: always available.
BUILTIN = {
    "pairwise": "gdn2_oracle.kernels.kernel:pairwise",
    "factorized": "gdn2_oracle.kernels.kernel:factorized",
    "pallas-pairwise": "gdn2_oracle.kernels.pallas:pallas_pairwise",
    "pallas-factorized": "gdn2_oracle.kernels.pallas:pallas_factorized",
    "cp-pairwise": "gdn2_oracle.kernels.context_parallel:cp_pairwise",
    "cp-factorized": "gdn2_oracle.kernels.context_parallel:cp_factorized",
    # the serving kernel (state pool, slot indices; docs/DESIGN.md §2 "Decode contract"); without a pool it
    # is a token-by-token contract kernel
    "decode": "gdn2_oracle.kernels.decode:decode_kernel",
    # the same for FLA's families, in its fused recurrent signature (q, k, v, g, beta, initial_state=pool,
    # ssm_state_indices, ...; kernels/family_decode.py)
    "gdn-decode": "gdn2_oracle.kernels.family_decode:gdn_decode",
    "kda-decode": "gdn2_oracle.kernels.family_decode:kda_decode",
    # Gated DeltaNet decode on replay states (a checkpoint plus a ring of recent tokens, vLLM's ReplaySSM;
    # kernels/replay_kernel.py), judged through a replay session driver (ci/running/drivers.py)
    "replay-recurrent": "gdn2_oracle.kernels.replay_kernel:replay_recurrent",
    # FLA's families (docs/DESIGN.md §2 "Families in FLA"): called like chunk_gated_delta_rule / chunk_kda
    # (q, k, v, g, beta, ...), not with the GDN-2 contract; their ``family`` attribute says which
    **{f"{fam}-{core}": f"gdn2_oracle.kernels.families:{fam}_{core}"
       for fam in ("gdn", "kda") for core in ("factorized", "pairwise")},
    "gdn-scalar": "gdn2_oracle.kernels.gdn_scalar:gdn_scalar",
}
# Peer kernels of the optional extras `peers` (atomic-ops) and `fla` (FLA through the torch bridge).
OPTIONAL = {
    "atomic-ops": "gdn2_oracle.kernels.peers:atomic_ops_kernel",
    "atomic-gdn2": "gdn2_oracle.kernels.peers:atomic_gdn2_kernel",
    **{name: f"gdn2_oracle.kernels.fla_peers:{attr}" for name, attr in (
        ("fla-gdn2-naive-recurrent", "gdn2_naive_recurrent"), ("fla-gdn2-naive-chunk", "gdn2_naive_chunk"),
        ("fla-gdn2-chunk", "gdn2_chunk"), ("fla-kda-naive-recurrent", "kda_naive_recurrent"),
        ("fla-kda-naive-chunk", "kda_naive_chunk"), ("fla-kda-chunk", "kda_chunk"),
        ("fla-gdn-naive-recurrent", "gdn_naive_recurrent"), ("fla-gdn-naive-chunk", "gdn_naive_chunk"),
        ("fla-gdn-chunk", "gdn_chunk"), ("fla-gdn-fused-recurrent", "gdn_fused_recurrent"),
        ("fla-kda-fused-recurrent", "kda_fused_recurrent"))},
    **{name: f"gdn2_oracle.kernels.engine_peers:{name.replace('-', '_')}" for name in (
        "vllm-gdn-chunk", "vllm-gdn-fused-recurrent", "vllm-kda-chunk", "sglang-gdn-fused-recurrent")},
    "sglang-gdn-replayssm": "gdn2_oracle.kernels.sglang_replayssm:sglang_gdn_replayssm",
    "vllm-gdn-fused-sigmoid-gating": "gdn2_oracle.kernels.engine_peers:vllm_gdn_fused_sigmoid_gating",
    "vllm-gdn-fused-recurrent-pool": "gdn2_oracle.kernels.engine_peers:vllm_gdn_fused_recurrent_pool",
}
# ``torch:package.module:attr[options]``: a PyTorch callable behind the contract (kernels/torch_bridge.py).
TORCH_PREFIX = "torch:"
TORCH_FACTORY = "gdn2_oracle.kernels.torch_bridge:torch_kernel"
# ``replayssm:PACKAGE[options]``: vLLM's ReplaySSM functions found by name in PACKAGE (kernels/replayssm.py).
REPLAYSSM_PREFIX = "replayssm:"
REPLAYSSM_FACTORY = "gdn2_oracle.kernels.replayssm:replayssm_kernel"
# The kernels validated, benchmarked and property-tested when none is named.
DEFAULTS = ("pairwise", "factorized")
# The serving kernel property-tested when none of those named takes a state pool.
SERVING_DEFAULT = "decode"
# The family serving kernels property-tested when none is selected: a pool and a replay representation.
FAMILY_SERVING_DEFAULTS = ("gdn-decode", "replay-recurrent")
