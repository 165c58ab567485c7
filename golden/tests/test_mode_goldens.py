"""The mode goldens (training calls, golden/mode_catalogue.py): manifest section, files and catalogue agree, the
dense corpus is left as it was, damage and stale recipes are refused, regeneration reproduces the bytes, the float64
oracle agrees with every case, and ``validate --cases golden`` judges them (a correct kernel passes, a mutant
fails)."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from gdn2_oracle import golden
from gdn2_oracle.ci.testing import DAMAGES
from gdn2_oracle.ci.testing import damage as damage_file
from gdn2_oracle.golden import catalogue, mode_catalogue, regenerate
from gdn2_oracle.golden.load import (
    ARRAY_ORDER,
    DATA_DIR,
    MODE_ARRAY_ORDER,
    MODE_EXTRA_RESULTS,
    MODE_RESULT_ARRAYS,
    MODE_SECTION,
    SECTION,
    decode,
    encode,
    read_manifest,
)
from gdn2_oracle.oracle import INPUTS, mode_recipes, modes
from gdn2_oracle.oracle.mode_recipes import FLA_CHUNK, MODES

NAMES = golden.mode_names()
MANIFEST_DATA = read_manifest()
EPS64 = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def goldens():
    """Every mode golden, loaded (and hash-checked) once."""
    return {n: golden.load_mode(n) for n in NAMES}


# --- manifest, files and catalogue agree; the dense corpus is untouched ------------------------------------------

def test_mode_section_lists_exactly_the_mode_catalogue():
    entries = MANIFEST_DATA[MODE_SECTION]
    assert sorted(entries) == sorted(NAMES)
    for name in NAMES:
        entry, case = entries[name], mode_catalogue.get(name)
        assert entry["recipe"] == case.fields(), name
        assert entry["recipe_sha256"] == case.checksum(), name
        assert entry["generator_version"] == mode_catalogue.GENERATOR_VERSION, name
        assert entry["precision_bits"] == catalogue.PRECISION_BITS, name
        assert entry["bytes"] == (DATA_DIR / f"{name}.npz").stat().st_size, name
        assert entry["description"] == case.purpose, name
    assert MANIFEST_DATA["mode_format"] == regenerate.MODE_FORMAT


def test_mode_names_collide_with_no_other_case():
    """validate's ``--case NAME`` and the data folder need names unique across the dense goldens and the recipes."""
    others = set(catalogue.names()) | set(mode_recipes.names("full"))
    assert not set(NAMES) & others
    assert len(set(NAMES)) == len(NAMES)


def test_the_dense_corpus_is_unchanged_by_the_mode_section():
    """Every dense entry still matches its file (sha256, size, the dense member list), the dense format line is the
    one dense files were written with, and a corpus without mode cases is written without a mode section."""
    for name in catalogue.names():
        entry = MANIFEST_DATA[SECTION][name]
        data = (DATA_DIR / f"{name}.npz").read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"], name
        assert entry["generator_version"] == catalogue.GENERATOR_VERSION, name
        has_h0 = entry["recipe"]["initial_state"]
        assert list(decode(data)) == [n for n in ARRAY_ORDER if n != "initial_state" or has_h0], name
    assert MANIFEST_DATA["format"] == regenerate.FORMAT
    assert not set(MANIFEST_DATA[SECTION]) & set(NAMES)


def test_a_dense_only_manifest_has_no_mode_keys(tmp_path):
    path = tmp_path / "MANIFEST.json"
    dense = {SECTION: dict(MANIFEST_DATA[SECTION])}
    path.write_text(regenerate.manifest_text({**dense, "format": regenerate.FORMAT}), encoding="utf-8")
    regenerate.update_manifest(path, lambda m: None)  # a read-modify-write of a dense-only corpus
    written = json.loads(path.read_text(encoding="utf-8"))
    assert set(written) == {SECTION, "format"}
    assert path.read_text(encoding="utf-8") == regenerate.manifest_text({**dense, "format": regenerate.FORMAT})


