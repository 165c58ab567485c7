"""What a non-PASS judgement points at, from data the judgement already has (docs/DESIGN.md §4, "Diagnosis").

The diagnosis's names in one place: :class:`Finding` (``finding.py``), the per-token profile analysis
(``profiles.py``), the per-case localisers (``localisers.py``), the patterns across a kernel's case results
(``patterns.py``); a serving session's diagnosis is ``serving_diagnosis.py``.

Per case (:func:`diagnose_case`, from a tolerance ``Report`` -- grades, bounds, per-token error profiles --
and the problem's log-decay and initial state): one diagnosis, the most specific true finding first (its
``primary`` is set), the other true ones after it as supporting evidence, in the order of
``localisers.LOCALISERS``. Localisation reads the forward
results first (``o``, then the final state) and the gradients only when the forward is right, because a
gradient's errors spread backwards in time from the step that caused them:

* ``non-finite``: NaN or inf in a result (first bad token, in ``o`` where it has one);
* ``exponent-clip``: results that match the float64 chunked algorithm with its within-chunk decay exponents clipped
  at a fitted ``-X`` (``clip.py``) to ``1 / CLIP_GAIN`` of their error against the oracle: a kernel clipping its
  exponents (``exp(max(G_r - G_s, -X))``), wrong only where a pair decays by more than ``e^-X``;
* ``operand-rounding``: the kernel's error points the way the float32 chunked algorithm's does with every
  product's operands, or only its chunk solve's, rounded to bfloat16 (``oracle.chunked32``'s ``operands``; cosine
  at least ``OPERAND_COSINE`` in the first FAIL result) and has its size (within ``OPERAND_MARGIN`` either way in
  every FAIL result): a kernel computing from 16-bit operands, not a damping;
* ``periodic``: ``o``'s errors start at a token and jump again every ``period`` tokens (a step repeated
  at every chunk or block);
* ``reset``: errors that begin at (or just after) a log-decay spike, a state reset;
* ``block-boundary``: every token before some position within tolerance, most after it over, with a jump
  at that position; or errors from the start that jump again where a chunk would start;
* ``one-off``: errors in a band of tokens only, every later token within tolerance again (one wrong step
  whose error fades with the decaying state);
* ``initial-state``: ``o`` wrong from the first token and fading, with an initial state; or only ``dh0``
  wrong;
* ``accumulating``: sub-O(1) errors that grow along the sequence, with no jump where they cross the tolerance;
* ``final-state``: ``o`` right at every token, the final state wrong;
* ``backward``: only gradients differ (the backward, or a forward step the forward output cannot resolve),
  with the gradient's period where its errors recur;
* ``exponent-cancellation``: a PRECISION grade, or errors that grow with the within-chunk cumulative
  log-decay ``|G|`` where the cumulative-sum baseline loses precision too; the chunk (16 ... 512 tokens)
  whose ``|G|`` the errors follow best is named, and a weak or negative correlation is said as such;
* ``logic``: O(1) relative error (``err_ratio >= LOGIC_ERROR``): a wrong formula, not rounding;
* ``systematic``: none of the above: an error beyond the bound with no token pattern (its size and direction
  against the closest rounded-operand baseline's quoted).

Per kernel, across the case results of a run: first :func:`one_chunk` restates every exponent-cancellation finding
on one chunk size, the one the kernel's cases follow best on average; then (:func:`diagnose_kernel`) the primary
kinds with their cases, first bad forward tokens, periods and chunks; "errors begin only at multiples of N tokens"
when the failing cases' onsets share such a stride; then ``pattern`` lines: a feature of the recipes (``regime``:
decay, gates -- ``b`` and ``w`` per channel or equal --, initial state, ``T`` against the chunk sizes, dtype,
modes) that splits the cases cleanly (every failing case has it, every case without it passes, enough cases on
both sides, not by chance): "fails only where b varies per channel"; the same for the forward alone when some
failing cases differ only in gradients. These are heuristics that name the likeliest cause; the grade is the
verdict.
"""

from __future__ import annotations

from .clip import CLIP_GAIN
from .finding import LOGIC_ERROR, Finding
from .localisers import (
    CANCELLATION_CORRELATION,
    CANCELLATION_LOSS,
    FORWARD,
    GROWTH_CORRELATION,
    LOCALISERS,
    O_PROFILE_LOCALISERS,
    OPERAND_COSINE,
    OPERAND_MARGIN,
    SPIKE,
    SPIKE_LOG_DECAY,
    WEAK_CORRELATION,
    CaseEvidence,
    OProfile,
    diagnose_case,
)
from .patterns import MIN_PATTERN_CASES, PATTERN_CHANCE, diagnose_kernel, one_chunk
from .profiles import (
    BIG_JUMP,
    CHUNKS,
    FALSE_PERIOD,
    JUMP,
    MIN_BAD_FRACTION,
    MIN_CLEAN_TOKENS,
    MIN_ONSETS,
    MIN_PERIOD,
    NOISE_SIGMAS,
    STEP_WINDOW,
    bad_tokens,
    chunk_log_decay,
    chunk_sizes,
    find_period,
    first_bad,
    log_profile,
    rank_correlation,
)

__all__ = [
    "BIG_JUMP", "CANCELLATION_CORRELATION", "CLIP_GAIN", "CANCELLATION_LOSS", "CHUNKS", "FALSE_PERIOD", "FORWARD",
    "GROWTH_CORRELATION", "JUMP", "LOCALISERS", "LOGIC_ERROR", "MIN_BAD_FRACTION", "MIN_CLEAN_TOKENS", "MIN_ONSETS",
    "MIN_PATTERN_CASES", "MIN_PERIOD", "NOISE_SIGMAS", "O_PROFILE_LOCALISERS", "OPERAND_COSINE", "OPERAND_MARGIN",
    "PATTERN_CHANCE", "SPIKE", "SPIKE_LOG_DECAY", "STEP_WINDOW", "WEAK_CORRELATION", "CaseEvidence", "Finding",
    "OProfile", "bad_tokens",
    "chunk_log_decay", "chunk_sizes", "diagnose_case", "diagnose_kernel", "find_period", "first_bad", "log_profile",
    "one_chunk", "rank_correlation",
]
