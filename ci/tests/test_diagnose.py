"""Diagnoses that point at the bug (ci/grading/diagnose.py, docs/DESIGN.md §4, "Diagnosis").

Buggy kernels of ``kernels/testing_diagnose.py`` (a token-by-token scan with one planted bug, gradients by
autodiff) are judged like ``validate`` judges them (``Case`` + ``harness``); each case gets one primary
diagnosis naming the result, the first bad forward token and the pattern, and the kernel's cases the recipe
feature that separates failing from passing ones. One shape per kernel and dtype (one compilation each).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from gdn2_oracle.ci.grading import diagnose
from gdn2_oracle.ci.grading.case import Case
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION, Verdict
from gdn2_oracle.ci.grading.tolerance import Report
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels import testing
from gdn2_oracle.kernels import testing_diagnose as buggy
from gdn2_oracle.oracle import Recipe

SHAPE = (1, 200, 2, 16, 16)  # past three 64-token boundaries; every kernel compiles once for it per dtype


def judge(fn, decay="moderate", gates="uniform", h0=False, dtype="float32", shape=SHAPE, seed=3):
    """``(report, case dict)`` of kernel ``fn`` on one generated recipe, the dict as ``validate`` writes it."""
    recipe = Recipe(*shape, decay=decay, gates=gates, initial_state=h0, precision=dtype, seed=seed)
    case = Case.from_recipe(f"{decay}_{gates}{'_h0' if h0 else ''}_{dtype}", recipe)
    problem, do, dfs = case.data()
    report = case.judge(harness.kernel_results(fn, problem, do, dfs, dtype=dtype))
    return report, {**case.describe(), "grade": report.grade, "passed": report.passed,
                    "verdicts": [v.as_dict() for v in report.verdicts],
                    "diagnosis": [f.as_dict() for f in report.diagnosis]}


def primary(report):
    """The report's primary finding (the first, and the only one marked primary)."""
    assert report.diagnosis, report.format()
    first, *rest = report.diagnosis
    assert first.primary and not any(f.primary for f in rest), report.format()
    return first


def patterns(found):
    return [f.text for f in found if f.kind == "pattern"]


# --------------------------------------------------------------------------------------------
# one specific primary diagnosis per buggy kernel


def test_erase_skipped_every_64_tokens_is_named_periodic():
    report, _ = judge(buggy.skip_erase_every_64)
    f = primary(report)
    assert f.kind == "periodic" and f.token == 64 and f.period == 64 and "o" in f.results, report.format()
    assert "errors in o, final_state start at token 64" in f.text and "jump every 64 tokens (at 64, 128, 192)" in f.text
    # strong decay: each skipped erase's error lives a few tokens only -- still one period, from token 64
    report, _ = judge(buggy.skip_erase_every_64, decay="strong")
    f = primary(report)
    assert (f.kind, f.token, f.period) == ("periodic", 64, 64), report.format()
    # with an initial state the first token's erase is skipped too: errors from token 0, every 64 tokens
    report, _ = judge(buggy.skip_erase_every_64, h0=True)
    f = primary(report)
    assert (f.kind, f.token, f.period) == ("periodic", 0, 64), report.format()
    json.dumps([g.as_dict() for g in report.diagnosis])  # JSON-able
    # b = 0: the skipped erase changes nothing the forward computes; db is wrong at every skipped token
    report, _ = judge(buggy.skip_erase_every_64, gates="erase_zero")
    f = primary(report)
    assert (f.kind, f.results, f.period) == ("backward", ("db",), 64), report.format()
    assert "errors in db begin at tokens 64, 128, 192 (every 64 tokens)" in f.text
    assert "or one whose erase or write gate is zero in this problem" in f.text


