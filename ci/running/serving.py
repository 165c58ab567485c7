"""Putting a serving (decode) kernel to work on a :class:`ci.grading.serving.Session` and judging it.

Which kernels take part (:func:`accepts_serving`), by the names their signature takes:

* ``state_pool`` (+ ``state_indices``, ``cu_seqlens``, ``num_accepted_tokens``, ``scale``): the suite's decode
  contract (``kernels/decode.py``, docs/DESIGN.md §2 "Decode contract"); a JAX function returning
  ``(o, new_pool)`` (a functional pool update);
* FLA's keywords ``initial_state`` + ``ssm_state_indices`` (+ ``cu_seqlens``, ``num_accepted_tokens``,
  ``inplace_final_state``): the convention of FLA's ``fused_recurrent_gdn2_fwd``. This is the one a torch kernel
  (a ``torch:`` spec) must use: it is called through ``kernels/serving_bridge.py`` with the pool as
  ``initial_state`` and ``inplace_final_state=True``, and its pool is read back after the call (an in-place
  update). A JAX function with these names is called the same way and must return ``(o, new_pool)``.

**Family kernels** (``gdn`` / ``kda``: :func:`ci.running.families.kernel_family`) take FLA's keywords and are called
in FLA's fused recurrent family signature on the family sessions (``SessionScript.family``)::

    o, new_pool = fn(q, k, v, g, beta, scale=..., initial_state=pool, ssm_state_indices=..., cu_seqlens=...,
                     num_accepted_tokens=..., [inplace_final_state=True], [<V-first keyword>=True])

``beta [.., HV]``, ``g [.., HV]`` (gdn) / ``[.., HV, K]`` (kda) from the session's GDN-2 call
(``DecodeCall.family_inputs``). A kernel whose signature names FLA's ``[V, K]`` layout keyword
(``oracle.serving.V_FIRST_KEYWORD``) is also judged with it (:func:`layout_flags`; a case with ``v_first``): the pool
it reads and writes is then ``[P, HV, V, K]``, transposed from and back to the judge's ``[P, HV, K, V]`` (exact, so the
untouched-slot check stays bit for bit). A kernel that does not say its family by an attribute or spec option but
has FLA's family signature is run in its session's family (``validate`` runs it only on its own family's sessions).

A ``**kwargs``-only signature does not take part: FLA's public ``fused_recurrent_gdn2`` has one, and silently
drops the slot arguments. A kernel's pool dtype is its ``state_dtype`` attribute (``decode[state_dtype=bfloat16]``)
or, for a ``torch:`` spec, its ``state_dtype`` option; float32 otherwise. Inputs are handed over in the session's
input dtype (exact), indices as int32 (``cu_seqlens`` int64 to torch).

:class:`ServingCase` (``describe()``, ``run(fn)``, ``release()``) is what ``validate --modes decode,speculative``
runs: :func:`serving_cases` gives them for ``oracle/serving_recipes.py``'s recipes. :class:`SessionRun` is one run
judged; with ``--dump`` its :meth:`SessionRun.arrays` (per call: inputs, the kernel's and the reference's ``o`` and
pool, error / tolerance per token and slot) is what a case not graded PASS keeps.
"""

from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np

from gdn2_oracle.kernels.serving_bridge import TorchDecode, takes_fla_pool
from gdn2_oracle.kernels.spec import accepts_keywords
from gdn2_oracle.kernels.torch_bridge import TorchKernel
from gdn2_oracle.oracle import serving_recipes as recipes
from gdn2_oracle.oracle.serving import GDN2, V_FIRST_KEYWORD

from ..grading import serving_diagnosis as diagnosis
from ..grading.result import CaseResult
from ..grading.rule import NON_FINITE
from ..grading.serving import (
    GRADED,
    INPUT_NAMES,
    PADDING_OUTPUTS,
    STATE_DTYPES,
    Session,
    compare_runs,
    drafts_verdict,
    window_nan_verdict,
)
from . import replay_backends
from .drivers import PoolDriver, ReplayDriver
from .families import kernel_family
from .harness import guarded, host_cast, to_device

CONVENTIONS = ("pool", "fla", "replay")  # state_pool / FLA's initial_state + ssm_state_indices / replay states


def _named(fn, name):
    """Whether ``fn``'s signature names the keyword ``name`` (not through ``**kwargs``)."""
    return accepts_keywords(fn, (name,), var_keyword=False)


