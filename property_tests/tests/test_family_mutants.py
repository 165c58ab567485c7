"""The family properties (``property_tests/test_families.py``, the GDN-2 properties through the family lens in
``test_family_properties.py`` and ``test_family_golden.py``) through the plugin, as a kernel author runs them: each
mutant of ``kernels/testing_families.py`` fails them in both families, our ``gdn-factorized`` and ``kda-factorized``
and FLA's ``fla-gdn-naive-recurrent`` pass, a kernel's family is read as ``validate`` reads it (a spec option, its
attribute; a beta signature without either is a usage error), a family kernel's GDN-2 properties are deselected for
their family-lens versions and a GDN-2 kernel's family properties skipped with the reason.

Each test runs pytest in a subprocess from a temporary directory outside the repository.
"""

from __future__ import annotations

import hashlib
import re

import pytest

from gdn2_oracle.ci.testing import once_per_run, pytest_run
from gdn2_oracle.kernels.testing_families import MUTANTS

SUITE = "gdn2_oracle.property_tests"
FAMILY_PROPERTIES = f"{SUITE}.test_families"
FAMILY_LENS = f"{SUITE}.test_family_properties"
FAMILY_GOLDENS = f"{SUITE}.test_family_golden"
ORACLE = "test_family_kernel_matches_the_oracle"
MODE_CALL = "test_family_mode_call_matches_the_oracle"
GOLDEN = "test_family_kernel_matches_golden"

# mutant -> (the -k expression of the property that catches it, what reaches the bug, its module)
CAUGHT_BY = {
    "gva_modulo": (ORACLE, "H = 2 key heads with G = 2", FAMILY_PROPERTIES),
    "beta_write_only": (ORACLE, "any beta below 1 with a state to erase", FAMILY_PROPERTIES),
    "read_before_decay": (ORACLE, "a decaying state", FAMILY_PROPERTIES),
    "sigmoid_twice": (ORACLE, "beta logits", FAMILY_PROPERTIES),
    "no_neg_eigval": (ORACLE, "beta logits with negative eigenvalues", FAMILY_PROPERTIES),
    # the softplus gate's dt_bias: the recipe in the structure of the softplus gate's training-call recipe. A test
    # id ends in "-<recipe>]" and holds the kernel's spec too (whose name says "softplus" or "bf16"), so each -k
    # expression names the ids' recipe part ("_gate_softplus]"; "-gdn_bf16", "-kda_bf16", "bf16]"): the other
    # recipes are not run.
    "dt_bias_after_softplus": (f"{MODE_CALL} and _gate_softplus]", "the in-kernel softplus gate", FAMILY_PROPERTIES),
    # the cumulative decay in bf16: the bfloat16 goldens (GDN's hard resets, KDA's softplus gate)
    "bf16_decay": (f"{GOLDEN} and (-gdn_bf16 or -kda_bf16 or bf16])", "a bfloat16 call with a strong decay",
                   FAMILY_GOLDENS),
    # the gate on the zero tokens padding T to 64: the gated goldens are the hand-made ones (GVA in their names), each
    # with T % 64 != 0 (its final state is off)
    "padded_tail_gate": (f"{GOLDEN} and gva", "the in-kernel gate with T not a multiple of 64", FAMILY_GOLDENS),
}
# The lens properties (test_family_properties.py) that catch a mutant besides: the head map by G = 1 with q, k
# repeated and by the head permutations.
LENS_CAUGHT_BY = {"gva_modulo": "test_family_reductions or test_family_batch_and_head_permutation"}
# Three in the normal group (one per family and per module); the others in the release group.
QUICK = {("gdn", "beta_write_only"), ("kda", "dt_bias_after_softplus"), ("gdn", "padded_tail_gate")}

WRAPPED = '''"""A Gated DeltaNet kernel in FLA's signature that does not say its family (no ``family`` attribute)."""
from gdn2_oracle import kernels

_inner = kernels.get("gdn-factorized")


def fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
       use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    return _inner(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
'''


def test_every_mutant_has_a_catching_property():
    assert set(MUTANTS) <= set(CAUGHT_BY)


def _mutant_params(caught_by):
    for family in ("gdn", "kda"):
        for name in sorted(set(MUTANTS) & set(caught_by)):  # a mutant is judged once kernels/testing_families has it
            marks = () if (family, name) in QUICK else (pytest.mark.slow,)
            yield pytest.param(family, name, marks=marks, id=f"{family}_{name}")


def _spec(family, name):
    return f"gdn2_oracle.kernels.testing_families:{family}_{name}"


