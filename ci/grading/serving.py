"""Judging a serving (decode) kernel: calls chained on a state pool, with stored-state precision as its own axis.

A :class:`Session` is a scripted run of decode calls (docs/DESIGN.md §2, "Decode contract (serving)"): an initial
pool and calls, each reading and writing slots of the pool the previous call left. A kernel runs the calls chained
on its own pool; its results are judged against the float64 oracle (``oracle/serving.py``) chained on the exact
pool, by the tolerance model of docs/DESIGN.md §4, per result:

* ``o``: every call's outputs at live tokens whose reference is finite (rejected drafts are garbage), together;
* ``state``: the states every call wrote (its written slots right after the call, finite references), together;
* ``untouched`` (hard): every slot a call does not write comes back bit-identical;
* ``padding`` (hard): padding rows and tokens of no live sequence output exact zeros -- the default contract; a
  kernel whose contract leaves those outputs unwritten (``padding_output = "unwritten"``: vLLM's fused recurrent
  kernel) has them not judged (the verdict says so), its pool still judged by ``untouched``.

Tolerance, bound and grade (derivation and measurements: docs/serving.md)::

    tol   = max(MULTIPLE[result dtype] * e_rec, FLOOR[result dtype])
    bound = max(tol, MULTIPLE[state dtype] * e_store)          # the stored-state bound
    PASS <= tol < PRECISION <= bound < FAIL  (both metrics; NaN/inf: FAIL)

``e_rec``: the same metric of the oracle chained in float32 with a float32 pool (results rounded to the dtypes the
kernel returned them in: ``o`` to ``v.dtype``, the states to the pool's dtype). ``e_store``: the oracle chained in
float32 with every stored state rounded to the pool's dtype (``serving.decode(store_dtype=...)``): a kernel that
stores a bfloat16 / float16 pool between calls with float32 compute. For a float32 pool ``e_store`` is ``e_rec``:
no PRECISION band. A correct 16-bit pool is PRECISION wherever a rounded state is read again (float32 ``o`` of a
later call; states once they drift past one rounding, over long horizons), and a kernel that rounds more often
than once per store (the state kept in 16 bits inside the token loop) is FAIL.

NumPy and the oracle only (the ``ci/grading`` floor): a runner (``ci/running/serving.py``) feeds the judge.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gdn2_oracle.oracle import replay, serving
from gdn2_oracle.oracle import serving_recipes as recipes
from gdn2_oracle.oracle.generate import round_to
from gdn2_oracle.oracle.recurrence import Arith

from .case import CachedCase
from .grades import PASS, Verdict
from .rule import ABS_FLOOR, AGREE_FRACTION, FLOOR, MULTIPLE, agreement_tolerance, grade, tolerance
from .serving_diagnosis import diagnose, sequence_errors
from .tolerance import Report

STATE_DTYPES = serving.STATE_DTYPES
GRADED = ("o", "state")
HARD = ("untouched", "padding")
# a session with rejected drafts: the accepted results may not move with the drafts' finite values (hard), and a
# NaN draft that reaches them only through a window's arithmetic is a finding (FAIL only when strict)
DRAFTS, WINDOW_NAN = "drafts", "window-nan"
INPUT_NAMES = ("q", "k", "v", "g", "b", "w")
# what a kernel's contract says of its outputs at padding rows and tokens of no live sequence: exact zeros (the
# default), or unwritten (never stored, never read by the engine: not judged)
PADDING_OUTPUTS = ("zero", "unwritten")


def dtype_name(x):
    """The dtype name of an array (``bfloat16`` for ml_dtypes' bfloat16)."""
    return np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype).name


def _f64(x):
    return np.asarray(x).astype(np.float64)


# --- what a session is made of ----------------------------------------------------------------------------------

class _Call:
    """The reference of one call: masks, reference outputs and states, slots (float64 chain)."""

    def __init__(self, call, result, plan):
        B, T = call.q.shape[:2]
        live = np.zeros((B, T), bool)
        for s in plan.sequences:
            live[s.row, s.start:s.start + s.length] |= s.live
        self.judged = live & np.all(np.isfinite(result.o), axis=(2, 3))
        first = np.zeros((B, T), bool)
        for s in plan.sequences:
            if s.live:
                first[s.row, s.start] = True
        self.first = first[self.judged]  # among the judged tokens: the first token of a live sequence
        self.idle = ~live
        self.o = result.o[self.judged]
        self.written = result.written_slots
        self.state_slots = np.array([s for s in result.written_slots if np.all(np.isfinite(result.pool[s]))],
                                    np.int64)
        self.state = result.pool[self.state_slots]
        self.plan = plan


