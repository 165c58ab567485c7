"""The golden corpus itself: manifest and files agree, damage is detected, regeneration reproduces
the bytes, error estimates are negligible and the float64 recurrence agrees with every golden."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gdn2_oracle import golden, oracle
from gdn2_oracle.ci.grading.tolerance import normalised_error
from gdn2_oracle.ci.testing import DAMAGES
from gdn2_oracle.ci.testing import damage as damage_file
from gdn2_oracle.golden import catalogue
from gdn2_oracle.golden.load import (
    ARRAY_ORDER,
    DATA_DIR,
    FAMILY_SECTIONS,
    MANIFEST,
    decode,
    encode,
    family_names,
    read_manifest,
)
from gdn2_oracle.golden.regenerate import main as regenerate_main
from gdn2_oracle.oracle import RESULTS, recurrence, reductions
from gdn2_oracle.oracle.generate import DECAYS

NAMES = golden.names()
MANIFEST_DATA = read_manifest()


@pytest.fixture(scope="module")
def goldens():
    """Every golden, loaded (and hash-checked) once."""
    return {n: golden.load(n) for n in NAMES}


# --- (a) manifest, files and catalogue agree ----------------------------------------------

def test_manifest_lists_exactly_the_files_and_the_catalogue():
    files = sorted(p.stem for p in DATA_DIR.glob("*.npz"))
    others = sorted(p.name for p in DATA_DIR.iterdir() if p.suffix != ".npz")
    assert not others, f"unexpected files in {DATA_DIR}: {others}"
    # the mode and family goldens share the folder (golden/tests/test_mode_goldens.py, test_family_goldens.py)
    shared = golden.mode_names() + family_names()
    sections = ["cases", "mode_cases", *FAMILY_SECTIONS.values()]
    assert sorted(n for s in sections for n in MANIFEST_DATA.get(s, {})) == files, "manifest vs golden/data/*.npz"
    assert sorted(NAMES + shared) == files, "catalogues vs golden/data/*.npz"
    for name in NAMES:
        entry, case = MANIFEST_DATA["cases"][name], catalogue.get(name)
        assert entry["recipe"] == case.fields(), name
        assert entry["recipe_sha256"] == case.checksum(), name
        assert entry["generator_version"] == catalogue.GENERATOR_VERSION, name
        assert entry["precision_bits"] == catalogue.PRECISION_BITS, name
        assert entry["bytes"] == (DATA_DIR / f"{name}.npz").stat().st_size, name


def test_manifest_is_deterministic_json():
    from gdn2_oracle.golden.regenerate import manifest_text
    assert MANIFEST.read_text(encoding="utf-8") == manifest_text(MANIFEST_DATA)


def test_corpus_is_commit_sized():
    total = sum((DATA_DIR / f"{n}.npz").stat().st_size for n in NAMES + golden.mode_names())
    assert total <= 20e6, f"golden corpus is {total / 1e6:.1f} MB (> 20 MB)"


def test_catalogue_covers_the_required_regimes():
    cases = [c.recipe for c in catalogue.CASES]
    assert len(cases) >= 40
    assert {c.decay for c in cases} >= set(DECAYS)
    assert {c.gates for c in cases} >= {"uniform", "zero", "one", "erase_zero", "erase_one", "write_one", "negative"}
    lengths = {c.T for c in cases}
    for C in (16, 64):
        assert {1, C - 1, C, C + 1} <= lengths, C
        assert any(c.T > 2 * C and c.T % C for c in cases), f"no multi-chunk case with a tail for C={C}"
    assert any(c.K != c.V for c in cases)
    assert {c.initial_state for c in cases} == {False, True}
    assert None in {c.scale for c in cases} and any(c.scale is not None for c in cases)
    assert {c.reduction for c in cases} == {None, "kda", "gdn"}
    assert {c.precision for c in cases} >= {"float32", "bfloat16"}
    assert any(c.K == c.V == 128 for c in cases)
    assert any(c.gates in ("erase_zero", "zero") for c in cases)  # b = 0
    assert all(1 <= c.B <= 2 and 1 <= c.H <= 2 for c in cases)
    checksums = [c.checksum() for c in catalogue.CASES]
    assert len(set(checksums)) == len(checksums), "two cases share a recipe"


def test_a_bad_recipe_names_the_case_and_the_field():
    with pytest.raises(ValueError, match=r"^bad_case: decay: 'nope'"):
        catalogue._c("bad_case", (1, 4, 1, 8, 8), "", decay="nope")
    with pytest.raises(ValueError, match=r"^bad_case: T: expected an integer"):
        catalogue._c("bad_case", (1, 0, 1, 8, 8), "")
    with pytest.raises(ValueError, match="cot_seed"):  # a golden's cotangents use its data seed
        catalogue.Case("bad_case", oracle.Recipe(1, 4, 1, 8, 8, cot_seed=1))
    with pytest.raises(ValueError, match="^bad_case: HV"):  # grouped value heads: not in the corpus format
        catalogue.Case("bad_case", oracle.Recipe(1, 4, 1, 8, 8, HV=2))


def test_case_is_a_name_a_purpose_and_a_recipe():
    case = catalogue.get("kda_moderate")
    assert isinstance(case.recipe, oracle.Recipe) and case.recipe.reduction == "kda"
    assert catalogue.case_from_recipe(case.name, case.fields()).checksum() == case.checksum()
    p, do, dfs = case.build()
    q, _, _ = case.recipe.replace(reduction=None).build()
    np.testing.assert_array_equal(p.b, oracle.reductions.reduce(q, "kda").b)


def test_unknown_name_is_a_value_error():
    with pytest.raises(ValueError, match="no_such_case"):
        golden.load("no_such_case")


def test_loaded_golden_has_the_documented_arrays(goldens):
    required = set(ARRAY_ORDER) - {"initial_state"}
    for name, gd in goldens.items():
        case = gd.case.recipe
        assert required <= set(gd), name
        assert ("initial_state" in gd) == case.initial_state, name
        B, T, H, K, V = case.shape
        assert gd.shape == case.shape and gd["o"].shape == (B, T, H, V), name
        assert gd["dh0"].shape == gd["final_state"].shape == (B, H, K, V), name
        assert all(gd[n].dtype == np.float64 for n in gd), name
        p = gd.problem()
        assert p.shape == case.shape and p.scale == float(gd["scale"])
        if case.scale is not None:
            assert p.scale == case.scale
        else:
            assert p.scale == K ** -0.5


# --- (b) a corrupted, truncated or missing copy is detected ---------------------------------

def _smallest():
    return min(NAMES, key=lambda n: (DATA_DIR / f"{n}.npz").stat().st_size)


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_golden_is_detected(tmp_path, damage):
    name = _smallest()
    expected = MANIFEST_DATA["cases"][name]["sha256"]
    path = tmp_path / f"{name}.npz"
    shutil.copyfile(DATA_DIR / f"{name}.npz", path)
    golden.load(name, data_dir=tmp_path)  # an intact copy loads
    damage_file(path, damage)
    with pytest.raises(golden.GoldenError) as info:
        golden.load(name, data_dir=tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert name in msg and expected in msg, msg
    if damage != "missing":
        import hashlib
        assert hashlib.sha256(path.read_bytes()).hexdigest() in msg, msg


def test_stale_recipe_is_detected():
    name = _smallest()
    manifest = json.loads(json.dumps(MANIFEST_DATA))
    manifest["cases"][name]["recipe_sha256"] = "0" * 64
    with pytest.raises(golden.GoldenError, match=name):
        golden.load(name, manifest=manifest)


# --- (c) regeneration reproduces the stored bytes ---------------------------------------------

def test_regenerating_a_case_reproduces_its_bytes(tmp_path, capsys):
    name = min(NAMES, key=lambda n: catalogue.get(n).cost())
    assert regenerate_main(["--root", str(tmp_path), "--case", name]) == 0
    assert (tmp_path / "data" / f"{name}.npz").read_bytes() == (DATA_DIR / f"{name}.npz").read_bytes()
    fresh = read_manifest(tmp_path / "MANIFEST.json")["cases"][name]
    assert fresh == MANIFEST_DATA["cases"][name] | {"mpmath_version": fresh["mpmath_version"]}  # bytes, not provenance
    # Up to date: a second run skips it; --check passes on it.
    assert regenerate_main(["--root", str(tmp_path), "--case", name]) == 0
    assert "0 regenerated, 1 up to date" in capsys.readouterr().out
    assert regenerate_main(["--root", str(tmp_path), "--case", name, "--check"]) == 0
    # An altered stored value fails --check, naming the case and the array.
    path = tmp_path / "data" / f"{name}.npz"
    arrays = decode(path.read_bytes())
    arrays["dk"] = arrays["dk"].copy()
    arrays["dk"].flat[0] = np.nextafter(arrays["dk"].flat[0], np.inf)
    path.write_bytes(encode(arrays))
    capsys.readouterr()
    assert regenerate_main(["--root", str(tmp_path), "--case", name, "--check"]) == 1
    out = capsys.readouterr().out
    assert f"{name}: array 'dk' differs" in out, out


def test_encoding_round_trips_bytes():
    name = _smallest()
    data = (DATA_DIR / f"{name}.npz").read_bytes()
    assert encode(decode(data)) == data


# --- (d) error estimates --------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_error_estimate_is_negligible(goldens, name):
    gd = goldens[name]
    for r, err in gd.errors().items():
        ref = np.max(np.abs(gd[r]))
        assert err <= 1e-15 * ref or err == 0.0, f"{name}: {r} error estimate {err:.2e} vs max|{r}| {ref:.2e}"
    assert MANIFEST_DATA["cases"][name]["max_error_rel"] < 1e-15


# --- (e) the float64 recurrence agrees with every golden ------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_numpy_float64_oracle_agrees(goldens, name):
    gd = goldens[name]
    (o, S), grads = recurrence.forward_and_vjp(gd.problem(), *gd.cotangents())
    got = {"o": o, "final_state": S, **grads._asdict()}
    for r in RESULTS:
        err = normalised_error(got[r], gd[r])
        assert err <= 1e-12, f"{name}: {r} normalised error {err:.2e}"


def test_b_zero_goldens_match_the_closed_form(goldens):
    checked = 0
    for name, gd in goldens.items():
        p = gd.problem()
        if np.any(p.b != 0):
            continue
        o, S = reductions.gla_forward(p)
        assert normalised_error(o, gd["o"]) <= 1e-12, name
        assert normalised_error(S, gd["final_state"]) <= 1e-12, name
        checked += 1
    assert checked >= 2


def test_recipes_rebuild_the_stored_inputs(goldens):
    """The catalogue's recipe reproduces the stored inputs (and reductions/bf16 hold)."""
    for name, gd in goldens.items():
        p, do, dfs = gd.case.build()
        for n in oracle.INPUTS:
            np.testing.assert_array_equal(getattr(p, n), gd[n], err_msg=f"{name}: {n}")
        np.testing.assert_array_equal(do, gd["do"], err_msg=name)
        np.testing.assert_array_equal(dfs, gd["dfinal_state"], err_msg=name)
        recipe = gd.case.recipe
        if recipe.precision == "bfloat16":
            for n in oracle.INPUTS + ("do",):
                x = gd[n].astype(np.float32)
                assert np.all(x.view(np.uint32) & 0xFFFF == 0), f"{name}: {n} not bf16-representable"
        if recipe.reduction in ("kda", "gdn"):
            assert np.all(gd["b"] == gd["b"][..., :1]) and np.all(gd["w"] == gd["b"][..., :1]), name
        if recipe.reduction == "gdn":
            assert np.all(gd["g"] == gd["g"][..., :1]), name
        if recipe.decay == "resets":
            assert np.any(gd["g"] <= -500), f"{name}: no reset token"
