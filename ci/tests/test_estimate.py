"""The time model of validate's estimate line: interpreted kernels are costed by their work, compiled ones by their
programs and calls (``ci/commands/validate.py``: ``estimate_seconds``)."""

from types import SimpleNamespace

import pytest

from gdn2_oracle.ci.benchmarks import bench_estimates
from gdn2_oracle.ci.commands import validate
from gdn2_oracle.kernels.spec import KernelSpec

SMALL, LARGE = "gdn_gva2_moderate_h0", "gdn_gen_weak_erase_zero_T1024"  # smoke cases: 800 and 2,048 token-heads


def estimate(spec, case):
    """The seconds the model says for kernel ``spec`` on the float32 smoke case ``case`` alone."""
    run = validate.ValidationRun([KernelSpec.parse(spec)],
                                 validate.ValidateOptions(dtypes=("float32",), cases="smoke", only=(case,)))
    seconds, calls, compiles = validate.estimate_seconds(run)
    assert calls == 1 and compiles == ("interpret" not in spec)
    return seconds


@pytest.fixture(scope="module")
def seconds():
    """{(kernel, case): estimated seconds} for an interpreted and a compiled kernel on a small and a large case."""
    return {(spec, case): estimate(spec, case)
            for spec in ("gdn-factorized[interpret=1]", "gdn-factorized") for case in (SMALL, LARGE)}


def test_interpreted_estimate_grows_with_the_problem(seconds):
    """Past the start-up, in proportion to the token-heads (2,048 against 800)."""
    start = validate.START_SECONDS
    small, large = (seconds["gdn-factorized[interpret=1]", c] - start for c in (SMALL, LARGE))
    assert small > 0 and large == pytest.approx(small * 2048 / 800)


def test_compiled_estimate_does_not_count_tokens(seconds):
    assert seconds["gdn-factorized", LARGE] == seconds["gdn-factorized", SMALL]


@pytest.mark.parametrize("case", [SMALL, LARGE])
def test_interpreted_estimate_exceeds_the_compiled_one(seconds, case):
    assert seconds["gdn-factorized[interpret=1]", case] > seconds["gdn-factorized", case]


def test_interpreted_constants_are_read_from_one_place(monkeypatch, seconds):
    doubled = {k: 2 * v for k, v in validate.INTERPRETED_SECONDS_PER_TOKEN_HEAD.items()}
    monkeypatch.setattr(validate, "INTERPRETED_SECONDS_PER_TOKEN_HEAD", doubled)
    start = validate.START_SECONDS
    assert estimate("gdn-factorized[interpret=1]", LARGE) - start == pytest.approx(
        2 * (seconds["gdn-factorized[interpret=1]", LARGE] - start))


@pytest.mark.parametrize("name, options, attribute, kind", [
    ("fla-gdn-chunk", {"interpret": 1}, False, "chunk"),
    ("fla-kda-chunk", {"interpret": 1, "signature": "kda"}, False, "kda-chunk"),
    ("fla-gdn2-chunk", {"interpret": 1}, False, "gdn2-chunk"),
    ("fla-gdn-fused-recurrent", {"interpret": 1}, False, "recurrent"),
    ("vllm-gdn-chunk", {}, True, "chunk"),
    ("sglang-gdn-replayssm", {}, True, "recurrent"),
    ("vllm-gdn-fused-recurrent", {}, True, "recurrent"),
    ("gdn-factorized", {}, False, None),
    ("fla-gdn-chunk", {"interpret": 0}, False, None),
])
def test_interpreted_kind(name, options, attribute, kind):
    spec = KernelSpec(name, name, options)
    assert validate.interpreted_kind(spec, SimpleNamespace(interpreted=attribute)) == kind


@pytest.mark.parametrize("name, kind", [("vllm-gdn-chunk", "chunk-forward"), ("vllm-kda-chunk", "kda-chunk-forward"),
                                        ("vllm-gdn-fused-recurrent", "recurrent-forward"),
                                        ("sglang-gdn-fused-recurrent", "recurrent-forward")])
def test_forward_only_kinds(name, kind):
    forward_only = SimpleNamespace(interpreted=True, no_backward="forward only")
    assert validate.interpreted_kind(KernelSpec(name, name, {}), forward_only) == kind
    assert validate.INTERPRETED_SECONDS_PER_TOKEN_HEAD[kind] < validate.INTERPRETED_SECONDS_PER_TOKEN_HEAD[
        validate.interpreted_kind(KernelSpec(name, name, {}), SimpleNamespace(interpreted=True))]


@pytest.mark.parametrize("seconds, said", [(3.0, "about 5 s"), (7.4, "about 5 s"), (7.5, "about 10 s"),
                                           (64.0, "about 60 s"), (89.0, "about 90 s"), (90.0, "about 2 min")])
def test_about(seconds, said):
    assert validate.about(seconds) == said


def test_torch_kind():
    torch = KernelSpec.parse("torch:gdn2_oracle.kernels.testing_torch:recurrent")
    assert validate.interpreted_kind(torch, torch.build()) == "torch"


