"""A stand-in for vLLM's ReplaySSM Gated DeltaNet functions, in torch on the CPU, computed by our JAX replay kernel.

Test support: vLLM cannot be installed here, so this package has exactly the module and function names and the
signatures of ``vllm.model_executor.layers.fla.ops`` that the ``replayssm:PACKAGE`` kernel (``kernels/replayssm.py``)
looks up by name, with the semantics docs/DESIGN.md §2 pins ("Replay states and session drivers"):

* ``fused_recurrent_replayssm.fused_recurrent_gated_delta_rule_replayssm``: one token per row, the caller's
  ``write_pos`` per row, the flush at ``write_pos == L - 1`` (``L = d_cache.shape[2]``);
* ``gdn_replayssm_spec_decode.gdn_replayssm_spec_decode`` (verify and flush launches chosen per slot by
  ``is_flush``), ``commit_gdn_replayssm_spec`` and ``reset_gdn_replayssm_spec_cursors`` (cursors per slot).

Every function takes torch tensors and updates the caller's tensors in place (the checkpoint, the ``d`` / ``k`` /
``g`` rings, ``out``, the cursors), as vLLM's do. Inside, the tensors are copied to NumPy, the gates
(``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``) and the optional q / k normalisation are
computed in float32, and ``kernels/replay_decode.py`` does the replay arithmetic; the results are copied back
(``tensor.copy_``). Launch parameters (``block_v``, ``num_warps``, ``num_stages``, ``nk``) are accepted and
ignored. Where ours differs from vLLM's kernels (docs/DESIGN.md §2): the spec flush rounds the folded checkpoint to
the checkpoint's dtype (vLLM: to the activation dtype first), the products run in float32 (vLLM: some ``tl.dot``
operands in the activation dtype), and only ``null_block_id >= 0`` is supported.
"""
