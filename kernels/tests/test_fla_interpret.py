"""FLA's Triton chunk kernels on the CPU, in Triton's interpreter: ``fla-gdn2-chunk[interpret=1]`` and
``fla-kda-chunk[interpret=1,signature=gdn2]`` (kernels/fla_peers.py, kernels/triton_interpret.py; the KDA and GDN
kernels in their families' signatures: test_fla_family_peers.py).

Triton (``triton==3.9.0``, installed by ``make test``) is required: these tests never skip, a missing Triton
fails them with the install line. The interpreted kernels run in one subprocess (:func:`interpreted`):
``TRITON_INTERPRET=1`` must be set before Triton is imported and then holds for the whole process, which must
not leak into the other tests of a pytest worker (a compiled ``fla-*-chunk`` is refused where it is set).
Small problems only: the interpreter runs the kernels as NumPy, program by program (~5 s a case).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import sys
import types

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION
from gdn2_oracle.ci.testing import interpreted_script, once_per_run
from gdn2_oracle.kernels import triton_interpret
from gdn2_oracle.kernels.triton_interpret import ENV, LoopIndex

INSTALL = f"make test installs it; by hand: pip install --no-deps '{triton_interpret.TRITON_PIN}'"
GDN2 = "fla-gdn2-chunk[interpret=1]"
KDA = "fla-kda-chunk[interpret=1,signature=gdn2]"  # the GDN-2 contract (its default is the kda family's)
# Small float32 golden cases: K != V and two sequences, negative gates, one past a 16-token chunk, and
# extreme decay with an initial state (graded PRECISION: FLA forms exponents as differences of cumulative sums).
GOLDEN_MODERATE = ("kv_16x32", "gates_negative", "len_c16_plus1")
GOLDEN = (*GOLDEN_MODERATE, "decay_extreme_h0")
# Generated problems (Recipe(B, T, H, K, V, ...)): past FLA's 64-token chunk with a tail, a custom scale and an
# initial state; hard resets of the state (log-decays ~ -1e3) in two sequences.
GENERATED = {
    "gen_moderate_h0_T70": dict(shape=(1, 70, 1, 16, 8), decay="moderate", gates="uniform", initial_state=True,
                                scale=0.3, seed=3),
    "gen_resets_T40": dict(shape=(2, 40, 1, 8, 16), decay="resets", gates="erase_one", initial_state=False, seed=4),
}
KDA_GOLDEN = "kda_strong_h0"

SCRIPT = r"""
import json, os, sys
from gdn2_oracle import kernels
from gdn2_oracle.ci.running.cases import DenseCase
from gdn2_oracle.ci.grading.case import Case
from gdn2_oracle.ci.running import harness
from gdn2_oracle.oracle import Recipe

spec = json.loads(sys.argv[1])
out = {"env_before": os.environ.get("TRITON_INTERPRET"), "cases": {}}
gdn2 = kernels.get(spec["gdn2"])
out["env_after"] = os.environ.get("TRITON_INTERPRET")
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
out["tl_sum_interpreted"] = isinstance(tl.sum, InterpretedFunction)
out["device"] = str(gdn2.device)

def judge(fn, case):
    problem, do, dfs = case.data()
    report = case.judge(harness.kernel_results(fn, problem, do, dfs, dtype=case.dtype))
    return {"grade": report.grade, "kinds": sorted({f.kind for f in report.diagnosis}),
            "over": {v.name: v.grade for v in report.verdicts if not v.passed}}

for name in spec["golden"]:
    out["cases"][name] = judge(gdn2, Case.golden(name))
for name, r in spec["generated"].items():
    shape = r.pop("shape")
    out["cases"][name] = judge(gdn2, Case.from_recipe(name, Recipe(*shape, **r)))
bf16 = DenseCase.golden("bf16_moderate").run(gdn2)  # as gdn2-oracle validate runs a case
out["bf16"] = {"outcome": bf16.outcome, "error": bf16.error}
out["kda"] = judge(kernels.get(spec["kda"]), Case.golden(spec["kda_golden"]))
try:
    kernels.get("fla-gdn2-chunk")
    out["compiled"] = None