class _Metric:
    """§4's err_ratio and max_err over a result concatenated across calls, accumulated call by call, with a
    per-call profile (``rms`` of the call's error over the result's scale)."""

    def __init__(self, n_calls):
        self.d2 = self.r2 = 0.0
        self.n = 0
        self.dmax = self.rmax = 0.0
        self.first_bad = None  # first call with a non-finite value
        self.calls = np.zeros((n_calls, 2))  # per call: sum of squared errors, count

    def add(self, i, got, ref):
        got = _f64(got)
        if got.size == 0:
            return
        self.r2 += float(np.sum(np.square(ref)))
        self.rmax = max(self.rmax, float(np.max(np.abs(ref))))
        self.n += ref.size
        if not np.all(np.isfinite(got)):
            self.first_bad = i if self.first_bad is None else self.first_bad
            self.calls[i] = (math.inf, ref.size)
            return
        d = got - ref
        d2 = float(np.sum(np.square(d)))
        self.d2 += d2
        self.dmax = max(self.dmax, float(np.max(np.abs(d))))
        self.calls[i] += (d2, ref.size)

    @property
    def scales(self):
        return (max(math.sqrt(self.r2 / self.n), ABS_FLOOR) if self.n else ABS_FLOOR), max(self.rmax, ABS_FLOOR)

    def errors(self):
        """``(err_ratio, max_err)``; inf when some value was not finite, 0 when nothing was judged."""
        if self.first_bad is not None:
            return math.inf, math.inf
        if not self.n:
            return 0.0, 0.0
        s_rms, s_max = self.scales
        return math.sqrt(self.d2 / self.n) / s_rms, self.dmax / s_max

    def profile(self):
        """Per call: rms of its error over the result's rms scale (inf: non-finite; 0: nothing judged)."""
        d2, n = self.calls[:, 0], self.calls[:, 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, np.sqrt(d2 / np.maximum(n, 1)) / self.scales[0], 0.0)