def test_gate_on_the_wrong_side_fails_the_forward_only_where_b_varies_per_channel():
    """(I - (b*k) k^T) instead of (I - k (b*k)^T): the same values wherever b is equal in every channel, so there
    the forward is right and only db (the per-channel split of the gate's gradient) differs; b = w = 0 passes."""
    cases = []
    for gates, decay in (("uniform", "moderate"), ("write_one", "moderate"), ("negative", "moderate"),
                         ("uniform", "strong"), ("one", "moderate"), ("erase_one", "moderate"),
                         ("erase_zero", "moderate"), ("zero", "moderate")):
        report, case = judge(buggy.transposed_erase, gates=gates, decay=decay)
        cases.append(case)
        if gates == "zero":
            assert report.passed, report.format()
            continue
        f = primary(report)
        if gates in ("uniform", "write_one", "negative"):  # b varies: o wrong from token 1 (S_0 = 0 before it)
            assert f.kind == "logic" and f.token == 1 and "o over tolerance from token 1" in f.text, report.format()
        else:
            assert f.kind == "backward" and f.results == ("db",), report.format()
            assert "only gradients differ (db" in f.text and "a backward bug" not in f.text
    found = diagnose.diagnose_kernel(cases)
    assert [f.kind for f in found[:2]] == ["logic", "backward"], found
    [line] = patterns(found)
    assert line.startswith("the forward (o, final_state) fails only where b varies per channel"), line
    assert "right in every case where b is equal across channels (4)" in line and "only in gradients (db)" in line


def test_initial_state_read_in_bf16_fails_only_with_h0():
    cases = []
    for decay, gates in (("moderate", "uniform"), ("strong", "negative"), ("weak", "write_one"), ("mixed", "one")):
        for h0 in (True, False):
            report, case = judge(buggy.h0_in_bf16, decay=decay, gates=gates, h0=h0)
            cases.append(case)
            assert report.passed != h0, report.format()
            if h0 and decay in ("moderate", "strong"):  # the error fades with the decaying state
                f = primary(report)
                assert f.kind == "initial-state" and f.token == 0 and f.results[0] == "o", report.format()
                assert "errors in o from the first token (token 0), fading" in f.text
    found = diagnose.diagnose_kernel(cases)
    assert patterns(found) == [
        "fails only with h0: 4 of the 4 case(s) with h0 fail, every case without h0 (4) passes"], found


def test_a_forward_step_only_the_gradients_see_is_not_blamed_on_the_backward():
    """h0 decayed twice in the first token's erase: under extreme decay D h0 ~ e^-40, so the forward cannot see
    it; dh0 can. The diagnosis says so without calling it a backward bug, and the PRECISION db beside it does
    not claim errors that grow with |G| when they do not."""
    report, _ = judge(buggy.h0_decayed_twice, decay="extreme", h0=True)
    f = primary(report)
    assert f.kind == "initial-state" and f.results == ("dh0",), report.format()
    assert "only dh0" in f.text and "a forward step acting on h0" in f.text
    assert "backward bug" not in report.format()
    for g in report.diagnosis:
        if g.kind == "exponent-cancellation":
            r = max(g.evidence["correlation"].values())
            assert (r >= diagnose.CANCELLATION_CORRELATION) == ("errors grow with" in g.text), g.text
    # moderate decay: the same bug is seen by o from token 0
    report, _ = judge(buggy.h0_decayed_twice, h0=True)
    f = primary(report)
    assert f.token == 0 and "o" in f.results, report.format()


def test_final_state_taken_early_is_named_final_state():
    report, _ = judge(buggy.final_state_early)
    f = primary(report)
    assert f.kind == "final-state" and f.results[0] == "final_state", report.format()
    assert f.text.startswith("o within tolerance at every token, final_state wrong")


def test_bf16_only_rounding_fails_only_in_bfloat16_and_grows_along_the_sequence():
    cases = []
    for dtype in ("float32", "bfloat16"):
        for decay, gates, h0 in (("moderate", "uniform", False), ("strong", "negative", True),
                                 ("moderate", "write_one", True), ("strong", "one", False)):
            report, case = judge(buggy.bf16_log_decay, decay=decay, gates=gates, h0=h0, dtype=dtype)
            cases.append(case)
            assert report.passed == (dtype == "float32"), report.format()
            if dtype == "bfloat16" and decay == "moderate":
                f = primary(report)
                assert f.kind == "accumulating" and f.token is not None and "o" in f.results, report.format()
                assert f"over tolerance from token {f.token} with no jump there" in f.text
    found = diagnose.diagnose_kernel(cases)
    assert patterns(found) == [
        "fails only in bfloat16: 4 of the 4 case(s) in bfloat16 fail, every case in float32 (4) passes"], found