except ValueError as exc:
    out["compiled"] = str(exc)
import torch
out["cuda"] = torch.cuda.is_available()
print("RESULT " + json.dumps(out))
"""


def _triton_installed():
    return importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """The subprocess's findings: grades of the interpreted kernels, the bf16 refusal, the compiled name's (one run
    per pytest run: ci.testing.once_per_run)."""
    assert _triton_installed(), f"Triton is not installed: these tests need it; {INSTALL}"
    spec = {"gdn2": GDN2, "kda": KDA, "golden": GOLDEN, "generated": GENERATED, "kda_golden": KDA_GOLDEN}
    return once_per_run(tmp_path_factory, "fla_interpret", lambda _: interpreted_script(SCRIPT, spec, 900))[0]


def test_triton_is_installed():
    assert _triton_installed(), f"Triton is not installed; {INSTALL}"


def test_the_factory_sets_up_the_interpreter_before_triton_is_imported(interpreted):
    assert interpreted["env_before"] is None and interpreted["env_after"] == "1"
    assert interpreted["tl_sum_interpreted"], "triton's library functions must be interpreted ones"
    assert interpreted["device"] == "cpu"


@pytest.mark.parametrize("name", GOLDEN + tuple(GENERATED))
def test_interpreted_gdn2_chunk_matches_the_oracle(interpreted, name):
    """PASS, or PRECISION of the known kind (exponents as differences of float32 cumulative sums); never FAIL."""
    got = interpreted["cases"][name]
    assert got["grade"] in (PASS, PRECISION), got
    if got["grade"] == PRECISION:
        assert got["kinds"] == ["exponent-cancellation"], got
    assert FAIL not in got["over"].values(), got


def test_interpreted_gdn2_passes_outright_without_strong_decay(interpreted):
    """Where the decay is moderate there is no cancellation to excuse: those cases PASS outright."""
    moderate = (*GOLDEN_MODERATE, "gen_moderate_h0_T70")
    grades = {n: interpreted["cases"][n]["grade"] for n in moderate}
    assert grades == dict.fromkeys(moderate, PASS), grades


def test_interpreted_bf16_is_refused_with_the_reason(interpreted):
    bf16 = interpreted["bf16"]
    assert bf16["outcome"] == "error", bf16
    for part in ("fla-gdn2-chunk[interpret=1] refuses bfloat16", "tl.dot on bfloat16 operands", "--dtype float32"):
        assert part in bf16["error"], bf16


def test_interpreted_kda_chunk_matches_but_its_gates(interpreted):
    """As for FLA's KDA references: every result but db, dw (per-channel gates it cannot express) matches."""
    got = interpreted["kda"]
    assert set(got["over"]) == {"db", "dw"}, got


def test_compiled_name_is_refused_in_an_interpreting_process(interpreted):
    msg = interpreted["compiled"]
    if interpreted["cuda"]:
        assert msg is not None and f"{ENV}=1 is set in this process" in msg, msg
    else:
        assert msg is not None and "needs a CUDA device" in msg and "fla-gdn2-chunk[interpret=1]" in msg, msg


# --- in this process: nothing here imports triton or sets the variable ------------------------------------

@pytest.fixture
def no_interpreter(monkeypatch):
    """A process that has not asked for the interpreter; afterwards the variable must still be unset."""
    monkeypatch.delenv(ENV, raising=False)
    yield
    assert ENV not in os.environ, "a refused interpret=1 must not set TRITON_INTERPRET"


@pytest.mark.parametrize("name", [GDN2, KDA])
def test_interpret_without_triton_is_a_clear_value_error(monkeypatch, no_interpreter, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "triton" else real(n, *a))
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    with pytest.raises(ValueError, match=r"interpret: .* Triton is not installed; install Triton: pip install "
                                         r"--no-deps 'triton==3\.9\.0'"):
        kernels.get(name)