def test_the_catalogue_covers_every_mode():
    cases = [c.recipe for c in mode_catalogue.CASES]
    assert 6 <= len(cases) <= 12
    assert set().union(*(r.modes for r in cases)) == set(MODES)
    for mode in MODES:  # each mode alone (a kernel accepting only it is judged) or with varlen
        assert any(set(r.modes) <= {mode, "varlen"} and mode in r.modes for r in cases), mode
    C = FLA_CHUNK
    assert any({0, 1, C - 1, C, C + 1} <= set(r.lengths) and r.packed for r in cases)
    assert any(r.gate == "bounded" and r.lower_bound == -5.0 for r in cases)
    assert any(r.gate == "softplus" for r in cases)
    assert any(r.qk_l2norm and r.near_zero for r in cases)
    assert any(r.state_v_first and r.K != r.V for r in cases)
    assert any(r.intermediate_chunk_size == C and max(r.lengths) > C for r in cases)
    assert any(set(r.modes) == set(MODES) for r in cases)
    assert {r.precision for r in cases} == {"float32", "bfloat16"}
    assert all(r.shape[1] <= 4 * C and max(r.K, r.V) <= 16 and r.H <= 2 for r in cases)  # golden-affordable
    checksums = [c.checksum() for c in mode_catalogue.CASES]
    assert len(set(checksums)) == len(checksums), "two mode cases share a recipe"


def test_a_bad_mode_recipe_names_the_case_and_the_field():
    with pytest.raises(ValueError, match=r"^bad_case: gate: 'nope'"):
        mode_catalogue._m("bad_case", 1, 8, 8, (3,), "", gate="nope")
    with pytest.raises(ValueError, match="cot_seed"):
        mode_catalogue.ModeGoldenCase("bad_case", mode_recipes.ModeRecipe(1, 8, 8, (3,), cot_seed=1))
    with pytest.raises(ValueError, match="no mode"):  # a dense call belongs in the dense catalogue
        mode_catalogue.ModeGoldenCase("bad_case", mode_recipes.ModeRecipe(1, 8, 8, (3,), packed=False))
    with pytest.raises(ValueError, match="no_such_case"):
        golden.load_mode("no_such_case")


# --- each file: the documented members, rebuilt from its recipe, negligible estimates --------------------------

@pytest.mark.parametrize("name", NAMES)
def test_a_mode_golden_has_the_documented_members_and_rebuilds_from_its_recipe(goldens, name):
    gd = goldens[name]
    recipe = gd.case.recipe
    call, do, dfs = recipe.build()
    stored = gd.call()
    assert list(gd) == [n for n in MODE_ARRAY_ORDER if n in gd], "members out of the documented order"
    assert all(gd[n].dtype == np.float64 for n in gd), name
    for n in (*INPUTS, "initial_state", "A_log", "dt_bias", "cu_seqlens"):
        a, b = getattr(call, n), getattr(stored, n)
        assert (a is None and b is None) or np.array_equal(a, b), f"{name}: {n}"
    assert (stored.scale, stored.lower_bound, stored.gate_in_kernel, stored.qk_l2norm, stored.state_v_first,
            stored.intermediate_chunk_size) == (call.scale, call.lower_bound, call.gate_in_kernel, call.qk_l2norm,
                                                call.state_v_first, call.intermediate_chunk_size), name
    np.testing.assert_array_equal(gd["do"], do, err_msg=name)
    np.testing.assert_array_equal(gd["dfinal_state"], dfs, err_msg=name)
    extra = {"intermediate_states": call.intermediate_chunk_size is not None, "dA_log": call.A_log is not None,
             "ddt_bias": call.dt_bias is not None}
    assert set(gd.reference()) == set(MODE_RESULT_ARRAYS) - {n for n in MODE_EXTRA_RESULTS if not extra[n]}
    assert set(gd.errors()) == set(gd.reference())
    assert gd["final_state"].shape == gd["dh0"].shape == call.state_shape
    assert gd.modes == recipe.modes
    if recipe.precision == "bfloat16":
        for n in (*INPUTS, "do"):
            assert np.all(gd[n].astype(np.float32).view(np.uint32) & 0xFFFF == 0), f"{name}: {n} not bf16"