def convention(fn):
    """``"pool"`` (takes ``state_pool``), ``"fla"`` (takes ``initial_state`` and ``ssm_state_indices``; a torch
    kernel must), ``"replay"`` (its ``session_driver`` attribute says so: a replay kernel, run by a
    :class:`ReplayDriver` over its backend, ``ci/running/replay_backends.py``) or None (not a serving kernel)."""
    if getattr(fn, "session_driver", None) == "replay":
        return "replay"
    if isinstance(fn, TorchKernel):
        return "fla" if takes_fla_pool(fn.fn) else None
    if _named(fn, "state_pool"):
        return "pool"
    return "fla" if takes_fla_pool(fn) else None


def accepts_serving(fn) -> bool:
    """Whether kernel ``fn`` (as ``kernels.get`` builds it) can be run on a state pool (module docstring)."""
    return convention(fn) is not None


def layout_flags(fn):
    """``[V_FIRST_KEYWORD]`` when kernel ``fn``'s signature names FLA's ``[V, K]`` state layout keyword (then it is
    judged in both pool layouts), else ``[]``."""
    return [V_FIRST_KEYWORD] if _named(fn, V_FIRST_KEYWORD) else []


def serving_family(fn, session_family=GDN2):
    """The family kernel ``fn`` is run in: :func:`kernel_family` (an attribute, else its signature), or, for a
    kernel in FLA's family signature that does not say it, ``session_family`` when that is a family."""
    try:
        return kernel_family(fn)
    except ValueError:
        if session_family == GDN2:
            raise
        return session_family


def state_dtype(fn):
    """The dtype kernel ``fn`` stores its pool in: its ``state_dtype`` (attribute, or a ``torch:`` option)."""
    if isinstance(fn, TorchKernel):
        sd = fn.kwargs.get("state_dtype", "float32")
    else:
        sd = getattr(fn, "state_dtype", None) or getattr(fn, "keywords", {}).get("state_dtype", "float32")
    sd = jnp.dtype(sd).name
    if sd not in STATE_DTYPES:
        raise ValueError(f"state_dtype: {sd!r} not one of {STATE_DTYPES}")
    return sd


class ServingRunner:
    """One kernel's decode calls on NumPy arguments: :meth:`step` ``(call, pool, dtype) -> (o, new_pool)``; a family
    kernel (``family``: gdn or kda) in FLA's family signature, with the ``[V, K]`` pool when ``v_first``."""

    def __init__(self, fn, family=GDN2, v_first=False):
        conv = convention(fn)
        if conv is None:
            raise ValueError(f"kernel: {getattr(fn, '__name__', fn)!r} takes no state pool (neither state_pool nor "
                             "FLA's initial_state + ssm_state_indices by name): not a serving kernel")
        if family != GDN2 and (conv != "fla" or isinstance(fn, TorchKernel)):
            raise ValueError(f"kernel: a {family} serving kernel is a JAX function with FLA's initial_state + "
                             "ssm_state_indices (torch family serving kernels are not covered)")
        if v_first and not layout_flags(fn):
            raise ValueError(f"{V_FIRST_KEYWORD}: kernel {getattr(fn, '__name__', fn)!r} does not take it")
        self.fn, self.convention, self.family, self.v_first = fn, conv, family, bool(v_first)
        self.torch = None
        if isinstance(fn, TorchKernel):
            options = {k: v for k, v in fn.kwargs.items() if k != "output_final_state"}
            self.torch = TorchDecode(fn.fn, name=fn.__name__, device=fn.device, options=options)
        self.state_dtype = state_dtype(fn)
        self._inplace = self.torch is None and conv == "fla" and _named(fn, "inplace_final_state")

    def pool(self, values):
        """The initial pool in the kernel's state dtype (NumPy; ``values`` exact in it)."""
        return host_cast(np.asarray(values, np.float32), self.state_dtype)

    def step(self, call, pool, dtype):
        """Run one :class:`DecodeCall` on ``pool`` with inputs in ``dtype``: ``(o, new_pool)`` as NumPy arrays."""
        bk = call.bookkeeping()
        if self.torch is not None:
            xs = [host_cast(x, dtype) for x in call.inputs()]
            return self.torch(*xs, state_pool=pool, **bk)
        inputs = call.inputs() if self.family == GDN2 else tuple(call.family_inputs(self.family).values())
        xs = [to_device(x, dtype) for x in inputs]
        ints = {k: jnp.asarray(np.asarray(v).astype(np.int32)) for k, v in bk.items() if k != "scale"}
        scale = bk.get("scale")
        if self.convention == "pool":
            out = self.fn(*xs, state_pool=jnp.asarray(pool), scale=scale, **ints)
        else:
            ints["ssm_state_indices"] = ints.pop("state_indices")
            extra = {"inplace_final_state": True} if self._inplace else {}
            if self.v_first:  # the kernel reads and writes [P, HV, V, K]; the judge sees [P, HV, K, V]
                pool, extra = np.swapaxes(pool, -1, -2), {**extra, V_FIRST_KEYWORD: True}
            out = self.fn(*xs, initial_state=jnp.asarray(pool), scale=scale, **ints, **extra)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError(f"o: a serving kernel returns (o, new_pool), got {returned(out)}")
        new_pool = np.asarray(out[1])
        return np.asarray(out[0]), (np.swapaxes(new_pool, -1, -2) if self.v_first else new_pool)