def _batch(request, tmp_path_factory, module, clause):
    """``(exit code, output, specs)`` of one plugin run of ``module`` on the mutants of the selected tests of this
    test's function that ``module`` judges (``specs``), each on its own property (``clause(name)``, one ``-k`` clause
    with its spec's name): one pytest start-up and collection for them all, once per pytest run."""
    test = request.node.originalname
    mutants = sorted({(i.callspec.params["family"], i.callspec.params["name"]) for i in request.session.items
                      if getattr(i, "originalname", None) == test and i.module is request.module})
    mutants = [(family, name) for family, name in mutants if _module(test, name) == module]
    specs = [_spec(family, name) for family, name in mutants]
    chosen = " or ".join(f"({clause(name)} and {family}_{name})" for family, name in mutants)
    key = hashlib.sha256(f"{module}|{','.join(specs)}|{chosen}".encode()).hexdigest()[:16]

    def run(folder):
        return pytest_run(folder, "--pyargs", module, "--gdn2-kernel", ",".join(specs), "-k", chosen, "-q",
                          timeout=1800)

    (code, out), _ = once_per_run(tmp_path_factory, f"family-mutants-{key}", run)
    return code, out, specs


def _module(test, name):
    """The property module that ``test`` runs on mutant ``name``."""
    return FAMILY_LENS if test == "test_the_family_lens_fails_the_family_mutant" else CAUGHT_BY[name][2]


def _id_of(spec):
    """A pattern of ``spec``'s test ids: the spec, then the id's end or its recipe part."""
    return re.escape(spec) + r"[\]-]"


def _judged(code, out, specs, spec):
    """The FAILED lines of ``spec`` in a batched run's output ``out`` and the failure sections of its tests; the run
    failed (exit 1) and only on the batch's mutants."""
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert code == 1 and all(any(re.search(_id_of(s), line) for s in specs) for line in failed), out
    body = re.split(r"^=+ short test summary info =+$", out, flags=re.M)[0]
    parts = re.split(r"^_+ (\S+) _+$", body, flags=re.M)  # a long id gets one underscore each side
    sections = [head + "\n" + text for head, text in zip(parts[1::2], parts[2::2]) if re.search(_id_of(spec), head)]
    return [line for line in failed if re.search(_id_of(spec), line)], "\n".join(sections)


@pytest.mark.parametrize("family,name", list(_mutant_params(CAUGHT_BY)))
def test_the_plugin_fails_the_family_mutant(request, tmp_path_factory, family, name, record_property):
    """``pytest --pyargs gdn2_oracle.property_tests.<module> --gdn2-kernel gdn2_oracle.kernels.testing_families:
    <family>_<mutant>``: the property that reaches the bug fails (graded FAIL, with the recipe and a reproduction, or
    the golden's name); the mutant's family is its attribute, so the spec needs no option. The selected mutants of one
    module share one plugin run (``_batch``), each judged on its own property's tests and failure sections."""
    spec = _spec(family, name)
    prop, reached_by, module = CAUGHT_BY[name]
    failed, section = _judged(*_batch(request, tmp_path_factory, module, lambda n: CAUGHT_BY[n][0]), spec)
    record_property("family_mutant", {"property": prop, "reached_by": reached_by, "failed": failed})
    function = prop.split(" and ")[0]
    assert failed and all(f"::{function}[" in line for line in failed), failed
    if module == FAMILY_GOLDENS:
        assert "graded FAIL" in section and f"on family golden '{family}_" in section, section
    else:
        assert ("graded FAIL" in section and f"FamilyRecipe(family={family!r}" in section
                and "reproduce: python -c" in section), section


@pytest.mark.parametrize("family,name", list(_mutant_params(LENS_CAUGHT_BY)))
def test_the_family_lens_fails_the_family_mutant(request, tmp_path_factory, family, name):
    """The GDN-2 properties through the family lens catch a head-map mutant too: each listed property fails it, graded
    FAIL against the kernel's own results on the transformed call, with the recipe and a reproduction."""
    spec = _spec(family, name)
    failed, section = _judged(*_batch(request, tmp_path_factory, FAMILY_LENS, lambda n: f"({LENS_CAUGHT_BY[n]})"),
                              spec)
    props = LENS_CAUGHT_BY[name].split(" or ")
    assert all(any(f"::{p}[" in line for line in failed) for p in props), failed
    assert "graded FAIL" in section and "(tight agreement)" in section and "reproduce: python -c" in section, section


@pytest.mark.slow
def test_the_plugin_passes_our_family_kernels(tmp_path):
    """gdn-factorized and kda-factorized (registered names) pass every family property, and a Gated DeltaNet kernel
    whose family is the spec option (``mod:fn[family=gdn]``, gdn-factorized wrapped) the oracle property."""
    (tmp_path / "famkernel.py").write_text(WRAPPED)
    specs = "gdn-factorized,kda-factorized,famkernel:fn[family=gdn]"
    # the wrapped kernel (gdn-factorized under another name) on the drawn calls; its mode calls are gdn-factorized's
    chosen = ["-k", f"not famkernel or {ORACLE}"]
    code, out = pytest_run(tmp_path, "--pyargs", FAMILY_PROPERTIES, "--gdn2-kernel", specs, *chosen, "-q", "-rA")
    ids = [line.split("::", 1)[1] for line in out.splitlines() if line.startswith("PASSED ") and "::" in line]
    assert code == 0 and f"{len(ids)} passed" in out and "skipped" not in out, out  # every test it ran passed
    assert {f"{ORACLE}[{s}]" for s in specs.split(",")} <= set(ids), out
    assert any(i.startswith(MODE_CALL) and "[gdn-factorized-" in i for i in ids), ids