@pytest.mark.parametrize("name", NAMES)
def test_mode_error_estimates_are_negligible(goldens, name):
    """The 256-bit run keeps at least 192 bits of every result (its estimate against the 512-bit run): far more
    than the 53 of the float64 it is rounded to."""
    bound = 2.0 ** -(catalogue.PRECISION_BITS - 64)
    gd = goldens[name]
    for r, err in gd.errors().items():
        ref = float(np.max(np.abs(gd[r]), initial=0.0))
        assert err <= bound * ref, f"{name}: {r} estimate {err:.2e} vs max|{r}| {ref:.2e}"
    assert MANIFEST_DATA[MODE_SECTION][name]["max_error_rel"] <= bound


def float64_bound(recipe):
    """First-order bound on the float64 pipeline's error, relative to a result's scale.

    A rounded sum of n terms is off by at most ``n eps/2`` times the sum of the terms' magnitudes (Higham's
    gamma_n). Every result is reached through at most ``L + 1`` token steps forward and as many back (L the
    longest sequence), each a K-term read, a V-term update and a handful of elementwise operations (decay, gates,
    exp, the norm and the gate's pre-activation: at most 8 more), so ``n <= 2 (L + 1)(K + V + 8)``; ``dA_log``
    and ``ddt_bias`` sum at most ``B T K`` token terms. The scale the errors are divided by (max |result|, or for
    ``dg``, ``dA_log``, ``ddt_bias`` the envelope of their terms, as the judge's) bounds those magnitudes."""
    B, T, H, K, V = recipe.shape
    n = max(2 * (max(recipe.lengths) + 1) * (K + V + 8), B * T * K)
    return n * EPS64 / 2


@pytest.mark.parametrize("name", NAMES)
def test_the_float64_oracle_agrees_with_every_mode_golden(goldens, name):
    from gdn2_oracle.ci.grading import modes as grading
    from gdn2_oracle.ci.grading.rule import scales

    gd = goldens[name]
    call, (do, dfs) = gd.call(), gd.cotangents()
    inner = {}
    fwd, grads = modes.forward_and_vjp_modes(call, do, dfs, inner=inner)
    names = grading.result_names(call)
    got, ref, env = grading.named(fwd, grads, names), gd.reference(), grading.envelopes(call, inner)
    tol = float64_bound(gd.case.recipe)
    for r in names:
        err = float(np.max(np.abs(got[r] - ref[r]), initial=0.0)) / scales(ref[r], env.get(r))[1]
        assert err <= tol, f"{name}: {r} error {err:.2e} > {tol:.2e}"


# --- damage and stale recipes are refused like a dense golden's ---------------------------------------------------

def _smallest():
    return min(NAMES, key=lambda n: (DATA_DIR / f"{n}.npz").stat().st_size)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_mode_golden_is_refused(tmp_path, damage):
    name = _smallest()
    expected = MANIFEST_DATA[MODE_SECTION][name]["sha256"]
    path = tmp_path / f"{name}.npz"
    shutil.copyfile(DATA_DIR / f"{name}.npz", path)
    golden.load_mode(name, data_dir=tmp_path)  # an intact copy loads
    damage_file(path, damage)
    with pytest.raises(golden.GoldenError) as info:
        golden.load_mode(name, data_dir=tmp_path)
    msg = str(info.value)
    assert name in msg and expected in msg and f"gdn2-oracle golden regenerate --case {name}" in msg, msg
    if damage != "missing":
        assert hashlib.sha256(path.read_bytes()).hexdigest() in msg, msg


def test_a_stale_or_missing_mode_entry_is_refused():
    name = _smallest()
    manifest = json.loads(json.dumps(MANIFEST_DATA))
    manifest[MODE_SECTION][name]["recipe_sha256"] = "0" * 64
    with pytest.raises(golden.GoldenError, match=f"{name}.*stale.*golden regenerate --case {name}"):
        golden.load_mode(name, manifest=manifest)
    del manifest[MODE_SECTION][name]
    with pytest.raises(golden.GoldenError, match=f"{name}.*not in the manifest"):
        golden.load_mode(name, manifest=manifest)
    # a mode entry filed under the dense section is not a mode entry
    manifest[SECTION][name] = MANIFEST_DATA[MODE_SECTION][name]
    with pytest.raises(golden.GoldenError, match="not in the manifest"):
        golden.load_mode(name, manifest=manifest)