def test_a_warm_run_of_a_compiled_kernel_is_said_to_be_shorter():
    run = validate.ValidationRun([KernelSpec.parse("gdn-factorized")],
                                 validate.ValidateOptions(dtypes=("float32",), cases="smoke"))
    assert validate.estimate_seconds(run, warm=True)[0] < validate.estimate_seconds(run)[0]
    assert "with a warm compilation cache" in validate.estimate_line(run)


@pytest.mark.parametrize("shape, tokens, heads", [
    ((2, 100, 2, 4, 16, 32), None, 800),  # family call (B, T, H, HV, K, V)
    ((1, 64, 3, 16, 16), None, 192),  # GDN-2 call (B, T, H, K, V)
    ((5, 4, 16, 16), 12, 48),  # serving session: pool (P, HV, K, V), 12 tokens over its calls
])
def test_token_heads(shape, tokens, heads):
    case = SimpleNamespace(shape=shape) if tokens is None else SimpleNamespace(shape=shape, tokens=lambda: tokens)
    assert validate.token_heads(case) == heads


@pytest.mark.parametrize("line, warm, seconds", [
    ("...; about 70 s on this machine cold (2 cores), about 10 s with a warm compilation cache", False, 70),
    ("...; about 70 s on this machine cold (2 cores), about 10 s with a warm compilation cache", True, 10),
    ("...; about 13 min on this machine cold (2 cores) (interpreted or torch: ...)", True, 780),
    (None, False, None),
])
def test_the_benchmark_reads_the_figures_the_line_says(line, warm, seconds):
    assert bench_estimates.said_seconds(line, warm=warm) == seconds


def test_the_line_says_how_many_programs_the_compiled_kernels_compile():
    """The estimate line names the programs: one per distinct case dtype, shape, kind and modes of a compiled kernel
    (none for an interpreted one), fewer than its calls where cases share a program."""
    specs = [KernelSpec.parse(s) for s in ("gdn-factorized", "gdn-factorized[interpret=1]")]
    run = validate.ValidationRun(specs, validate.ValidateOptions(cases="smoke"))
    [(_, _, mine), _] = validate.kernel_cases(run)
    programs = len({(c.dtype, c.shape, type(c).__name__, c.modes) for c in mine})
    assert validate.estimate_programs(run) == programs and 0 < programs <= len(mine)
    assert f", {programs} programs to compile; " in validate.estimate_line(run)


def test_quick_compile_flags_cost_a_program_less(monkeypatch):
    """The constants follow the way the process compiles: both quick-compile flags, or XLA's default."""
    from gdn2_oracle.ci.running import xla_cpu

    monkeypatch.setenv("XLA_FLAGS", " ".join(xla_cpu.FLAGS))
    quick = validate.compiled_constants()
    monkeypatch.setenv("XLA_FLAGS", xla_cpu.FLAGS[0])
    assert quick == validate.COMPILED_CORE_SECONDS["quick-compile"]
    assert validate.compiled_constants() == validate.COMPILED_CORE_SECONDS["default"]
    assert all(quick[kind][0] < validate.compiled_constants()[kind][0] for kind in ("gdn2", "family"))


def test_a_family_case_is_costed_at_the_family_constants(monkeypatch):
    """A compiled kernel's GDN-2 and family cases each at the constants of their kind: doubling the family's doubles
    a family kernel's core-seconds and leaves a GDN-2 kernel's as they were."""
    def core_seconds(spec, warm):
        run = validate.ValidationRun([KernelSpec.parse(spec)], validate.ValidateOptions(cases="smoke"))
        [(_, _, mine)] = validate.kernel_cases(run)
        return validate.compiled_core_seconds(mine, warm)

    before = {(s, w): core_seconds(s, w) for s in ("gdn-factorized", "factorized") for w in (False, True)}
    constants = validate.compiled_constants()
    doubled = {**constants, "family": tuple(2 * x for x in constants["family"])}
    monkeypatch.setattr(validate, "compiled_constants", lambda: doubled)
    for warm in (False, True):
        assert core_seconds("gdn-factorized", warm) == pytest.approx(2 * before["gdn-factorized", warm])
        assert core_seconds("factorized", warm) == pytest.approx(before["factorized", warm])


@pytest.mark.parametrize("interpret, kind", [(None, "pallas-tpu"), ("auto", "pallas-tpu"), (True, "pallas-tpu"),
                                             ("tpu", "pallas-tpu"), ("xla", None)])
def test_our_pallas_kernels_in_the_tpu_interpreter_are_costed_by_their_work(interpret, kind):
    """On this CPU, Pallas's TPU interpreter runs our Pallas kernels (cold and warm alike): costed per token-head;
    ``interpret="xla"`` makes them compiled kernels. A kernel that is not ours is never this kind."""
    from gdn2_oracle.kernels import pallas

    fn = pallas.pallas_factorized(interpret=interpret)
    spec = KernelSpec("pallas-factorized", "pallas-factorized", {"interpret": interpret})
    assert validate.interpreted_kind(spec, fn) == kind
    other = KernelSpec("mine", "mod:fn", {})
    assert validate.interpreted_kind(other, SimpleNamespace(config="TileConfig", interpret=interpret)) is None