# The family goldens the lens run takes: the hand-made ones (GVA in their names) and one projection of GDN-2's goldens
# per regime group (decay, gates, lengths, bf16) in each family; validate --cases golden runs every one on our family
# kernels (ci/tests/test_families_validate.py).
SAMPLED_GOLDENS = ("gva", "decay_extreme", "gates_zero", "len_c64_x3_tail_extreme", "bf16_strong_h0")


@pytest.mark.slow
def test_the_family_lens_passes_our_family_kernels_and_flas(tmp_path):
    """gdn-factorized, kda-factorized and FLA's fla-gdn-naive-recurrent pass every GDN-2 property through the family
    lens and a sample of the family goldens of their family (no false alarm); none of those tests is skipped."""
    specs = "gdn-factorized,kda-factorized,fla-gdn-naive-recurrent"
    sample = f"not {GOLDEN} or " + " or ".join(SAMPLED_GOLDENS)
    code, out = pytest_run(tmp_path, "--pyargs", FAMILY_LENS, FAMILY_GOLDENS, "--gdn2-kernel", specs, "-k", sample,
                           "-q", "-rs", timeout=3600)
    assert code == 0 and " passed" in out and "failed" not in out and "skipped" not in out, out


LENSED = "GDN-2 properties deselected for {!r} (a gdn family kernel): their family-lens versions judge it"


def test_a_family_kernel_runs_the_family_lens_instead_of_the_gdn2_properties(tmp_path):
    """``--gdn2-kernel gdn-factorized`` on a GDN-2 golden: deselected (its family-lens version runs instead), a line
    saying so; no test ran, so the run is EMPTY (exit 5), not a pass. The family lens's state carry is collected."""
    code, out = pytest_run(tmp_path, "--pyargs", SUITE, "--gdn2-kernel", "gdn-factorized", "-k",
                           "test_kernel_matches_golden and len_1", "-rs", "-q")
    # (pytest's count of deselected tests includes those -k left out: the plugin's own line says what it deselected)
    assert code == 5 and " deselected" in out and "passed" not in out and "skipped" not in out, out
    assert LENSED.format("gdn-factorized") in out, out
    code, out = pytest_run(tmp_path, "--pyargs", SUITE, "--gdn2-kernel", "gdn-factorized", "--collect-only", "-q")
    ids = [line.split("::", 1)[1] for line in out.splitlines() if "::" in line]
    assert code == 0 and "test_family_state_carry[gdn-factorized-split2]" in ids, out
    assert not [i for i in ids if i.startswith(("test_kernel_matches_golden[", "test_state_carry["))], ids


def test_a_gdn2_kernel_is_skipped_by_the_family_properties_with_the_reason(tmp_path):
    code, out = pytest_run(tmp_path, "--pyargs", FAMILY_PROPERTIES, "--gdn2-kernel", "pairwise", "-k", ORACLE,
                           "-rs", "-q")
    assert code == 5 and "1 skipped" in out, out
    assert "kernel 'pairwise' is a gdn2 kernel (the plain contract): judged by the GDN-2 properties" in out, out


def test_the_family_of_a_kernel_is_the_spec_option(tmp_path):
    """``mod:fn[family=gdn]``: the option is taken out of the spec (never passed to the kernel), the family properties
    are collected for it under the spec as given and the GDN-2 ones deselected; the other family's recipes are
    deselected."""
    (tmp_path / "famkernel.py").write_text(WRAPPED)
    spec = "famkernel:fn[family=gdn]"
    code, out = pytest_run(tmp_path, "--pyargs", SUITE, "--gdn2-kernel", spec, "-k",
                           "test_kernel_matches_golden and len_1", "-rs", "-q")
    assert code == 5 and "passed" not in out and LENSED.format(spec) in out, out
    code, out = pytest_run(tmp_path, "--pyargs", FAMILY_PROPERTIES, "--gdn2-kernel", spec, "--collect-only", "-q")
    ids = [line.split("::", 1)[1] for line in out.splitlines() if "::" in line]
    assert code == 0 and f"{ORACLE}[{spec}]" in ids, out
    mode_ids = [i for i in ids if i.startswith(MODE_CALL)]
    assert mode_ids and all(f"[{spec}-gdn_" in i for i in mode_ids), ids


def test_a_beta_signature_kernel_without_its_family_is_a_usage_error(tmp_path):
    (tmp_path / "famkernel.py").write_text(WRAPPED)
    code, out = pytest_run(tmp_path, "--pyargs", FAMILY_PROPERTIES, "--gdn2-kernel", "famkernel:fn", "--collect-only",
                           "-q")
    errors = [line for line in out.splitlines() if "UsageError" in line]
    assert code == 4 and errors and "'famkernel:fn': family: " in out and "family=gdn" in out, out
