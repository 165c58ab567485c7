"""The family goldens (KDA and Gated DeltaNet calls, golden/family_catalogue.py): each family's manifest section,
files and catalogue agree, the other sections are left as they were, each file has the documented members and
rebuilds from its case, the error estimates are negligible, the float64 family oracle agrees, damage and stale
entries are refused, regeneration reproduces the committed bytes, and the judged-case builder hands a judge the
stored reference."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from gdn2_oracle import golden
from gdn2_oracle.ci.testing import DAMAGES
from gdn2_oracle.ci.testing import damage as damage_file
from gdn2_oracle.golden import catalogue, family_catalogue, mode_catalogue, regenerate
from gdn2_oracle.golden.load import (
    DATA_DIR,
    FAMILY_ARRAY_ORDER,
    FAMILY_EXTRA_RESULTS,
    FAMILY_RESULT_ARRAYS,
    FAMILY_SECTIONS,
    MODE_SECTION,
    SECTION,
    decode,
    encode,
    family_judged_cases,
    family_names,
    load_family,
    read_manifest,
)
from gdn2_oracle.oracle import call_modes, families, family_recipes

NAMES = family_names()
MANIFEST_DATA = read_manifest()
ARGS = ("q", "k", "v", "g", "beta")


@pytest.fixture(scope="module")
def goldens():
    """Every family golden, loaded (and hash-checked) once."""
    return {n: load_family(n) for n in NAMES}


# --- manifest, files and catalogue agree; the other sections are untouched ---------------------------------------

def test_each_family_section_lists_exactly_its_catalogue_cases():
    assert set(FAMILY_SECTIONS) == set(families.MAPPED)
    for family, sec in FAMILY_SECTIONS.items():
        entries = MANIFEST_DATA[sec]
        assert sorted(entries) == sorted(family_names(family)) and entries, sec
        for name, entry in entries.items():
            case = family_catalogue.get(name)
            assert case.family == family, name
            assert entry["recipe"] == case.fields() and entry["recipe_sha256"] == case.checksum(), name
            assert entry["generator_version"] == family_catalogue.GENERATOR_VERSION, name
            assert entry["precision_bits"] == catalogue.PRECISION_BITS, name
            data = (DATA_DIR / f"{name}.npz").read_bytes()
            assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest(), name
            assert entry["description"] == case.purpose, name
    assert MANIFEST_DATA["family_format"] == regenerate.FAMILY_FORMAT


def test_family_names_collide_with_no_other_case():
    """validate's ``--case NAME`` and the data folder need names unique across every catalogue and the recipes."""
    others = set(catalogue.names()) | set(mode_catalogue.names()) | set(family_recipes.names("full"))
    assert not set(NAMES) & others and len(set(NAMES)) == len(NAMES)
    assert all(n.startswith(family_catalogue.get(n).family + "_") for n in NAMES)


def test_a_manifest_without_family_cases_has_no_family_keys(tmp_path):
    """A corpus of the dense and mode sections alone is written exactly as before the family sections existed."""
    path = tmp_path / "MANIFEST.json"
    before = {SECTION: MANIFEST_DATA[SECTION], MODE_SECTION: MANIFEST_DATA[MODE_SECTION],
              "format": regenerate.FORMAT, "mode_format": regenerate.MODE_FORMAT}
    path.write_text(regenerate.manifest_text(before), encoding="utf-8")
    regenerate.update_manifest(path, lambda m: None)
    assert path.read_text(encoding="utf-8") == regenerate.manifest_text(before)