def returned(out):
    """What a kernel returned, in words: ``a 3-tuple``, ``a list of 1``, ``one array float32[2, 1, 4]``."""
    if isinstance(out, (tuple, list)):
        return f"a {len(out)}-tuple" if isinstance(out, tuple) else f"a list of {len(out)}"
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape is not None:
        return f"one array {dtype}[{', '.join(map(str, shape))}] (o alone?)"
    return type(out).__name__


def driver(fn, session_family=GDN2, v_first=False):
    """The session driver of kernel ``fn`` (``ci/running/drivers.py``): a replay kernel's :class:`ReplayDriver`,
    else a :class:`PoolDriver` over a :class:`ServingRunner` (``fn`` may be one, or a driver already)."""
    if all(hasattr(fn, n) for n in ("start", "step", "replay_capacity")):  # a driver already (docs/drivers.md)
        return fn
    if isinstance(fn, ServingRunner):
        return PoolDriver(fn)
    if convention(fn) == "replay":
        if v_first:
            raise ValueError(f"{V_FIRST_KEYWORD}: a replay kernel keeps its own checkpoint layout")
        return ReplayDriver(replay_backends.backend(fn), getattr(fn, "__name__", None))
    return PoolDriver(ServingRunner(fn, serving_family(fn, session_family), v_first))


def _option(fn, name, default):
    """Kernel ``fn``'s ``name``: its attribute, or a keyword of a ``functools.partial``, else ``default``."""
    value = getattr(fn, name, None)
    return getattr(fn, "keywords", {}).get(name, default) if value is None else value


def strict_drafts(fn) -> bool:
    """Whether kernel ``fn`` is graded FAIL when a rejected NaN draft reaches its accepted results only through a
    window's arithmetic (0 * NaN): its ``strict_drafts`` (attribute or spec option; default False, judged on finite
    drafts)."""
    value = _option(fn, "strict_drafts", False)
    if value not in (True, False, 0, 1):
        raise ValueError(f"strict_drafts: expected a boolean, got {value!r}")
    return bool(value)


def padding_output(fn) -> str:
    """What kernel ``fn``'s contract says of its outputs at padding rows (``ci.grading.serving.PADDING_OUTPUTS``): its
    ``padding_output`` (attribute or a factory's keyword), ``"zero"`` by default (exact zeros, judged); ``"unwritten"``
    (never stored: not judged, the pool still judged by ``untouched``)."""
    value = _option(fn, "padding_output", "zero")
    if value not in PADDING_OUTPUTS:
        raise ValueError(f"padding_output: {value!r} not one of {PADDING_OUTPUTS}")
    return value


def session_size(fn) -> str:
    """The session size kernel ``fn`` is judged at (``serving_recipes.SIZES``): its ``session_size`` (attribute or
    spec option), ``small`` by default."""
    size = _option(fn, "session_size", "small")
    if size not in recipes.SIZES:
        raise ValueError(f"session_size: {size!r} not one of {tuple(recipes.SIZES)}")
    return size


def run_session(fn, session: Session, *, keep=False, v_first=False, strict=None):
    """Run kernel ``fn`` (or its driver, :func:`driver`) on every call of ``session``, chained on its own states, and
    grade it (``ci/grading/serving.py``): the Report, or with ``keep`` ``(report, [(o, pool after), ...])``. A family
    session runs a family kernel in FLA's family signature; ``v_first``: with the ``[V, K]`` pool. ``strict``: a NaN
    draft reaching accepted results through a window's arithmetic FAILs (default: the kernel's
    :func:`strict_drafts`)."""
    run = SessionRun(fn, session, keep=keep, v_first=v_first, strict=strict)
    return (run.report, run.kept) if keep else run.report