class Session(CachedCase):
    """A scripted serving session as the judge's case, built from an :class:`oracle.serving.SessionScript`:
    ``calls`` (:class:`oracle.serving.DecodeCall`) chained from the initial ``pool`` ``[P, HV, K, V]`` (float64
    values exact in float32; a kernel can be judged on it when they are exact in its pool dtype too: the recipes'
    pools are exact in bfloat16 and float16, so one reference serves every pool dtype), inputs exact in ``dtype``
    (the kernel's input dtype, float32 or bfloat16).

    The float64 reference and the baselines are computed once (lazily) and shared by every kernel judged on it.
    ``mode`` (a serving mode of the registry; the script's default otherwise), ``regime`` and ``purpose``
    describe it in reports: ``Session(name, calls, pool, **fields)`` takes the script's fields,
    :meth:`from_script` a script. ``family``: the script's; a family session is judged as the GDN-2 session it is (a
    runner hands a family kernel its inputs in FLA's signature, ``ci/running/serving.py``).
    """

    def __init__(self, name, calls, pool, **fields):
        script = serving.SessionScript(name, tuple(calls), pool, **fields)
        self.name, self.calls, self.dtype, self.mode = script.name, list(script.calls), script.dtype, script.mode
        self.modes = (self.mode,)
        self.regime, self.purpose = dict(script.regime or {}), script.purpose
        self.family = script.family  # gdn2, or a family whose kernels are called in FLA's signature (same reference)
        self.pool = np.asarray(script.pool, np.float64)
        if not self.calls:
            raise ValueError("calls: a session needs at least one call")
        if self.pool.ndim != 4:
            raise ValueError(f"pool: expected [P, HV, K, V], got shape {self.pool.shape}")
        if not self.exact_in("float32"):
            raise ValueError("pool: values are not exact in float32")
        for i, c in enumerate(self.calls):
            for n, x in zip(INPUT_NAMES, c.inputs()):
                if not np.array_equal(round_to(x, self.dtype), x, equal_nan=True):
                    raise ValueError(f"calls[{i}].{n}: values are not exact in {self.dtype}")
        self._ref = None
        self._base = {}
        self._poisoned = {}

    @classmethod
    def from_script(cls, script):
        """The session of an :class:`oracle.serving.SessionScript` (a recipe's, ``oracle/serving_recipes.py``)."""
        return cls(**{f.name: getattr(script, f.name) for f in dataclasses.fields(script)})

    def exact_in(self, state_dtype):
        """Whether the initial pool is exact in ``state_dtype`` (a kernel with that pool dtype can be judged)."""
        return np.array_equal(serving.round_state(self.pool, state_dtype), self.pool, equal_nan=True)

    # -- identity --
    @property
    def shape(self):
        """``(P, HV, K, V)`` of the pool."""
        return self.pool.shape

    def tokens(self):
        """Token positions over all calls (``sum B * T``)."""
        return sum(int(np.prod(c.q.shape[:2])) for c in self.calls)

    def describe(self):
        return {"case": self.name, "source": "serving", "mode": self.mode, "dtype": self.dtype,
                **({"family": self.family} if self.family != serving.GDN2 else {}),
                "shape": list(self.pool.shape), "calls": len(self.calls), "tokens": self.tokens(),
                **({"regime": self.regime} if self.regime else {}), **({"purpose": self.purpose} if self.purpose
                                                                        else {})}

    def release(self):
        """Drop the cached reference, baselines and poisoned calls."""
        self._ref, self._base, self._poisoned = None, {}, {}

    # -- rejected drafts --
    def rejected(self):
        """Per call, the ``[B, T]`` mask of its rejected drafts (``serving_recipes.rejected_drafts``: live tokens fed
        NaN, which the reference never reads)."""
        return [recipes.rejected_drafts(c, self.pool.shape[0]) for c in self.calls]

    @property
    def has_drafts(self):
        """Whether some call has rejected drafts (then a kernel runs them finite, :meth:`poisoned`)."""
        if "any" not in self._poisoned:
            self._poisoned["any"] = any(m.any() for m in self.rejected())
        return self._poisoned["any"]

    def poisoned(self, poisoning):
        """The calls with their rejected drafts filled with finite values (``serving_recipes.finite_drafts``,
        ``poisoning`` one of ``POISONINGS``); the reference stays the NaN script's."""
        if poisoning not in self._poisoned:
            self._poisoned[poisoning] = recipes.finite_drafts(self.calls, self.pool.shape[0], self.dtype, self.family,
                                                              poisoning)
        return self._poisoned[poisoning]

    # -- the oracle --
    def chain(self, **options):
        """Yield ``(call, DecodeResult, plan)`` of the oracle chained over the calls (``DecodeCall.apply``
        options: ``dtype``, ``store_dtype``, ``carry_dtype``); the pool is carried in the working precision."""
        dtype = options.get("dtype", np.float64)
        pool = self.pool.astype(dtype)
        for c in self.calls:
            r = c.apply(pool, **options)
            yield c, r, c.plan(pool.shape[0])
            pool = r.pool

    def reference(self):
        """The per-call float64 references (list of :class:`_Call`), computed once."""
        if self._ref is None:
            self._ref = self._timed(lambda: [_Call(c, r, p) for c, r, p in self.chain()])
        return self._ref

    def baseline(self, kind, o_dtype, state_dtype):
        """``{"o": (err_ratio, max_err), "state": (...)}`` of a float32 oracle chain against the reference, its
        results rounded to the kernel's result dtypes. ``kind``: ``rec`` (float32 pool), ``store`` (every stored
        state rounded to ``state_dtype``), ``loop:DT`` (the running state rounded to DT after every token),
        ``replay:L:CHECKPOINT`` (the replay representation with rings of L, ``oracle/replay.py``, its caches stored in
        ``state_dtype`` and its checkpoint in CHECKPOINT; its states are the ones it encodes, not rounded again)."""
        key = (kind, o_dtype, state_dtype)
        if key not in self._base:
            options = {"dtype": np.float32}
            if kind == "store":
                options["store_dtype"] = state_dtype
            elif kind.startswith("loop:"):
                options["carry_dtype"] = kind[5:]
                options["store_dtype"] = state_dtype
            ref = self.reference()

            def runs():
                if kind.startswith("replay:"):
                    _, L, checkpoint = kind.split(":")
                    yield from replay.chain(self, int(L), arith=Arith(np.float32), store_dtype=state_dtype,
                                            checkpoint_dtype=checkpoint)
                    return
                for _, r, _ in self.chain(**options):
                    yield r.o, serving.round_state(r.pool, state_dtype)

            def errors():
                m = {n: _Metric(len(ref)) for n in GRADED}
                for i, ((o, pool), rc) in enumerate(zip(runs(), ref)):
                    with np.errstate(invalid="ignore"):
                        m["o"].add(i, serving.round_state(o[rc.judged], o_dtype), rc.o)
                        m["state"].add(i, pool[rc.state_slots], rc.state)
                return {n: x.errors() for n, x in m.items()}

            self._base[key] = self._timed(errors)
        return self._base[key]

    def peak_output(self):
        """The largest |o| of the float64 reference over the session's judged outputs."""
        return max((float(np.max(np.abs(rc.o))) for rc in self.reference() if rc.o.size), default=0.0)

    def judge(self, state_dtype, o_dtype=None, replay_capacity=None, replay_storage=None, padding_output="zero"):
        """A :class:`SessionJudge` for a kernel whose pool is stored in ``state_dtype`` (or, with
        ``replay_capacity``, a replay representation with rings of that many entries, its checkpoint and caches
        stored in ``replay_storage = (checkpoint dtype, cache dtype)``), its padding outputs as ``padding_output``
        (:data:`PADDING_OUTPUTS`) says."""
        return SessionJudge(self, state_dtype, o_dtype, replay_capacity, replay_storage, padding_output)

    def initial_pool(self):
        """The initial pool (float64 values; the runner casts it to the kernel's pool dtype, exactly)."""
        return self.pool.copy()