def test_triton_imported_without_the_interpreter_is_refused(monkeypatch, no_interpreter):
    """A Triton imported before without the internals the switch to the interpreter needs is refused (a real one is
    switched: kernels/tests/test_torch_bridge.py, test_interpret_on_a_torch_spec_*)."""
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))  # as if imported earlier
    monkeypatch.setitem(sys.modules, "triton.runtime", None)  # without the interpreter's internals
    with pytest.raises(ValueError, match=r"triton was already imported in this process without TRITON_INTERPRET=1 "
                                         r"and its loaded JIT functions cannot be switched"):
        kernels.get(GDN2)


@pytest.mark.parametrize("value", [2, "yes", 0.5])
def test_interpret_option_takes_0_or_1(no_interpreter, value):
    with pytest.raises(ValueError, match=r"^interpret: expected 0 or 1"):
        kernels.get("fla-gdn2-chunk", interpret=value)


def test_loop_index_shim_changes_nothing_but_adds_to():
    """Shim 2: the index is an int in every operation (results are plain ints), bools and others pass through."""
    i = LoopIndex(5)
    assert i == 5 and hash(i) == hash(5) and isinstance(i, int)
    assert type(i * 64) is int and type(i + 1) is int and list(range(i)) == [0, 1, 2, 3, 4]
    items = list(triton_interpret._loop_indices([0, 3, True, "x"]))
    assert [type(x) for x in items] == [LoopIndex, LoopIndex, bool, str] and items == [0, 3, True, "x"]


def test_autotuner_shim_keeps_the_config_with_the_largest_blocks():
    """Shim 1: the first config whose integer meta-parameters have the largest product; launch settings and flags
    (``num_warps``, a bool) do not count; no config left, none kept."""
    config = collections.namedtuple("Config", "kwargs num_warps")
    heads = [config({"BH": 1}, 1), config({"BH": 8}, 1), config({"BH": 8}, 4), config({"BH": 2}, 8)]
    assert triton_interpret.largest_blocks(heads) == [heads[1]]
    tiles = [config({"BK": 32, "BV": 16, "USE_G": True}, 8), config({"BK": 16, "BV": 64}, 1)]
    assert triton_interpret.largest_blocks(tiles) == [tiles[1]]
    assert triton_interpret.largest_blocks(iter(tiles[:1])) == tiles[:1] and triton_interpret.largest_blocks([]) == []


THREADS = r"""
import json, sys, threading
from gdn2_oracle.kernels import triton_interpret
triton_interpret.enable("test")
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter


@triton.jit
def _plus_one(x):
    return x + 1


@triton.jit
def _program_ids(out, N: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out + pid * N + tl.arange(0, N), _plus_one(tl.zeros([N], tl.int32) + pid))


def launch(programs):
    out = torch.zeros(programs * 16, dtype=torch.int32)
    _program_ids[(programs,)](out, N=16)
    return out


def in_two_threads(programs, rounds):
    expected = launch(programs)
    seen = {"equal": 0, "wrong": 0, "errors": []}

    def work():
        for _ in range(rounds):
            try:
                seen["equal" if torch.equal(launch(programs), expected) else "wrong"] += 1
            except Exception as exc:
                seen["errors"].append(repr(exc)[:200])

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


sys.setswitchinterval(1e-6)
shimmed = in_two_threads(64, 10)  # first, on an interpreter no race has touched
interpreter.GridExecutor.__call__ = interpreter.GridExecutor.__call__.__wrapped__
for attempt in range(1, 31):  # until the race shows (one to three tries on an idle host, more under load)
    unshimmed = in_two_threads(64, 10)
    if unshimmed["wrong"] or unshimmed["errors"]:
        break
unshimmed["attempts"] = attempt
print("RESULT " + json.dumps({"unshimmed": unshimmed, "shimmed": shimmed}))
"""