def test_the_catalogue_covers_both_families_and_every_flag():
    cases = family_catalogue.CASES
    for family in families.MAPPED:
        mine = [c for c in cases if c.family == family]
        assert {c.recipe.HV // c.recipe.H for c in mine} >= {2, 4}, family
        assert any(c.flags().get("use_beta_sigmoid_in_kernel") for c in mine), family
        assert any(c.flags().get("allow_neg_eigval") for c in mine), family
        assert any(c.flags().get("use_qk_l2norm_in_kernel") for c in mine), family
        assert any(c.decay_form is not None for c in mine), family
        assert {c.precision for c in mine} == {"float32", "bfloat16"}, family
    assert any(c.family == "gdn" and c.decay_form == "softplus" for c in cases)
    assert any(c.family == "kda" and c.decay_form == "bounded" and c.lower_bound == -5.0 for c in cases)
    assert all(c.cost() <= family_catalogue.MAX_COST for c in cases)  # a few seconds each at 256 (and 512) bits
    checksums = [c.checksum() for c in cases]
    assert len(set(checksums)) == len(checksums), "two family cases share a recipe"


def test_the_projected_goldens_are_the_family_projections_of_the_gdn2_goldens():
    """Each case named ``<family>_<GDN-2 golden>`` is that golden's family projection (``family_recipes.projections``
    over the catalogue, a reduction in its own family only), as ``validate``'s quick set projects it; one over
    MAX_COST is ``<family>_<GDN-2 golden>_g<G>``, the
    same recipe at the largest smaller G of GROUPS within MAX_COST; every projection is one of the two unless an
    earlier one of its family differs only in seed or it is over MAX_COST even at G = 1."""
    for family in families.MAPPED:
        recipes = [(c.name, c.recipe) for c in catalogue.CASES if c.recipe.reduction in (None, family)]
        projected = family_recipes.projections(family, recipes)
        mine = [c.name for c in family_catalogue.PROJECTED if c.family == family]
        assert set(mine) <= set(family_names(family)) and len(mine) >= 30
        assert {family_catalogue.get(n).precision for n in mine} == {"float32", "bfloat16"}
        seen = []
        for name, r in projected.items():
            reduced = [n for n in mine if n.startswith(name + "_g") and n[len(name) + 2:].isdigit()]
            if name in mine:
                assert family_catalogue.get(name).recipe == r and family_catalogue.get(name).decay_form is None
                assert not reduced, name
                seen.append(r.replace(seed=0))
            elif reduced:
                (case,) = map(family_catalogue.get, reduced)
                g, G = case.recipe.HV // r.H, r.HV // r.H
                assert case.recipe == r.replace(HV=r.H * g) and case.decay_form is None, name
                assert family_catalogue.FamilyGoldenCase(name, r).cost() > family_catalogue.MAX_COST, name
                larger = [x for x in family_recipes.GROUPS if g < x < G]  # each over MAX_COST: g is the largest
                assert all(family_catalogue.FamilyGoldenCase(name, r.replace(HV=r.H * x)).cost()
                           > family_catalogue.MAX_COST for x in larger), name
                seen.append(r.replace(seed=0))
            else:  # a seed's twin, or over MAX_COST even at G = 1 (two K = V = 128 cases)
                at_one = family_catalogue.FamilyGoldenCase(name, r.replace(HV=r.H)).cost()
                assert r.replace(seed=0) in seen or at_one > family_catalogue.MAX_COST, name
        every = family_recipes.projections(family, [(c.name, c.recipe) for c in catalogue.CASES])
        assert all(every[n] == family_catalogue.get(n).recipe for n in mine if n in every)  # judged as goldens


def test_a_bad_family_case_names_the_case_and_the_field():
    with pytest.raises(ValueError, match=r"^bad_case: beta: 'nope'"):
        family_catalogue._f("bad_case", "gdn", (1, 4, 1, 2, 4, 4), "", beta="nope")
    with pytest.raises(ValueError, match=r"^bad_case: decay_form: the bounded form is KDA's only"):
        family_catalogue._f("bad_case", "gdn", (1, 4, 1, 2, 4, 4), "", decay_form="bounded", lower_bound=-5.0)
    with pytest.raises(ValueError, match=r"^bad_case: lower_bound"):
        family_catalogue._f("bad_case", "kda", (1, 4, 1, 2, 4, 4), "", decay_form="bounded")
    with pytest.raises(ValueError, match=r"^bad_case: decay_form: 'nope'"):
        family_catalogue._f("bad_case", "kda", (1, 4, 1, 2, 4, 4), "", decay_form="nope")
    with pytest.raises(ValueError, match="no_such_case"):
        load_family("no_such_case")
    with pytest.raises(ValueError, match="^family: 'gdn2'"):
        family_names("gdn2")


# --- each file: the documented members, rebuilt from its case, negligible estimates, float64 agrees ---------------

@pytest.mark.parametrize("name", NAMES)
def test_a_family_golden_has_the_documented_members_and_rebuilds_from_its_case(goldens, name):
    gd = goldens[name]
    fcall, do, dfs = gd.case.build()
    stored = gd.call()
    assert list(gd) == [n for n in FAMILY_ARRAY_ORDER if n in gd], "members out of the documented order"
    assert all(gd[n].dtype == np.float64 for n in gd), name
    for n in (*ARGS, "initial_state", "A_log", "dt_bias"):
        a, b = getattr(fcall, n), getattr(stored, n)
        assert (a is None and b is None) or np.array_equal(a, b), f"{name}: {n}"
    for n in ("scale", "lower_bound", "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
              "use_gate_in_kernel"):
        assert getattr(stored, n) == getattr(fcall, n), f"{name}: {n}"
    assert stored.family is fcall.family and gd.family == gd.case.family and stored.shape == gd.shape
    np.testing.assert_array_equal(gd["do"], do, err_msg=name)
    np.testing.assert_array_equal(gd["dfinal_state"], dfs, err_msg=name)
    extra = {"dA_log": fcall.A_log is not None, "ddt_bias": fcall.dt_bias is not None}
    assert set(gd.reference()) == set(FAMILY_RESULT_ARRAYS) - {n for n in FAMILY_EXTRA_RESULTS if not extra[n]}
    assert set(gd.errors()) == set(gd.reference())
    for n, r in gd.reference().items():
        source = {"o": "v", "final_state": "initial_state", "dh0": "initial_state"}.get(n, n[1:])
        B, T, H, HV, K, V = gd.shape
        shape = (B, HV, K, V) if source == "initial_state" else getattr(fcall, source).shape
        assert r.shape == shape, f"{name}: {n}"
    if gd.precision == "bfloat16":
        for n in (*ARGS, "do"):
            assert np.all(gd[n].astype(np.float32).view(np.uint32) & 0xFFFF == 0), f"{name}: {n} not bf16"


@pytest.mark.parametrize("name", NAMES)
def test_family_error_estimates_are_negligible(goldens, name):
    """The 256-bit run keeps at least 192 bits of every result (its estimate against the 512-bit run)."""
    bound = 2.0 ** -(catalogue.PRECISION_BITS - 64)
    gd = goldens[name]
    for r, err in gd.errors().items():
        ref = float(np.max(np.abs(gd[r]), initial=0.0))
        assert err <= bound * ref, f"{name}: {r} estimate {err:.2e} vs max|{r}| {ref:.2e}"
    assert MANIFEST_DATA[FAMILY_SECTIONS[gd.family]][name]["max_error_rel"] <= bound


@pytest.mark.parametrize("name", NAMES)
def test_the_float64_family_oracle_agrees_with_every_family_golden(goldens, name):
    """``oracle.families.forward_and_vjp`` in float64 against the stored 256-bit results, relative to each result's
    largest magnitude: within 1e-12 (the float64 chain of a few dozen tokens is off by ~1e-15 on these calls)."""
    gd = goldens[name]
    fcall, (do, dfs) = gd.call(), gd.cotangents()
    (o, S), grads = families.forward_and_vjp(fcall, do, dfs, np.float64)
    got = {"o": o, "final_state": S, **grads._asdict()}
    for r, ref in gd.reference().items():
        err = float(np.max(np.abs(got[r] - ref))) / float(np.max(np.abs(ref)))
        assert err <= 1e-12, f"{name}: {r} error {err:.2e}"


# --- damage and stale entries are refused like a dense golden's ----------------------------------------------------

def _smallest():
    return min(NAMES, key=lambda n: (DATA_DIR / f"{n}.npz").stat().st_size)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_family_golden_is_refused(tmp_path, damage):
    name = _smallest()
    expected = MANIFEST_DATA[FAMILY_SECTIONS[family_catalogue.get(name).family]][name]["sha256"]
    path = tmp_path / f"{name}.npz"
    shutil.copyfile(DATA_DIR / f"{name}.npz", path)
    load_family(name, data_dir=tmp_path)  # an intact copy loads
    damage_file(path, damage)
    with pytest.raises(golden.GoldenError) as info:
        load_family(name, data_dir=tmp_path)
    msg = str(info.value)
    assert name in msg and expected in msg and f"gdn2-oracle golden regenerate --case {name}" in msg, msg


def test_a_stale_missing_or_misfiled_family_entry_is_refused():
    name = _smallest()
    sec = FAMILY_SECTIONS[family_catalogue.get(name).family]
    other = next(s for s in FAMILY_SECTIONS.values() if s != sec)
    manifest = json.loads(json.dumps(MANIFEST_DATA))
    manifest[sec][name]["recipe_sha256"] = "0" * 64
    with pytest.raises(golden.GoldenError, match=f"{name}.*stale.*golden regenerate --case {name}"):
        load_family(name, manifest=manifest)
    entry = manifest[sec].pop(name)
    with pytest.raises(golden.GoldenError, match=f"{name}.*not in the manifest"):
        load_family(name, manifest=manifest)
    for wrong in (other, SECTION, MODE_SECTION):  # an entry filed under another section is not this family's
        manifest[wrong][name] = entry
        with pytest.raises(golden.GoldenError, match="not in the manifest"):
            load_family(name, manifest=manifest)


def test_encoding_round_trips_a_family_golden_and_refuses_an_unpaired_estimate():
    name = next(n for n in NAMES if family_catalogue.get(n).decay_form is not None)
    data = (DATA_DIR / f"{name}.npz").read_bytes()
    arrays = decode(data)
    order = (FAMILY_ARRAY_ORDER, regenerate.FAMILY_OPTIONAL_ARRAYS)
    assert encode(arrays, *order) == data
    with pytest.raises(ValueError, match="unpaired"):
        encode({n: a for n, a in arrays.items() if n != "err_ddt_bias"}, *order)
    with pytest.raises(ValueError, match="unknown names"):  # the dense member list has no beta, no dbeta
        encode(arrays)


# --- regeneration reproduces the committed bytes -------------------------------------------------------------------

HAND_MADE = [n for n in NAMES if family_catalogue.get(n) not in family_catalogue.PROJECTED]


def _cheapest_per_family():
    """The cheapest hand-made case of each family (one of them has the in-kernel gate's dA_log, ddt_bias)."""
    return [min(set(family_names(f)) & set(HAND_MADE), key=lambda n: family_catalogue.get(n).cost())
            for f in families.MAPPED]


def test_regenerating_a_family_case_of_each_family_reproduces_its_bytes(tmp_path, capsys):
    root = tmp_path / "fresh"
    chosen = _cheapest_per_family()
    args = ["--root", str(root), "--jobs", "1"] + [a for n in chosen for a in ("--case", n)]
    assert regenerate.main(args) == 0
    fresh = read_manifest(root / "MANIFEST.json")
    for name in chosen:
        sec = FAMILY_SECTIONS[family_catalogue.get(name).family]
        assert (root / "data" / f"{name}.npz").read_bytes() == (DATA_DIR / f"{name}.npz").read_bytes(), name
        provenance = {"mpmath_version": fresh[sec][name]["mpmath_version"]}  # bytes, not the mpmath used
        assert fresh[sec][name] == MANIFEST_DATA[sec][name] | provenance
    assert fresh[SECTION] == {} and MODE_SECTION not in fresh and fresh["family_format"] == regenerate.FAMILY_FORMAT
    capsys.readouterr()
    assert regenerate.main(args) == 0
    assert "0 regenerated, 2 up to date" in capsys.readouterr().out
    name = next(n for n in chosen if family_catalogue.get(n).decay_form is not None)
    path = root / "data" / f"{name}.npz"
    arrays = decode(path.read_bytes())
    arrays["dbeta"] = arrays["dbeta"].copy()
    arrays["dbeta"].flat[0] = np.nextafter(arrays["dbeta"].flat[0], np.inf)
    path.write_bytes(encode(arrays, FAMILY_ARRAY_ORDER, regenerate.FAMILY_OPTIONAL_ARRAYS))
    capsys.readouterr()
    assert regenerate.main(["--root", str(root), "--case", name, "--check", "--jobs", "1"]) == 1
    assert f"{name}: array 'dbeta' differs" in capsys.readouterr().out


# The cases the slow check recomputes: the hand-made ones and one projected case per regime group (decay, gates,
# lengths, bf16), the families in turn (every one of the 78 would take ~5 minutes of CPU); the members test
# rebuilds every case's inputs and the float64 test checks every stored result.
RECOMPUTED = HAND_MADE + ["gdn_decay_extreme", "kda_gates_zero", "gdn_len_c64_x3_tail_extreme_g1", "kda_bf16_strong_h0"]


@pytest.mark.slow
def test_regenerating_a_sample_of_the_family_sections_reproduces_its_committed_files(tmp_path):
    """A sample of the family cases recomputed (:data:`RECOMPUTED`: ~25 s of CPU, up to a minute on a loaded
    machine): the committed files byte for byte."""
    root = tmp_path / "golden"
    shutil.copytree(DATA_DIR, root / "data")
    shutil.copy(DATA_DIR.parent / "MANIFEST.json", root / "MANIFEST.json")
    args = ["--root", str(root), "--check", "--jobs", "2"] + [a for n in RECOMPUTED for a in ("--case", n)]
    assert regenerate.main(args) == 0


def test_a_whole_catalogue_run_keeps_the_family_sections_and_prunes_them(tmp_path, capsys, monkeypatch):
    root = tmp_path / "golden"
    shutil.copytree(DATA_DIR, root / "data")
    shutil.copy(DATA_DIR.parent / "MANIFEST.json", root / "MANIFEST.json")
    manifest = read_manifest(root / "MANIFEST.json")
    sec = FAMILY_SECTIONS["kda"]
    manifest[sec]["kda_gone"] = dict(manifest[sec][family_names("kda")[0]])
    (root / "MANIFEST.json").write_text(regenerate.manifest_text(manifest), encoding="utf-8")
    monkeypatch.setattr(regenerate, "_run_all", lambda names, jobs, desc: iter(()))
    assert regenerate.main(["--root", str(root), "--check"]) == 1
    assert "kda_gone: in the manifest but not in the catalogue" in capsys.readouterr().out
    (root / "data" / "kda_gone.npz").write_bytes(b"x")
    assert regenerate.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "0 regenerated" in out and f"+ {len(NAMES)} family cases" in out
    assert "removed manifest entry of 'kda_gone'" in out and not (root / "data" / "kda_gone.npz").exists()
    assert (root / "MANIFEST.json").read_bytes() == (DATA_DIR.parent / "MANIFEST.json").read_bytes()


def test_golden_list_shows_the_family_cases(capsys):
    assert regenerate.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        assert f"family {family_catalogue.get(name).family}" in line, line


# --- what a judge is handed ----------------------------------------------------------------------------------------

def test_the_judged_cases_hand_over_the_stored_call_and_reference(goldens):
    cases = family_judged_cases()
    assert [c.name for c in cases] == NAMES
    assert [c.name for c in family_judged_cases(("gdn",), ("float32",))] == [
        n for n in family_names("gdn") if family_catalogue.get(n).precision == "float32"]
    for c in cases:
        gd = goldens[c.name]
        assert (c.dtype, c.shape, c.family) == (gd.precision, gd.shape, gd.family)
        assert c.flags == tuple(sorted(gd.flags()))
        for m in c.modes:  # a mode is listed exactly when the call sets one of its keywords
            assert set(call_modes.get(m).keywords) & set(c.flags), (c.name, m)
        assert ("use_gate_in_kernel" in c.flags) == any("use_gate_in_kernel" in call_modes.get(m).keywords
                                                        for m in c.modes)
        fcall, do, dfs = c.build()
        assert isinstance(fcall, families.FamilyCall) and fcall.family.name == c.family
        np.testing.assert_array_equal(fcall.beta, gd["beta"])
        np.testing.assert_array_equal(do, gd["do"])
        np.testing.assert_array_equal(dfs, gd["dfinal_state"])
        ref = c.reference()
        assert list(ref) == [n for n in FAMILY_RESULT_ARRAYS if n in gd]
        for n, a in ref.items():
            np.testing.assert_array_equal(a, gd[n])
        assert c.regime["purpose"] == gd.case.purpose