# --- the judgement ----------------------------------------------------------------------------------------------

def stored_state_bound(e_rec, e_store, result_dtype, state_dtype):
    """``(tol, bound)`` of one metric: ``tol = max(MULTIPLE[result] e_rec, FLOOR[result])``, ``bound = max(tol,
    MULTIPLE[state dtype] e_store)`` (a non-finite ``e_store`` is ignored)."""
    tol = tolerance(e_rec, result_dtype)
    return tol, (max(tol, MULTIPLE[state_dtype] * e_store) if math.isfinite(e_store) else tol)


class SessionJudge:
    """Judges one kernel on a :class:`Session`, call by call: :meth:`add` each call's results (NumPy arrays in
    the dtypes the kernel returned), then :meth:`report`. ``replay_capacity``: the kernel keeps replay states (a
    checkpoint and rings of that many entries, stored in ``replay_storage = (checkpoint dtype, cache dtype)``, default
    both ``state_dtype``); its driver hands over the pool they encode, in float64, and its baselines are the replay
    representation's (``Session.baseline``). ``state_dtype`` sets the bound's multiple: the coarser of the two.
    ``padding_output``: ``"zero"`` (padding outputs must be exact zeros) or ``"unwritten"`` (not judged)."""

    def __init__(self, session, state_dtype, o_dtype=None, replay_capacity=None, replay_storage=None,
                 padding_output="zero"):
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype: {state_dtype!r} not one of {STATE_DTYPES}")
        if padding_output not in PADDING_OUTPUTS:
            raise ValueError(f"padding_output: {padding_output!r} not one of {PADDING_OUTPUTS}")
        self.padding_output = padding_output
        if not session.exact_in(state_dtype):
            raise ValueError(f"state_dtype: session {session.name!r} starts from a pool not exact in {state_dtype}")
        self.session, self.state_dtype, self.o_dtype = session, state_dtype, o_dtype
        self.replay_capacity = replay_capacity
        self.replay_storage = tuple(replay_storage or (state_dtype, state_dtype))
        self.pool_dtype = state_dtype if replay_capacity is None else "float64"  # what a driver hands over
        self.ref = session.reference()
        n = len(self.ref)
        self.metrics = {name: _Metric(n) for name in GRADED}
        self.changed = []  # (call, [slots]) that changed but must not
        self.nonzero = []  # (call, count) of nonzero idle outputs
        self.idle_total = self.keep_total = 0
        self.first_token = np.zeros(n)  # per call: largest error at a sequence's first token / max|o| of the call
        self.per_sequence = []  # per call: o's errors per live sequence, the state's per slot (sequence_errors)
        # per call: the kernel's judged values, kept for a session with rejected drafts (compare_runs)
        self.judged = {name: [] for name in GRADED} if session.has_drafts else None
        self.done = 0

    def add(self, i, o, pool_before, pool_after):
        """Judge call ``i``: its outputs ``o`` and the pool before and after it (the kernel's own arrays)."""
        if i != self.done:
            raise ValueError(f"i: calls must be added in order, expected call {self.done}, got {i}")
        rc = self.ref[i]
        o_dtype, p_dtype = dtype_name(o), dtype_name(pool_after)
        self.o_dtype = self.o_dtype or o_dtype
        if o_dtype not in STATE_DTYPES:
            raise ValueError(f"o: call {i} returned o as {o_dtype}; a serving kernel returns o in one of "
                             f"{', '.join(STATE_DTYPES)}")
        if o_dtype != self.o_dtype:
            raise ValueError(f"o: call {i} returned {o_dtype}, earlier calls {self.o_dtype}")
        if p_dtype != self.pool_dtype or dtype_name(pool_before) != self.pool_dtype:
            raise ValueError(f"state_pool: call {i} returned the pool in {p_dtype}, expected {self.pool_dtype} "
                             "(the dtype it was handed)")
        o, before, after = np.asarray(o), np.asarray(pool_before), np.asarray(pool_after)
        if o.shape != rc.judged.shape + rc.o.shape[1:] or after.shape != before.shape:
            raise ValueError(f"o: call {i} returned o {o.shape} and a pool {after.shape}, expected "
                             f"{rc.judged.shape + rc.o.shape[1:]} and {before.shape}")
        o64 = _f64(o)
        self.metrics["o"].add(i, o64[rc.judged], rc.o)
        if self.judged is not None:
            self.judged["o"].append(o64[rc.judged])
            self.judged["state"].append(_f64(after[rc.state_slots]))
        if rc.first.any():
            d = np.abs(o64[rc.judged][rc.first] - rc.o[rc.first])
            scale = max(float(np.max(np.abs(rc.o))), ABS_FLOOR)
            self.first_token[i] = float(np.max(d)) / scale if np.all(np.isfinite(d)) else math.inf
        self.metrics["state"].add(i, _f64(after[rc.state_slots]), rc.state)
        self.per_sequence.append(sequence_errors(rc, o64, after))
        idle = o64[rc.idle]
        self.idle_total += idle.size
        if np.any(idle != 0):  # NaN counts as nonzero
            self.nonzero.append((i, int(np.sum(idle != 0))))
        keep = np.setdiff1d(np.arange(before.shape[0]), rc.written)
        self.keep_total += keep.size
        diff = [int(s) for s in keep if before[s].tobytes() != after[s].tobytes()]
        if diff:
            self.changed.append((i, diff))
        self.done += 1

    def baselines(self, o_dtype):
        """``(rec, store)``: the session's baselines for this kernel (``Session.baseline``)."""
        s = self.session
        if self.replay_capacity is not None:
            checkpoint, cache = self.replay_storage
            rec = s.baseline(f"replay:{int(self.replay_capacity)}:float32", o_dtype, "float32")
            exact = checkpoint == cache == "float32"
            return rec, (rec if exact else s.baseline(f"replay:{int(self.replay_capacity)}:{checkpoint}", o_dtype,
                                                      cache))
        rec = s.baseline("rec", o_dtype, self.state_dtype)
        return rec, (s.baseline("store", o_dtype, self.state_dtype) if self.state_dtype != "float32" else rec)

    def report(self) -> Report:
        """The graded :class:`tolerance.Report`: verdicts ``o``, ``state``, ``untouched``, ``padding`` and, when not
        PASS, a diagnosis; ``profiles`` holds the per-call error profiles of results over their tolerance."""
        if self.done != len(self.ref):
            raise ValueError(f"report: {self.done} of {len(self.ref)} calls were added")
        s = self.session
        o_dtype = self.o_dtype or s.dtype
        rec, store = self.baselines(o_dtype)
        report = Report(dtype=s.dtype)
        for name in GRADED:
            m = self.metrics[name]
            rdt = o_dtype if name == "o" else self.state_dtype
            errs = m.errors()
            (tr, br), (tm, bm) = (stored_state_bound(rec[name][j], store[name][j], rdt, self.state_dtype)
                                  for j in (0, 1))
            over = not (errs[0] <= tr and errs[1] <= tm)
            note = (f"stored-state bound: {MULTIPLE[self.state_dtype]:g} x e_store ({self.state_dtype} pool)"
                    if over and self.state_dtype != "float32" else "")
            v = grade(name, errs, (tr, tm), (br, bm), note=note,
                      rule="recurrence" if MULTIPLE[rdt] * rec[name][0] >= FLOOR[rdt] else "floor",
                      non_finite_note="; ".join(x for x in (f"NaN or inf in a result (first at call {m.first_bad})",
                                                            note) if x))
            report.verdicts.append(v)
            if v.grade != PASS:
                report.profiles[name] = m.profile()
        n_changed = sum(len(d) for _, d in self.changed)
        note = (f"call {self.changed[0][0]}: slots {self.changed[0][1]} changed; {len(self.changed)} call(s)"
                if self.changed else "")
        report.verdicts.append(Verdict("untouched", n_changed / max(self.keep_total, 1), float(n_changed > 0),
                                       0.0, 0.0, "bit-identical", not self.changed, note))
        report.verdicts.append(self.padding_verdict())
        if not report.passed:
            report.diagnosis = diagnose(self, report, rec, store)
        return report


    def padding_verdict(self):
        """The hard verdict ``padding``: exact zeros at padding rows and tokens of no live sequence, or, for a kernel
        whose contract leaves them unwritten, nothing judged there (said in its note; ``untouched`` judges the pool)."""
        if self.padding_output == "unwritten":
            return Verdict("padding", 0.0, 0.0, 0.0, 0.0, "unwritten", True,
                           f"not judged: the kernel's contract leaves o unwritten at {self.idle_total} padding "
                           "value(s) (padding_output=unwritten); its pool is judged by untouched")
        n_nonzero = sum(c for _, c in self.nonzero)
        note = (f"call {self.nonzero[0][0]}: {self.nonzero[0][1]} nonzero values; {len(self.nonzero)} call(s)"
                if self.nonzero else "")
        return Verdict("padding", n_nonzero / max(self.idle_total, 1), float(n_nonzero > 0), 0.0, 0.0, "exact-zero",
                       not self.nonzero, note)


