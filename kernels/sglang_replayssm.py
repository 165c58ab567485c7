"""SGLang 0.5.23's own GDN ReplaySSM, read from its wheel: the kernel ``sglang-gdn-replayssm[capacity=16,spec_len=4]``.

Three of SGLang's files (``sglang/kernels/ops/attention/linear/``), loaded by ``kernels/third_party.py`` from the wheel
in ``$GDN2_PEERS/wheels`` (``make peers``) and run in Triton's interpreter:

* ``fused_recurrent_linear_replayssm.py``: ``fused_recurrent_gdn_replayssm_decode`` (one token per row: SGLang's
  decode path, ``layers/attention/linear/kernels/gdn_triton.py``);
* ``gdn_replayssm_spec_decode.py``: ``gdn_replayssm_spec_decode`` (the verify window), ``commit_gdn_replayssm_spec``
  (the cursors) and ``commit_gdn_replayssm_circular`` (the capacity fold), as SGLang's verify and its commit after
  acceptance call them (``gdn_backend.py: _replayssm_target_verify``, ``speculative/spec_utils.py``);
* ``gdn_replayssm_spec_fold.py`` loads with them (``engine_peers.sglang_replayssm``; its fold-every-commit protocol is
  SGLang's bfloat16-checkpoint path, not run here).

A :class:`SglangReplaySSMKernel` carries those functions and the storage options: ``capacity`` (the ring L, a power
of two: SGLang's circular ring is ``max_cache_len`` entries addressed ``& (L - 1)``), ``spec_len`` (``max_spec_len``,
raised to a session's longest window), ``session_size`` (``small`` or ``k128``, as ``kernels/replayssm.py``; default
``k128``, SGLang's launch shapes: its K tiles are ``K / nk`` with ``nk = 2`` and at least 16 wide, so at K = 16 the
backend passes ``nk=1``), ``strict_drafts`` and ``mutant`` (a deliberate bug around SGLang's functions, for the
tests: :data:`MUTANTS`). Float32 storage only (SGLang's float32 checkpoint; its bfloat16 path keeps compact low
parts the interpreter's bf16 ``tl.dot`` cannot run). The backend is ``ci/running/sglang_replay_backend.py``.
"""

from __future__ import annotations

from . import engine_peers, third_party
from .replayssm import SESSION_SIZE, SESSION_SIZES

NAME = "sglang-gdn-replayssm"
DECODE_MODULE = "sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm"
# deliberate bugs, each a wrapper around one of SGLang's functions (the functions themselves are not changed)
MUTANTS = {
    "commit_extra_token": "commit_gdn_replayssm_spec moves the cursor by one token more than were accepted",
    "decode_wrong_ring_slot": "the one-token kernel is given write_pos + 1: it writes and reads one ring slot late",
}


def _count(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return value


def _commit_extra_token(commit):
    """``commit_gdn_replayssm_spec`` that commits one token more than accepted (mutant)."""

    def wrapped(write_pos, cache_base, is_flush, num_accepted, replay_indices, *args, **kwargs):
        return commit(write_pos, cache_base, is_flush, num_accepted + 1, replay_indices, *args, **kwargs)

    return wrapped


def _decode_wrong_ring_slot(fn):
    """The one-token kernel given ``write_pos + 1`` (mutant)."""

    def wrapped(*args, write_pos, **kwargs):
        return fn(*args, write_pos=write_pos + 1, **kwargs)

    return wrapped


class SglangReplaySSMKernel:
    """SGLang's GDN ReplaySSM functions from its wheel and the storage options (module docstring)."""

    session_driver = "replay"
    family = "gdn"
    serving_only = "SGLang's GDN ReplaySSM runs on its ring caches only: no call without a session"
    interpreted = True  # in Triton's interpreter: validate's time estimate counts its work
    state_dtype = cache_dtype = "float32"

    def __init__(self, capacity=16, spec_len=4, session_size=SESSION_SIZE, strict_drafts=False, mutant=None):
        self.capacity, self.spec_len = _count("capacity", capacity), _count("spec_len", spec_len)
        if self.capacity & (self.capacity - 1):
            raise ValueError(f"capacity: {self.capacity} is not a power of two (SGLang's circular ring of "
                             "max_cache_len entries is addressed with & (max_cache_len - 1))")
        if session_size not in SESSION_SIZES:
            raise ValueError(f"session_size: {session_size!r} not one of {SESSION_SIZES}")
        if strict_drafts not in (True, False, 0, 1):
            raise ValueError(f"strict_drafts: expected a boolean, got {strict_drafts!r}")
        if mutant is not None and mutant not in MUTANTS:
            raise ValueError(f"mutant: {mutant!r} not one of {tuple(MUTANTS)}")
        self.session_size, self.strict_drafts, self.mutant = session_size, bool(strict_drafts), mutant
        spec, _fold = engine_peers.sglang_replayssm()
        one = third_party.load("sglang", [DECODE_MODULE], who=f"kernel {NAME!r}").module(DECODE_MODULE)
        self.one_token = one.fused_recurrent_gdn_replayssm_decode
        self.verify = spec.gdn_replayssm_spec_decode
        self.commit = spec.commit_gdn_replayssm_spec
        self.fold = spec.commit_gdn_replayssm_circular
        if mutant == "commit_extra_token":
            self.commit = _commit_extra_token(self.commit)
        elif mutant == "decode_wrong_ring_slot":
            self.one_token = _decode_wrong_ring_slot(self.one_token)
        self.__name__ = NAME
        self.device = "cpu"
        # the sources a report's fingerprint covers: this module and the loader's
        self.modules = (__name__, engine_peers.__name__, third_party.__name__)

    def __repr__(self):
        return (f"SglangReplaySSMKernel(capacity={self.capacity}, spec_len={self.spec_len}, "
                f"session_size={self.session_size!r}, strict_drafts={self.strict_drafts}, mutant={self.mutant!r})")

    def __call__(self, q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False):
        """No call without a session: the kernel is judged on the gdn serving sessions (its replay driver)."""
        raise ValueError(f"kernel: {NAME!r} runs only on serving sessions (its replay driver, "
                         "ci/running/sglang_replay_backend.py): give validate the serving --modes")


def sglang_gdn_replayssm(capacity=16, spec_len=4, session_size=SESSION_SIZE, strict_drafts=False, mutant=None):
    """``sglang-gdn-replayssm``: SGLang's GDN ReplaySSM (one-token decode, verify windows, circular commit)."""
    return SglangReplaySSMKernel(capacity, spec_len, session_size, strict_drafts, mutant)