def test_interpreted_launches_from_two_threads_do_not_corrupt_each_other():
    """Shim 3: two threads launching one interpreted kernel (a program-id tile through a ``@triton.jit`` helper)
    10 times each, the GIL switched every microsecond: every result is the one-thread result and nothing raises.
    The same without the shim (``GridExecutor.__call__.__wrapped__``) gives wrong tiles or "Did you forget to add
    @triton.jit ?" (in 10 of 12 first tries here, 4 side by side), so this run can tell the two apart."""
    assert _triton_installed(), f"Triton is not installed: this test needs it; {INSTALL}"
    got = interpreted_script(THREADS, {}, timeout=300)
    assert got["unshimmed"]["wrong"] + len(got["unshimmed"]["errors"]) > 0, got  # the race this test guards
    assert got["shimmed"] == {"equal": 20, "wrong": 0, "errors": []}, got


PATCHES = r"""
import json, os
import numpy as np
os.environ["TRITON_INTERPRET"] = "1"
import triton
import triton.language as tl
from triton.runtime import interpreter
original, made = interpreter._patch_lang, []


def counted(fn):
    made.append(fn.__name__)
    return original(fn)


interpreter._patch_lang = counted  # every patch the interpreter makes; the shim wraps it
import torch
from gdn2_oracle import kernels
from gdn2_oracle.kernels import triton_interpret
triton_interpret.enable("test")
kda = kernels.get("fla-kda-chunk[interpret=1]")  # made once: a second enable() would install the shim again
assert interpreter._patch_lang.__wrapped__ is counted


@triton.jit
def _scaled(x):
    return x * 2.0


@triton.jit
def _tile(out, N: tl.constexpr):
    pid = tl.program_id(0)
    x = tl.arange(0, N).to(tl.float32) + pid
    y = tl.cumsum(_scaled(x), 0) + tl.sum(x, 0)  # device functions seeing tl (here) and tl.core (standard.py)
    tl.store(out + pid * N + tl.arange(0, N), y)


def tile():
    out = torch.zeros(8 * 16)
    _tile[(8,)](out, N=16)
    return out.numpy()


def fla(kernel, seed):  # FLA's KDA kernel on a small call: its output, final state and gradients
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    B, T, H, K = 1, 20, 2, 16
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32) for _ in range(3))
    g = jnp.asarray(-rng.uniform(0.01, 0.3, (B, T, H, K)), jnp.float32)
    beta = jnp.asarray(rng.uniform(0, 1, (B, T, H)), jnp.float32)
    out, pull = jax.vjp(lambda *x: kernel(*x, output_final_state=True), q, k, v, g, beta)
    return [np.asarray(x) for x in (*out, *pull(out))]


def run():  # the results, then the patches made by the tile's launch and by FLA's
    del made[:]
    got = [tile()]
    tiled = list(made)
    got += fla(kda, 1)
    return got, tiled, made[len(tiled):]


shimmed_got, *shimmed_made = run()
interpreter._patch_lang = counted
plain_got, *plain_made = run()
print("RESULT " + json.dumps({"shim": shimmed_made, "plain": plain_made,
                              "equal": all(np.array_equal(a, b) for a, b in zip(shimmed_got, plain_got))}))
"""


def test_interpreted_launch_patches_the_language_once_per_module_with_the_same_results():
    """Shim 4: a kernel of 8 programs, each calling a device function of its own module (which sees ``tl``) and
    two of ``triton/language/standard.py`` (which see ``tl.core``), then FLA's KDA chunk kernel (forward and
    backward): the same results bit for bit with the shim and without it, and ``triton.language`` patched once per
    launch and module with it (the launch's own patch of ``tl``, then the first device call's of ``tl.core``) instead
    of once per device call and program."""
    assert _triton_installed(), f"Triton is not installed: this test needs it; {INSTALL}"
    got = interpreted_script(PATCHES, {}, timeout=300)
    assert got["equal"], got
    (shim, shim_fla), (plain, plain_fla) = ([collections.Counter(p) for p in got[k]] for k in ("shim", "plain"))
    assert plain["_scaled"] == plain["sum"] == plain["cumsum"] == 8, plain  # one each per program
    assert shim["_tile"] == plain["_tile"] == 1 and shim["cumsum"] == 1 and shim["sum"] == shim["_scaled"] == 0, shim
    assert sum(shim_fla.values()) < sum(plain_fla.values()) / 2, (shim_fla, plain_fla)