# --- rejected drafts: two runs with other values in them ---------------------------------------------------------

def compare_runs(a, b):
    """How far judge ``b``'s judged results are from judge ``a``'s (two runs of one kernel on a session whose
    rejected drafts hold other values): ``{result: (err_ratio, max_err, first call that differs or None)}`` with
    §4's metrics on ``a``'s scales; NaN at the same place in both runs counts as equal (the grade sees it)."""
    out = {}
    for name in GRADED:
        s_rms, s_max = a.metrics[name].scales
        d2, n, dmax, first = 0.0, 0, 0.0, None
        for i, (x, y) in enumerate(zip(a.judged[name], b.judged[name])):
            with np.errstate(invalid="ignore"):
                d = np.where(np.isnan(x) & np.isnan(y), 0.0, x - y)
            n += d.size
            if d.size and first is None and np.any(d != 0):
                first = i
            if not np.all(np.isfinite(d)):
                d2 = dmax = math.inf
                continue
            d2 += float(np.sum(np.square(d)))
            dmax = max(dmax, float(np.max(np.abs(d))) if d.size else 0.0)
        out[name] = (math.sqrt(d2 / n) / s_rms if n else 0.0, dmax / s_max, first)
    return out


def drafts_verdict(diff, report, what):
    """The hard verdict :data:`DRAFTS`: every judged result of two runs (``diff``, :func:`compare_runs`) within
    ``AGREE_FRACTION`` of its tolerance in ``report`` (the first run's); ``what`` names the two runs."""
    tol = {v.name: (AGREE_FRACTION * v.tol_ratio, AGREE_FRACTION * v.tol_max) for v in report.verdicts
           if v.name in GRADED}
    ratios = {name: max(e / t if t > 0 else (math.inf if e > 0 else 0.0) for e, t in zip(diff[name][:2], tol[name]))
              for name in GRADED}
    worst = max(GRADED, key=lambda name: ratios[name])
    err, big, _ = diff[worst]
    firsts = [diff[name][2] for name in GRADED if diff[name][2] is not None]
    note = ("bit-identical" if not firsts else
            f"{what}: {worst} differs by err_ratio {err:.2g} from call {min(firsts)}")
    return Verdict(DRAFTS, err, big, *tol[worst], f"{what} ({AGREE_FRACTION:.3g} x the tolerance)",
                   ratios[worst] <= 1.0, note)