def test_a_chunk_128_cumulative_sum_kernel_is_diagnosed_with_chunk_128():
    report, _ = judge(testing.cumsum_kernel(128), decay="resets", h0=True, shape=(1, 300, 1, 16, 16), seed=7)
    assert report.grade == PRECISION, report.format()
    f = primary(report)
    assert f.kind == "exponent-cancellation" and f.chunk == 128, report.format()
    corr = f.evidence["correlation"]
    assert max(corr, key=corr.get) == "128" and corr["128"] > corr["64"] + 0.1, corr
    assert "follow 128-token chunks best" in f.text and "the algorithm is right" in f.text


def test_a_clipped_decay_exponent_is_named_with_its_clip_and_chunk():
    """A chunked kernel clipping its within-chunk decay exponents at ``-CLIP``: under extreme decay ``db`` alone
    fails (read otherwise as backward / logic), and the primary finding names the clip, fitted from the float64
    chunked algorithm clipped alike, and the kernel's chunk."""
    report, _ = judge(buggy.clipped_exponent, decay="extreme", h0=True, shape=(1, 96, 1, 16, 16))
    first = primary(report)
    assert first.kind == "exponent-clip" and "db" in first.results, report.format()
    assert abs(first.evidence["clip"] - buggy.CLIP) < 0.1 and first.chunk == buggy.CHUNK, first
    assert first.evidence["gain"]["db"] <= 1 / diagnose.CLIP_GAIN, first


@pytest.mark.parametrize("decay", ["moderate", "strong", "none"])
def test_16_bit_operands_are_called_operand_rounding_and_a_damped_solve_is_not(decay):
    """A chunked kernel whose products take bfloat16 operands, or only its chunk solve's, is compared with the
    oracle's chunked algorithm rounded the same way -- its error points the same way (cosine) and has its size --
    and called operand rounding, naming which operands; a chunk solve damped by 2e-3 (errors as large) is still
    called systematic, with the closest rounding's comparison quoted."""
    for fn, ops in ((buggy.bf16_operands, "bfloat16"), (buggy.bf16_solve, "bfloat16_solve")):
        report, _ = judge(fn, decay=decay, h0=True)
        assert report.grade == FAIL, report.format()
        f = primary(report)
        assert f.kind == "operand-rounding" and f.evidence["operands"] == ops, report.format()
        assert "rounding in a 16-bit operand" in f.text and "not a damping" in f.text, f.text
        assert f.evidence["operand_cosine"] >= diagnose.OPERAND_COSINE, f.evidence
    damped, _ = judge(buggy.damped_solve, decay=decay, h0=True)
    assert damped.grade == FAIL, damped.format()
    kinds = [x.kind for x in damped.diagnosis]
    assert "operand-rounding" not in kinds and primary(damped).kind == "systematic", damped.format()
    assert "not operand rounding" in primary(damped).text, damped.format()


# --------------------------------------------------------------------------------------------
# the exponent-cancellation sentence never claims a correlation the numbers contradict


def _precision_report(profile):
    T = len(profile)
    v = Verdict("db", 1e-3, 1e-3, 1e-4, 1e-4, "recurrence", False, grade=PRECISION, bound_ratio=1e-2, bound_max=1e-2)
    return Report(verdicts=[Verdict(n, 0, 0, 1, 1, "recurrence", True) for n in ("o", "final_state")] + [v],
                  profiles={"db": np.asarray(profile, float)}), SimpleNamespace(g=-np.ones((1, T, 1, 2)),
                                                                              initial_state=None)


@pytest.mark.parametrize("shape,words,absent", [
    (lambda G: G, ["errors grow with", "rank correlation 1.00 over 64-token chunks", "the algorithm is right"], []),
    (lambda G: -G, ["do not follow", "rank correlation -", "negative"], ["errors grow with", "the algorithm is right"]),
    (lambda G: np.ones_like(G) + (np.arange(len(G)) % 7 == 0), ["do not follow"], ["errors grow with"]),
])
def test_cancellation_text_follows_the_correlation(shape, words, absent):
    G = diagnose.chunk_log_decay(-np.ones((1, 200, 1, 2)), 64)
    report, problem = _precision_report(1e-3 * (1 + shape(G)))
    [f] = diagnose.diagnose_case(report, problem)
    assert f.kind == "exponent-cancellation" and f.primary
    for w in words:
        assert w in f.text, f.text
    for w in absent:
        assert w not in f.text, f.text


