"""vLLM's ReplaySSM functions by name (``replayssm:PACKAGE``, kernels/replayssm.py, ci/running/replayssm_backend.py).

vLLM cannot be installed here, so the kernel is run on the stand-in package ``kernels/replayssm_standin`` (vLLM's
module and function names and signatures, torch tensors updated in place, our JAX replay kernel inside):

* the stand-in's four functions have exactly the parameters of vLLM's (names, order, defaults), as pinned in
  docs/DESIGN.md §2 from vLLM's source;
* ``replayssm:gdn2_oracle.kernels.replayssm_standin`` passes every gdn serving session through its replay driver,
  in process and through ``validate``;
* a package without a module or a function is a ValueError naming ``package``;
* the functions update the caller's tensors in place (the checkpoint, the rings, ``out``, the cursors), and the
  spec path's two launches split the rows by ``is_flush``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gdn2_oracle import kernels  # noqa: E402 - after importorskip
from gdn2_oracle.ci.grading.grades import PASS  # noqa: E402 - after importorskip
from gdn2_oracle.ci.running import serving as running  # noqa: E402 - after importorskip
from gdn2_oracle.ci.running.drivers import ReplayDriver  # noqa: E402 - after importorskip
from gdn2_oracle.ci.running.replayssm_backend import VllmReplayBackend, raw_gdn_terms  # noqa: E402 - as above
from gdn2_oracle.kernels.replayssm import ReplaySSMKernel  # noqa: E402 - after importorskip
from gdn2_oracle.kernels.replayssm_standin import fused_recurrent_replayssm as one  # noqa: E402 - as above
from gdn2_oracle.kernels.replayssm_standin import gdn_replayssm_spec_decode as win  # noqa: E402 - as above

STANDIN = "gdn2_oracle.kernels.replayssm_standin"
SMALL = "session_size='small'"  # the stand-in takes the small sessions (vLLM's kernels: the default k128)

# vLLM's signatures (vllm-project/vllm 4cfaaf3c, docs/DESIGN.md §2 "Replay states and session drivers"), as written
# there: parameter names, order and defaults.
VLLM_SIGNATURES = {
    (one, "fused_recurrent_gated_delta_rule_replayssm"):
        "mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, d_cache, k_cache, g_cache, out, ssm_state_indices, "
        "write_pos, use_qk_l2norm_in_kernel=False, block_v=None, num_warps=None, num_stages=None, nk=None",
    (win, "gdn_replayssm_spec_decode"):
        "mixed_qkv, a, b, A_log, dt_bias, checkpoint_state, d_cache, k_cache, g_cache, out, query_start_loc, "
        "ssm_state_indices, write_pos, cache_base, is_flush, max_cache_len, max_spec_len, scale=None, "
        "use_qk_l2norm_in_kernel=True, null_block_id=0, launch_mode='both'",
    (win, "commit_gdn_replayssm_spec"):
        "write_pos, cache_base, is_flush, num_accepted, state_batch_indices, max_cache_len, max_spec_len, "
        "cache_buf_len=None, null_block_id=0",
    (win, "reset_gdn_replayssm_spec_cursors"):
        "write_pos, cache_base, is_flush, do_reset, state_batch_indices, max_cache_len, max_spec_len, "
        "null_block_id=0",
}


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("where", list(VLLM_SIGNATURES), ids=[name for _, name in VLLM_SIGNATURES])
def test_the_standins_functions_have_vllms_signatures(where):
    module, name = where
    scope = {}
    exec(f"def {name}({VLLM_SIGNATURES[where]}):\n    pass\n", scope)  # noqa: S102 - the pinned signature's text
    assert _params(getattr(module, name)) == _params(scope[name])


# --- the serving sessions ------------------------------------------------------------------------------------------

def test_the_standin_passes_every_gdn_session():
    fn = kernels.get(f"replayssm:{STANDIN}[capacity=6,spec_len=3,{SMALL}]")
    assert isinstance(fn, ReplaySSMKernel) and fn.__name__ == f"replayssm:{STANDIN}"
    assert (fn.session_driver, fn.family, fn.capacity, fn.spec_len) == ("replay", "gdn", 6, 3)
    driver = running.driver(fn)
    assert isinstance(driver, ReplayDriver) and isinstance(driver.backend, VllmReplayBackend)
    cases = [c for c in running.family_serving_cases(["gdn"], ("float32",)) if not c.v_first]
    assert {c.mode for c in cases} == {"decode", "speculative"}
    for case in cases:
        result = case.run(fn)
        assert result.grade == PASS and all(v.grade == PASS for v in result.verdicts), (case.name, result)


def test_validate_passes_the_standin(cli):
    code, out, err = cli("validate", "--kernel", f"replayssm:{STANDIN}[capacity=6,{SMALL}]", "--modes",
                         "decode,speculative", "--dtype", "float32", "--no-progress")
    assert code == 0, out + err
    assert f"replayssm:{STANDIN}[capacity=6,session_size=small]: PASS (4/4 cases pass)" in out


def test_replayssm_kernels_get_sessions_at_vllms_launch_shapes():
    fn = kernels.get(f"replayssm:{STANDIN}[capacity=6,spec_len=3]")
    assert (fn.session_size, fn.strict_drafts) == ("k128", False)
    case = next(c for c in running.family_serving_cases(["gdn"], ("float32",)) if c.name == "serving_gdn_drafts_g4")
    result = case.run(fn)
    assert result.grade == PASS and result.case["shape"][2:] == [128, 128], result


def test_a_ring_too_short_for_a_window_is_refused_by_name():
    fn = kernels.get(f"replayssm:{STANDIN}[capacity=1,spec_len=3,{SMALL}]")
    case = next(c for c in running.family_serving_cases(["gdn"], ("float32",))
                if c.mode == "speculative" and not c.v_first)
    with pytest.raises(ValueError, match="capacity"):
        running.run_session(fn, case.session)


# --- the spec and its errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("package, missing", [
    ("gdn2_oracle.no_such_package", "fused_recurrent_replayssm"),
    ("gdn2_oracle.kernels", "fused_recurrent_replayssm"),  # a package without vLLM's modules
])
def test_a_package_without_the_modules_is_a_valueerror_naming_package(package, missing):
    with pytest.raises(ValueError, match=rf"^package: '{package}' has no module '{missing}'"):
        kernels.get(f"replayssm:{package}")


def test_a_module_without_a_function_is_a_valueerror_naming_package(monkeypatch):
    monkeypatch.delattr(win, "commit_gdn_replayssm_spec")
    with pytest.raises(ValueError, match=r"^package: .*has no function 'commit_gdn_replayssm_spec'"):
        kernels.get(f"replayssm:{STANDIN}")


def test_options_are_checked_and_declared():
    with pytest.raises(ValueError, match="^capacity"):
        kernels.get(f"replayssm:{STANDIN}[capacity=0]")
    with pytest.raises(ValueError, match="^state_dtype"):
        kernels.get(f"replayssm:{STANDIN}[state_dtype='float64']")
    with pytest.raises(ValueError, match="^session_size"):
        kernels.get(f"replayssm:{STANDIN}[session_size='k64']")
    assert kernels.get(f"replayssm:{STANDIN}[strict_drafts=1]").strict_drafts
    assert kernels.accepts(f"replayssm:{STANDIN}", "spec_len")
    assert not kernels.accepts(f"replayssm:{STANDIN}", "chunk_size")


# --- the stand-in's semantics: in place, as vLLM's ----------------------------------------------------------------

H, HV, K, V, P = 1, 2, 16, 8, 4


def _tokens(n, seed=0):
    rng = np.random.default_rng(seed)
    mixed = torch.from_numpy(rng.standard_normal((n, 2 * H * K + HV * V)).astype(np.float32) * 0.5)
    a = torch.from_numpy(rng.standard_normal((n, HV)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((n, HV)).astype(np.float32))
    return mixed, a, b, torch.zeros(HV), torch.zeros(HV)


def _storage(ring, seed=1):
    rng = np.random.default_rng(seed)
    ck = torch.from_numpy(rng.standard_normal((P, HV, V, K)).astype(np.float32) * 0.1)
    return ck, torch.zeros(P, HV, ring, V), torch.zeros(P, H, ring, K), torch.zeros(P, HV, ring)


def _recurrent_reference(mixed, a, b, S, scale):
    """One token of GDN on state ``S [HV, V, K]`` (float64): ``(o [HV, V], S_t)``."""
    x = mixed.double().numpy()
    q, k, v = x[:H * K].reshape(H, K), x[H * K:2 * H * K].reshape(H, K), x[2 * H * K:].reshape(HV, V)
    g = -np.log1p(np.exp(a.double().numpy()))
    beta = 1 / (1 + np.exp(-b.double().numpy()))
    heads = np.arange(HV) // (HV // H)
    S = np.exp(g)[:, None, None] * S
    d = beta[:, None] * (v - np.einsum("hvk,hk->hv", S, k[heads]))
    S = S + d[:, :, None] * k[heads][:, None, :]
    return np.einsum("hvk,hk->hv", S, scale * q[heads]), S


def test_one_token_function_updates_the_callers_tensors_in_place():
    L = 3
    mixed, a, b, A_log, dt_bias = _tokens(3)
    ck, d, k, g = _storage(L)
    ck0 = ck.clone()
    out = torch.full((3, 1, HV, V), 7.0)
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)  # row 1 is padding (slot 0)
    S = {2: ck0[2].double().numpy(), 3: ck0[3].double().numpy()}
    for wp in range(L):  # two entries, then a flush at write_pos == L - 1
        res = one.fused_recurrent_gated_delta_rule_replayssm(
            mixed, a, b, A_log, dt_bias, 0.25, ck, d, k, g, out, slots, torch.full((3,), wp, dtype=torch.int32))
        assert res[0] is out and res[1] is ck
        for row, slot in ((0, 2), (2, 3)):
            o_ref, S[slot] = _recurrent_reference(mixed[row], a[row], b[row], S[slot], 0.25)
            np.testing.assert_allclose(out[row, 0].numpy(), o_ref, rtol=2e-5, atol=2e-6)
        assert (out[1] == 0).all()  # the padding row's output is written, with zeros
        if wp < L - 1:
            assert (g[[2, 3], :, wp] != 0).all() and (d[[2, 3], :, wp] != 0).any()  # entry written at write_pos
            assert torch.equal(ck, ck0)  # no flush: the checkpoint untouched
    assert not torch.equal(ck[[2, 3]], ck0[[2, 3]])  # the flush wrote the state after the token
    np.testing.assert_allclose(ck[2].double().numpy(), S[2], rtol=2e-5, atol=2e-6)
    assert torch.equal(ck[[0, 1]], ck0[[0, 1]]) and (d[[0, 1]] == 0).all()  # other slots untouched


def test_the_window_launches_split_rows_by_is_flush_and_cursors_move_in_place():
    L, T, buf = 6, 3, 8
    mixed, a, b, A_log, dt_bias = _tokens(5, seed=2)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    slots = torch.tensor([1, 2], dtype=torch.int32)
    wp, base, fl = torch.tensor([0, 2, 2, 0], dtype=torch.int32), torch.tensor([0, 5, 1, 0], dtype=torch.int32), \
        torch.tensor([0, 0, 1, 0], dtype=torch.int8)

    def run(mode, storage):
        out = torch.full((5, HV, V), 7.0)
        ret = win.gdn_replayssm_spec_decode(mixed, a, b, A_log, dt_bias, *storage, out, qsl, slots, wp, base, fl,
                                            max_cache_len=L, max_spec_len=T, use_qk_l2norm_in_kernel=True,
                                            launch_mode=mode)
        assert ret is out
        return out

    both = _storage(buf, seed=3)
    for t in both[1:]:
        t.normal_(generator=torch.Generator().manual_seed(4))
    both[3].clamp_(max=0)
    split = tuple(t.clone() for t in both)
    ck0 = both[0].clone()
    out_both = run("both", both)
    out_verify = run("verify", split)
    out_flush = run("flush", split)
    assert torch.equal(out_verify[:3], out_both[:3]) and (out_verify[3:] == 7).all()  # slot 1: verify
    assert torch.equal(out_flush[3:], out_both[3:]) and (out_flush[:3] == 7).all()  # slot 2: flush
    assert all(torch.equal(x, y) for x, y in zip(both, split))
    assert torch.equal(both[0][1], ck0[1]) and not torch.equal(both[0][2], ck0[2])  # only the flush row's checkpoint
    win.commit_gdn_replayssm_spec(wp, base, fl, torch.tensor([2, 1], dtype=torch.int32), slots, L, T)
    assert (wp.tolist(), base.tolist(), fl.tolist()) == ([0, 4, 1, 0], [0, 5, 3, 0], [0, 1, 1, 0])
    win.reset_gdn_replayssm_spec_cursors(wp, base, fl, torch.tensor([0, 1]), torch.tensor([1, 2]), L, T)
    assert (wp.tolist(), base.tolist(), fl.tolist()) == ([0, 4, 0, 0], [0, 5, 0, 0], [0, 1, 0, 0])


def test_the_raw_gates_invert_softplus_and_sigmoid():
    g = np.array([0.0, -1e-30, -1e-6, -0.5, -3.0, -25.0, -800.0])
    beta = np.array([0.0, 1e-6, 0.3, 0.5, 0.9, 1 - 1e-6, 1.0])
    a, b = raw_gdn_terms(g, beta)
    assert a.dtype == b.dtype == np.float32 and np.isfinite(a).all() and np.isfinite(b).all()
    back_g, back_beta = one.gdn_terms(torch.from_numpy(a[None]), torch.from_numpy(b[None]), torch.zeros(7),
                                      torch.zeros(7), 1, 7)
    np.testing.assert_allclose(back_g[0], g, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(back_beta[0], beta, rtol=1e-5, atol=1e-7)


def test_serving_only_kernels_skip_the_dense_cases(cli):
    """Without --modes, validate runs the stand-in on its serving sessions only (it has no dense call: its
    ``serving_only``), listing the dense cases as not run, and passes."""
    code, out, err = cli("validate", "--kernel", f"replayssm:{STANDIN}[capacity=6,spec_len=3]", "--cases", "smoke",
                         "--dtype", "float32", "--no-progress")
    assert code == 0, out + err
    assert "PASS" in out and "not run" in out and "runs only on serving sessions" not in out, out