class SessionRun:
    """One kernel run on a session and judged (:func:`run_session`): ``judge`` (its :class:`SessionJudge`, holding the
    reference calls and the metrics' scales), ``report``, ``initial_pool`` (the pool the kernel started from) and,
    with ``keep``, ``kept`` ``[(o, pool after), ...]`` per call.

    A session with rejected drafts (``Session.has_drafts``) is run with finite values in them (the first of
    ``serving_recipes.POISONINGS``): that run is graded. It runs again with the NaN drafts of the script: when that
    run's judged results are finite they must agree with the first (the hard verdict ``drafts``); when NaN reaches
    them it runs a third time with the second finite poisoning, which must agree with the first: if it does, the NaN
    came through the window's arithmetic (0 * NaN), the finding ``window-nan`` (FAIL only when ``strict``); if not, a
    rejected draft is read (``drafts`` FAIL, the finding ``rejected-draft`` naming it)."""

    def __init__(self, fn, session: Session, *, keep=False, v_first=False, strict=None):
        drv = driver(fn, session.family, v_first)
        if drv.family != session.family:
            raise ValueError(f"family: a {drv.family} kernel cannot run the {session.family} session "
                             f"{session.name!r}")
        self.session, self.driver = session, drv
        self.strict = strict_drafts(fn) if strict is None else bool(strict)
        self.padding_output = padding_output(fn)
        self.keep = bool(keep)
        drafts = session.has_drafts
        calls = session.poisoned(recipes.POISONINGS[0]) if drafts else session.calls
        self.judge, self.kept, self.initial_pool = self._run(calls, keep)
        self.report = self.judge.report()
        if drafts:
            self._judge_drafts()

    def _run(self, calls, keep):
        """``(judge, kept, initial pool)`` of the driver run on ``calls`` (the session's, or with other drafts)."""
        drv, session = self.driver, self.session
        judge = session.judge(drv.state_dtype, replay_capacity=drv.replay_capacity,
                              replay_storage=getattr(drv, "replay_storage", None), padding_output=self.padding_output)
        pool = initial = drv.start(session)
        kept = []
        for i, call in enumerate(calls):
            o, new_pool = drv.step(call, session.dtype)
            judge.add(i, o, pool, new_pool)
            if keep:
                kept.append((o, new_pool))
            pool = new_pool
        return judge, kept, initial

    def _judge_drafts(self):
        """The verdicts and findings of the rejected drafts (class docstring), added to :attr:`report`."""
        nan_judge = self._run(self.session.calls, False)[0]
        nan_report = nan_judge.report()
        nan_bad = [v for v in nan_report.verdicts if v.name in GRADED and v.rule == NON_FINITE]
        if nan_bad:
            other, what = self._run(self.session.poisoned(recipes.POISONINGS[1]), False)[0], "two finite poisonings"
        else:
            other, what = nan_judge, "finite and NaN drafts"
        report = self.report
        verdict = drafts_verdict(compare_runs(self.judge, other), report, what)
        found = [] if verdict.passed else [diagnosis.rejected_draft(self.judge, other, verdict, what)]
        report.verdicts.append(verdict)
        finite = not any(v.rule == NON_FINITE for v in report.verdicts if v.name in GRADED)
        late = []
        if nan_bad and verdict.passed and finite:
            first = min(nan_judge.metrics[v.name].first_bad for v in nan_bad)
            report.verdicts.append(window_nan_verdict(nan_report, first, self.strict))
            late.append(diagnosis.window_nan(first, self.strict))
        findings = found + list(report.diagnosis) + late
        report.diagnosis = [dataclasses.replace(f, primary=k == 0) for k, f in enumerate(findings)]

    def arrays(self):
        """What ``--dump`` writes of the run (needs ``keep``), named for ``arrays.npz``: per call ``i``
        ``call{i}_input_q`` .. ``call{i}_input_w`` (the session's inputs), ``call{i}_state_indices``,
        ``call{i}_num_accepted_tokens`` and ``call{i}_cu_seqlens`` (where the call has them), ``call{i}_read_slots``
        (the slot each sequence must start from), ``call{i}_got_o`` / ``call{i}_ref_o`` (the kernel's and the judge's
        reference outputs: 0 at padding, NaN where the reference is not finite) and ``call{i}_got_pool`` /
        ``call{i}_ref_pool`` (the pools after the call, the reference's NaN at a written slot it does not judge),
        ``call{i}_ratio_o`` ``[B, T]`` (error / tolerance per token, NaN where not judged) and ``call{i}_ratio_state``
        ``[P]`` (per written slot, NaN elsewhere); on a session with rejected drafts ``call{i}_graded_input_q`` ..
        ``_w`` (the inputs of the graded run: the rejected drafts finite) for the calls that have some; once:
        ``initial_pool`` and, for a graded result not PASS,
        ``per_call_ratio_<result>`` (the judge's per-call error profile over the result's tolerance)."""
        if not self.keep:
            raise ValueError("keep: the run kept no results (SessionRun(..., keep=True))")
        session, judge = self.session, self.judge
        tol = {v.name: v for v in self.report.verdicts if v.name in judge.metrics}
        out = {"initial_pool": self.initial_pool, **call_inputs(session)}
        if session.has_drafts:
            for i, (call, graded) in enumerate(zip(session.calls, session.poisoned(recipes.POISONINGS[0]))):
                if graded is not call:
                    out.update({f"call{i}_graded_input_{n}": x for n, x in zip(INPUT_NAMES, graded.inputs())})
        ref_pool = np.asarray(session.initial_pool(), np.float64)
        for i, (rc, (o, pool)) in enumerate(zip(judge.ref, self.kept)):
            key = f"call{i}_"
            out[key + "read_slots"] = rc.plan.read_slots
            ref_o = np.zeros(np.shape(o), np.float64)
            ref_o[rc.judged] = rc.o
            ref_o[~rc.idle & ~rc.judged] = np.nan
            ref_pool = ref_pool.copy()
            ref_pool[rc.written] = np.nan
            ref_pool[rc.state_slots] = rc.state
            got_o, got_pool = np.asarray(o, np.float64), np.asarray(pool, np.float64)
            ratio_o = np.full(rc.judged.shape, np.nan)
            ratio_o[rc.judged] = _ratio(got_o[rc.judged] - rc.o, judge.metrics["o"].scales, tol.get("o"))
            ratio_state = np.full(got_pool.shape[0], np.nan)
            ratio_state[rc.state_slots] = _ratio(got_pool[rc.state_slots] - rc.state, judge.metrics["state"].scales,
                                                 tol.get("state"))
            out.update({key + "got_o": o, key + "ref_o": ref_o, key + "got_pool": pool, key + "ref_pool": ref_pool,
                        key + "ratio_o": ratio_o, key + "ratio_state": ratio_state})
        for name, profile in (self.report.profiles or {}).items():
            v = tol.get(name)
            out[f"per_call_ratio_{name}"] = np.asarray(profile, np.float64) / (v.tol_ratio if v and v.tol_ratio > 0
                                                                                else 1.0)
        return out