def test_cancellation_names_the_chunk_the_errors_follow():
    g = -np.ones((1, 600, 1, 2))
    for chunk in diagnose.CHUNKS:
        [f] = diagnose.diagnose_case(*_precision_report(diagnose.chunk_log_decay(g, chunk) + 1))
        assert f.chunk == chunk and f"follow {chunk}-token chunks best" in f.text, f.text
    assert diagnose.chunk_sizes(100) == [16, 32, 64, 128] and diagnose.chunk_sizes(10) == [16]


# --------------------------------------------------------------------------------------------
# across cases: patterns from the recipes (synthetic case dicts)


def case(name, grade, *, dtype="float32", T=100, decay="moderate", gates="uniform", h0=False, mode=None,
         diagnosis=None, reduction=None):
    regime = {"decay": decay, "gates": gates, "initial_state": h0}
    if reduction:
        regime["reduction"] = reduction
    return {"case": name, "dtype": dtype, "shape": [1, T, 1, 16, 16], "grade": grade, "passed": grade == PASS,
            **({"mode": mode} if mode else {}), "regime": regime,
            "diagnosis": diagnosis or ([{"kind": "logic", "text": "", "token": 3}] if grade != PASS else [])}


def grid(fail):
    """Cases over gates x h0 x dtype x (decay, T), every combination once, graded FAIL where ``fail(case)``."""
    out = []
    for gates in ("uniform", "one", "negative", "erase_one"):
        for h0 in (False, True):
            for dtype in ("float32", "bfloat16"):
                for decay, T in (("moderate", 100), ("strong", 300)):
                    c = case(f"{gates}_{h0}_{dtype}_{decay}", PASS, dtype=dtype, T=T, decay=decay, gates=gates, h0=h0)
                    out.append(case(c["case"], FAIL if fail(c) else PASS, dtype=dtype, T=T, decay=decay, gates=gates,
                                    h0=h0))
    return out


@pytest.mark.parametrize("fail,lines", [
    (lambda c: c["regime"]["gates"] in ("uniform", "negative"),
     ["fails only where b varies per channel", "fails only where w varies per channel"]),  # w = 1 in gates one
    (lambda c: c["regime"]["initial_state"], ["fails only with h0"]),
    (lambda c: c["shape"][1] > 256, ["fails only for T > 256", "fails only under strong decay"]),  # same cases
    (lambda c: c["dtype"] == "bfloat16", ["fails only in bfloat16"]),
    # two features together: each is a true "only" (every failing case has it, every case without it passes)
    (lambda c: c["regime"]["decay"] == "strong" and c["regime"]["initial_state"],
     ["fails only with h0", "fails only for T > 256", "fails only under strong decay"]),
])
def test_each_pattern_is_read_from_the_recipes(fail, lines):
    found = patterns(diagnose.diagnose_kernel(grid(fail)))
    assert sorted(f.split(":")[0] for f in found) == sorted(lines), found


def test_length_pattern_names_the_largest_clean_chunk_and_tail_pattern():
    cases = [case(f"t{T}", FAIL if T > 256 else PASS, T=T) for T in (16, 32, 40, 64, 100, 200, 256, 300, 400, 1000)]
    found = patterns(diagnose.diagnose_kernel(cases))
    assert found == ["fails only for T > 256: 3 of the 3 case(s) for T > 256 fail, every case with T <= 256 (7) "
                     "passes"], found
    # a tail bug of a chunk-64 kernel: T = 80 fails too (a multiple of 16, not of 64)
    cases = [case(f"t{T}", FAIL if T % 64 else PASS, T=T) for T in (64, 128, 256, 512, 65, 80, 100, 200, 300)]
    found = patterns(diagnose.diagnose_kernel(cases))
    assert found == ["fails only where T is not a multiple of 64: 5 of the 5 case(s) where T is not a multiple of 64 "
                     "fail, every case where T is a multiple of 64 (4) passes"], found