def test_encoding_round_trips_a_mode_golden_and_refuses_an_unpaired_estimate():
    name = _smallest()
    data = (DATA_DIR / f"{name}.npz").read_bytes()
    arrays = decode(data)
    order = (MODE_ARRAY_ORDER, regenerate.MODE_OPTIONAL_ARRAYS)
    assert encode(arrays, *order) == data
    with pytest.raises(ValueError, match="unpaired"):
        encode({n: a for n, a in arrays.items() if n != "err_dA_log"}, *order)
    with pytest.raises(ValueError, match="unknown names"):  # the dense member list has no place for them
        encode(arrays)


# --- regeneration ------------------------------------------------------------------------------------------------

def _copy(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(DATA_DIR, root / "data")
    shutil.copy(DATA_DIR.parent / "MANIFEST.json", root / "MANIFEST.json")
    return root


def test_regenerating_a_mode_case_reproduces_its_bytes(tmp_path, capsys):
    name = min(NAMES, key=lambda n: mode_catalogue.get(n).cost())
    root = tmp_path / "fresh"
    assert regenerate.main(["--root", str(root), "--case", name, "--jobs", "1"]) == 0
    assert (root / "data" / f"{name}.npz").read_bytes() == (DATA_DIR / f"{name}.npz").read_bytes()
    fresh = read_manifest(root / "MANIFEST.json")
    provenance = {"mpmath_version": fresh[MODE_SECTION][name]["mpmath_version"]}  # bytes, not the mpmath used
    assert fresh[MODE_SECTION][name] == MANIFEST_DATA[MODE_SECTION][name] | provenance and fresh[SECTION] == {}
    capsys.readouterr()
    assert regenerate.main(["--root", str(root), "--case", name, "--jobs", "1"]) == 0
    assert "0 regenerated, 1 up to date" in capsys.readouterr().out
    assert regenerate.main(["--root", str(root), "--case", name, "--check", "--jobs", "1"]) == 0
    path = root / "data" / f"{name}.npz"
    arrays = decode(path.read_bytes())
    arrays["dA_log"] = arrays["dA_log"].copy()
    arrays["dA_log"].flat[0] = np.nextafter(arrays["dA_log"].flat[0], np.inf)
    path.write_bytes(encode(arrays, MODE_ARRAY_ORDER, regenerate.MODE_OPTIONAL_ARRAYS))
    capsys.readouterr()
    assert regenerate.main(["--root", str(root), "--case", name, "--check", "--jobs", "1"]) == 1
    assert f"{name}: array 'dA_log' differs" in capsys.readouterr().out


def test_a_whole_catalogue_run_keeps_both_sections_and_prunes_each(tmp_path, capsys, monkeypatch):
    """Everything up to date: nothing recomputed, every entry kept; an entry or file of neither catalogue is removed
    (regenerate) or reported (check, its recomputation cut)."""
    root = _copy(tmp_path)
    manifest = read_manifest(root / "MANIFEST.json")
    manifest[MODE_SECTION]["mode_gone"] = dict(manifest[MODE_SECTION][NAMES[0]])
    (root / "MANIFEST.json").write_text(regenerate.manifest_text(manifest), encoding="utf-8")
    monkeypatch.setattr(regenerate, "_run_all", lambda names, jobs, desc: iter(()))
    assert regenerate.main(["--root", str(root), "--check"]) == 1
    assert "mode_gone: in the manifest but not in the catalogue" in capsys.readouterr().out
    (root / "data" / "mode_gone.npz").write_bytes(b"x")
    assert regenerate.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "0 regenerated" in out and f"{len(catalogue.names())} cases + {len(NAMES)} mode cases" in out
    assert "removed manifest entry of 'mode_gone'" in out and not (root / "data" / "mode_gone.npz").exists()
    assert (root / "MANIFEST.json").read_bytes() == (DATA_DIR.parent / "MANIFEST.json").read_bytes()


def test_golden_list_shows_the_mode_cases(capsys):
    assert regenerate.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        assert "modes " + ",".join(mode_catalogue.get(name).modes) in line, line