def window_nan_verdict(nan_report, first_call, strict):
    """The verdict :data:`WINDOW_NAN` of a kernel whose NaN-drafts run (``nan_report``) has non-finite accepted
    results although its runs with finite drafts are finite and agree: FAIL when ``strict``, else PASS with the
    finding in its note."""
    bad = [v.name for v in nan_report.verdicts if v.name in GRADED and v.rule == "non-finite"]
    note = f"NaN drafts: {', '.join(bad)} non-finite from call {first_call}; graded on the finite drafts" + (
        " (strict: FAIL)" if strict else "")
    return Verdict(WINDOW_NAN, 1.0, 1.0, 0.0, 0.0, "strict" if strict else "finding", not strict, note)


# --- diagnosis ------------------------------------------------------------------------------------------------

def diagnosis_text(report):
    """One line per finding (empty for a PASS report)."""
    return "\n".join(str(f) for f in report.diagnosis)


# --- agreement: two runs of one kernel that must give the same results (other call splits, a replay) ------------

def agreement(what, a, b, ref, errors, result_dtypes, state_dtype):
    """Judge results ``a`` against ``b`` (mappings name -> array, e.g. ``{"o": ..., "state": ...}``) that should
    agree: per name, errors normalised by the reference ``ref[name]``'s scales (§4), within
    ``max(AGREE_FRACTION x MULTIPLE[result] x e_rec, AGREE_FRACTION x MULTIPLE[state dtype] x e_store,
    FLOOR[result])`` (+ one ulp of a 16-bit result at its largest element), ``errors[name]`` being the largest
    ``(e_rec, e_store)`` pair of the two runs' sessions (each a ``(err_ratio, max_err)`` pair). A Report (PASS or
    FAIL)."""
    report = Report()
    for name in a:
        r = np.asarray(ref[name], np.float64)
        s_rms = max(math.sqrt(float(np.mean(np.square(r)))), ABS_FLOOR)
        s_max = max(float(np.max(np.abs(r))), ABS_FLOOR)
        x, y = _f64(a[name]), _f64(b[name])
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            e = (math.inf, math.inf)
        else:
            d = x - y
            e = (math.sqrt(float(np.mean(np.square(d)))) / s_rms, float(np.max(np.abs(d))) / s_max)
        rdt = result_dtypes[name]
        (rec, store) = errors[name]
        tol = tuple(agreement_tolerance(rec[j], rdt, rdt, store[j], state_dtype) for j in (0, 1))
        report.verdicts.append(grade(f"{name} ({what})", e, tol, rule=f"{what} ({AGREE_FRACTION:.3g} x the serving "
                                                                      "bound)", non_finite_note=""))
    return report


def largest_errors(*pairs):
    """Elementwise largest of some ``{"o": (rec, store), ...}`` error mappings (see :func:`agreement`)."""
    out = {}
    for p in pairs:
        for name, (rec, store) in p.items():
            r0, s0 = out.get(name, ((0.0, 0.0), (0.0, 0.0)))
            out[name] = (tuple(max(u, v) for u, v in zip(r0, rec)), tuple(max(u, v) for u, v in zip(s0, store)))
    return out


def session_errors(session, o_dtype, state_dtype):
    """``{"o": (e_rec, e_store), "state": (...)}`` of a session for a kernel's result dtypes (for :func:`agreement`)."""
    rec = session.baseline("rec", o_dtype, state_dtype)
    store = session.baseline("store", o_dtype, state_dtype) if state_dtype != "float32" else rec
    return {n: (rec[n], store[n]) for n in GRADED}