def test_mode_pattern_and_too_few_cases():
    cases = ([case(f"v{i}", FAIL, mode="varlen") for i in range(3)]
             + [case(f"g{i}", PASS, mode="gate") for i in range(2)] + [case(f"d{i}", PASS) for i in range(4)])
    found = patterns(diagnose.diagnose_kernel(cases))
    assert any(f.startswith("fails only in mode varlen:") for f in found), found
    # the modes cases of validate: a ``modes`` list per case dict
    cases = [{**{k: v for k, v in c.items() if k != "mode"}, "modes": c["mode"].split("+") if "mode" in c else []}
             for c in cases]
    cases[0]["modes"] = ["varlen", "gate"]
    found = patterns(diagnose.diagnose_kernel(cases))
    assert any(f.startswith("fails only in mode varlen:") for f in found), found
    # two failing cases are too few to name a pattern; three of three against three could be chance
    cases = [case("a", FAIL, dtype="bfloat16"), case("b", FAIL, dtype="bfloat16")] + [
        case(f"p{i}", PASS) for i in range(5)]
    assert patterns(diagnose.diagnose_kernel(cases)) == []
    cases = [case(f"b{i}", FAIL, dtype="bfloat16") for i in range(3)] + [case(f"p{i}", PASS) for i in range(3)]
    assert patterns(diagnose.diagnose_kernel(cases)) == []
    # a feature most cases have explains nothing: 4 failing among 20 cases, the 3 without it passing
    cases = [case(f"f{i}", FAIL, T=100) for i in range(4)] + [case(f"p{i}", PASS, T=100) for i in range(13)] + [
        case(f"s{i}", PASS, T=10) for i in range(3)]
    assert patterns(diagnose.diagnose_kernel(cases)) == []


def test_reductions_have_b_equal_across_channels():
    cases = ([case(f"u{i}", FAIL, gates="uniform", T=100 + i) for i in range(4)]
             + [case(f"k{i}", PASS, gates="uniform", reduction="kda", T=100 + i) for i in range(4)])
    found = patterns(diagnose.diagnose_kernel(cases))
    assert any(f.startswith("fails only where b varies per channel") for f in found), found


def test_kernel_summary_quotes_the_primary_forward_token_and_period():
    periodic = {"kind": "periodic", "text": "...", "token": 64, "primary": True, "results": ["o"], "period": 64}
    late_grad = {"kind": "logic", "text": "...", "token": 19, "primary": False, "results": ["dg"]}
    cases = [case(f"c{i}", FAIL, diagnosis=[periodic, late_grad]) for i in range(3)] + [
        case("other", FAIL, dtype="bfloat16", diagnosis=[{**late_grad, "primary": True}])]
    found = diagnose.diagnose_kernel(cases)
    assert found[0].kind == "periodic" and found[0].primary and found[0].token == 64, found
    assert "first bad token 64" in found[0].text and "errors recur every 64 tokens" in found[0].text
    assert "19" not in found[0].text
    assert [f.kind for f in found[:2]] == ["periodic", "logic"]
    json.dumps([f.as_dict() for f in found])


def test_kernel_names_onsets_at_multiples_of_one_stride():
    def hit(name, **f):
        return case(name, FAIL, diagnosis=[{"kind": "block-boundary", "text": "...", "primary": True, **f}])

    cases = [hit("a", token=64), hit("b", token=0, evidence={"jump": 128}),
             hit("c", token=0, evidence={"onsets": [0, 64, 128, 192]}), hit("d", token=0)]
    found = diagnose.diagnose_kernel(cases)
    [line] = patterns(found)
    assert line.startswith("errors begin only at multiples of 64 tokens (at tokens 64, 128, 192 in 3 case(s)"), line
    cases[0] = hit("a", token=19)  # one onset elsewhere: no stride
    assert patterns(diagnose.diagnose_kernel(cases)) == []