def _ratio(diff, scales, verdict):
    """Per leading index of ``diff`` (a token's ``[HV, V]`` or a slot's ``[HV, K, V]`` error): error / tolerance as
    ``Verdict.ratio`` has it, the larger of rms / (rms scale x tol_ratio) and max / (max scale x tol_max); inf where
    not finite."""
    if not len(diff):
        return np.zeros(0)
    d = np.asarray(diff, np.float64).reshape(len(diff), -1)
    t_rms, t_max = (verdict.tol_ratio, verdict.tol_max) if verdict is not None else (1.0, 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        rms = np.sqrt(np.mean(np.square(d), axis=1)) / (scales[0] * (t_rms if t_rms > 0 else 1.0))
        big = np.max(np.abs(d), axis=1) / (scales[1] * (t_max if t_max > 0 else 1.0))
    return np.where(np.all(np.isfinite(d), axis=1), np.maximum(rms, big), np.inf)


def call_inputs(session):
    """The per-call inputs and bookkeeping of ``session`` named as :meth:`SessionRun.arrays` names them (what
    ``--dump`` keeps of a case whose kernel raised)."""
    out = {}
    for i, call in enumerate(session.calls):
        out.update({f"call{i}_input_{n}": x for n, x in zip(INPUT_NAMES, call.inputs())})
        for n in ("state_indices", "num_accepted_tokens", "cu_seqlens"):
            if getattr(call, n) is not None:
                out[f"call{i}_{n}"] = np.asarray(getattr(call, n))
    return out


class ServingCase:
    """A serving session as a case (``ci/running/cases.py``'s protocol): ``name``, ``dtype``, ``shape``, ``modes``,
    ``describe()``, ``run(kernel, mesh)``, ``release()``. ``build(size=...)`` (a recipe's builder,
    ``serving_recipes.builders``) gives the session at another size: a kernel whose :func:`session_size` is not
    ``small`` is judged on that one (built once, kept until :meth:`release`); ``strict``: every kernel is graded
    strict on rejected drafts (else each kernel's :func:`strict_drafts`)."""

    compiles_ahead = False  # a kernel's decode calls compile as they run

    def __init__(self, session: Session, v_first=False, build=None, strict=None):
        self.session, self.v_first = session, bool(v_first)
        self.build, self.strict, self._sized = build, strict, {}
        self.name = session.name + ("_vk" if v_first else "")
        self.dtype, self.mode, self.modes = session.dtype, session.mode, session.modes
        self.shape, self.family = session.shape, session.family
        self.flags = (V_FIRST_KEYWORD,) if v_first else ()  # FLA's keywords the case needs (validate's takes_part)

    def describe(self, session=None):
        d = (session or self.session).describe()
        if session is not None and session is not self.session:
            d = {**d, "case": self.name, "session": session.name}
        return {**d, "case": self.name, "pool_layout": "[P, HV, V, K]"} if self.v_first else d

    def session_for(self, fn):
        """The session kernel ``fn`` is judged on: this case's, or the same recipe at its :func:`session_size`."""
        size = session_size(fn)
        if size == "small":
            return self.session
        if self.build is None:
            raise ValueError(f"session_size: case {self.name!r} has no builder for size {size!r}")
        if size not in self._sized:
            self._sized[size] = Session.from_script(self.build(size=size))
        return self._sized[size]

    def run(self, fn, mesh=None, *, capture=False, program=None) -> CaseResult:
        """Judge kernel ``fn`` on the session's calls chained on its own pool (no mesh: a decode call is not
        sharded); a kernel that raises, or is no serving kernel, fails the case. ``capture`` (``--dump``): the
        result's ``arrays`` hold ``{"serving": {name: array}}`` for a case not graded PASS: per call its inputs,
        bookkeeping, the kernel's and the reference's ``o`` and pool after it, and error / tolerance per token and
        per written slot (:meth:`SessionRun.arrays`); of a kernel that raised, the calls' inputs; nothing (``{}``)
        for a PASS."""
        t0 = time.perf_counter()
        arrays = {} if capture else None
        session = self.session
        try:
            with guarded():
                session = self.session_for(fn)
                run = SessionRun(fn, session, keep=capture, v_first=self.v_first, strict=self.strict)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises (or is no serving kernel) fails this case
            if capture:
                arrays["serving"] = call_inputs(session)
            return CaseResult.failed(self.describe(session), exc, time.perf_counter() - t0, arrays=arrays)
        result = CaseResult.judged(self.describe(session), run.report, time.perf_counter() - t0, arrays=arrays)
        if capture and not result.passed:  # only a dumped case keeps its arrays
            arrays["serving"] = run.arrays()
        return result

    def release(self):
        self.session.release()
        self._sized = {}


def serving_cases(dtypes=("float32", "bfloat16"), seed=0, modes=recipes.MODES, only=None, strict=None):
    """The serving cases (:class:`ServingCase`) of ``oracle/serving_recipes.py`` for ``dtypes`` and ``modes``."""
    return [ServingCase(Session.from_script(build()), build=build, strict=strict)
            for build in recipes.builders(dtypes, seed, modes, only)]


def family_serving_cases(families, dtypes=("float32", "bfloat16"), seed=0, modes=recipes.MODES, strict=None):
    """The family sessions of ``families`` as cases, each in the ``[K, V]`` and the ``[V, K]`` pool layout (the
    latter only for kernels that take FLA's layout keyword: its ``flags``)."""
    out = []
    for build in recipes.family_builders(families, dtypes, seed, modes):
        session = Session.from_script(build())
        out += [ServingCase(session, build=build, strict=strict),
                ServingCase(session, v_first=True, build=build, strict=strict)]
    return out