def test_errors_starting_at_a_state_reset_are_not_called_a_block_boundary():
    T = 100
    prof = np.where(np.arange(T) >= 37, 1e-2, 1e-8)
    v = Verdict("o", 1e-2, 1e-2, 1e-5, 1e-5, "recurrence", False, grade=FAIL, bound_ratio=1e-5, bound_max=1e-5)
    report = Report(verdicts=[v], profiles={"o": prof})
    g = np.full((1, T, 1, 4), -0.05)
    found = diagnose.diagnose_case(report, SimpleNamespace(g=g, initial_state=None))
    assert found[0].kind == "block-boundary" and found[0].token == 37, found
    g[:, 37] = -1000.0
    found = diagnose.diagnose_case(report, SimpleNamespace(g=g, initial_state=None))
    assert found[0].kind == "reset" and found[0].token == 37 and "spikes to -1e+03" in found[0].text, found


def test_a_training_call_case_compares_with_the_bfloat16_operand_baseline_too():
    """The training-call judge (``ModeCase``, every call mode) hands the diagnosis the same bfloat16-operand
    baseline (core ``chunked32_bf16`` of the call's pipeline): results equal to it are operand rounding."""
    from gdn2_oracle.ci.grading.modes import ModeCase
    from gdn2_oracle.oracle.call import Call

    p = Recipe(1, 100, 2, 16, 16, decay="moderate", initial_state=True, seed=4).build()[0]
    call = Call(*p.inputs(), scale=p.scale, initial_state=p.initial_state, qk_l2norm=True)
    do = np.random.default_rng(0).standard_normal(p.v.shape)
    case = ModeCase.of(call, do, np.zeros_like(p.initial_state))
    report = case.judge(case.operand_baseline({}, "bfloat16_solve"))
    assert report.grade == FAIL, report.format()
    f = primary(report)
    assert f.kind == "operand-rounding" and f.evidence["operands"] == "bfloat16_solve", report.format()
    assert set(f.evidence["operand_ratio"].values()) == {1.0} and f.evidence["operand_cosine"] == 1.0, f.evidence


def _cancellation_record(profile_chunk, T, seed):
    """A case record (as validate keeps it) whose PRECISION ``db`` errors follow ``profile_chunk``-token chunks'
    ``|G|``, with noise."""
    g = -np.random.default_rng(seed).uniform(0.5, 1.5, (1, T, 1, 2))
    noise = np.random.default_rng(seed + 1).uniform(0, 0.3, T)
    report, _ = _precision_report(diagnose.chunk_log_decay(g, profile_chunk) * (1 + noise) + 1)
    [f] = diagnose.diagnose_case(report, SimpleNamespace(g=g, initial_state=None))
    return {"case": f"c{seed}", "grade": PRECISION, "diagnosis": [f.as_dict()]}


def test_one_chunk_size_per_kernel_across_its_cases():
    """A kernel's exponent-cancellation findings name one chunk: the one its cases' errors follow best on average
    (one case's noise favouring 32 is restated on the kernel's 128, with its own correlation there quoted);
    validate applies it to every kernel's records before the kernel summary."""
    from gdn2_oracle.ci.grading.patterns import one_chunk

    records = [_cancellation_record(128, 600, s) for s in (1, 3, 5)] + [_cancellation_record(32, 600, 7)]
    before = [r["diagnosis"][0]["chunk"] for r in records]
    assert before == [128, 128, 128, 32], before
    after, chunk = one_chunk(records)
    assert chunk == 128
    assert [r["diagnosis"][0]["chunk"] for r in after] == [128] * 4
    odd = after[3]["diagnosis"][0]["text"]
    assert "the kernel's chunk across its 4 cases" in odd and "-token chunks best" not in odd, odd
    r128 = records[3]["diagnosis"][0]["evidence"]["correlation"]["128"]
    assert f"rank correlation {r128:.2f}" in odd, odd
    assert records[3]["diagnosis"][0]["chunk"] == 32  # the input records are not changed
    single, none = one_chunk(records[3:])
    assert none is None and single == records[3:]
    summary = diagnose.diagnose_kernel(after)[0]
    assert "follow 128-token chunks best in 4 of 4 case(s)" in summary.text, summary.text
