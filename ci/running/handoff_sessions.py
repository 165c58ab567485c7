"""Hand-off sessions run: a PREFILL kernel's final states handed into a DECODE kernel's storage, decoded there, judged.

The prefill runs on a family training-call kernel (FLA's signature, as validate calls it: ``o, final_state = fn(q, k,
v, g, beta, initial_state=None, output_final_state=True, cu_seqlens=...)``, the final states ``[N, HV, K, V]``
float32); the session driver of the decode kernel (``ci/running/drivers.py``) writes them into its storage in its
declared layout and dtype when it starts (a pool slot rounded once to its ``state_dtype``, transposed for its
``[V, K]`` pool by the runner; a replay kernel's checkpoint load), then runs the decode calls. Judged by
``ci/grading/handoff_judge.py`` (verdicts ``prefill``, ``hand-off``, ``request``) and the decode judge
(``ci/grading/serving.py``: the decode from the handed state). docs/DESIGN.md §2, "Hand-off sessions".

:class:`HandoffRun` is one run; :class:`HandoffCase` one session as validate's case (``--prefill SPEC --modes``
with the registry's hand-off mode, ``oracle.handoff_recipes.MODE``); :func:`cases` gives them.
"""

from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np

from gdn2_oracle.oracle import handoff_recipes as recipes
from gdn2_oracle.oracle.serving import V_FIRST_KEYWORD, round_state

from ..grading import handoff_judge as judge
from ..grading.result import CaseResult
from ..grading.serving import Session
from ..grading.tolerance import Report
from . import families
from .harness import guarded, to_device
from .serving import SessionRun, driver

MODE = recipes.MODE  # the registry's mode that selects these sessions (validate --modes)


def prefill_states(fn, script, dtype):
    """The final states ``[N, HV, K, V]`` (float32, FLA's layout) of prefill kernel ``fn`` on ``script``'s prefill
    with inputs in ``dtype``."""
    inputs, cu = script.prefill_inputs()
    xs = [to_device(x, dtype) for x in inputs.values()]
    out = fn(*xs, initial_state=None, output_final_state=True, cu_seqlens=jnp.asarray(np.asarray(cu, np.int32)))
    if not isinstance(out, (tuple, list)) or len(out) < 2 or out[1] is None:
        raise ValueError("final_state: the prefill kernel returned no final state (output_final_state=True)")
    final = np.asarray(out[1], np.float32)
    want = (len(script.slots),) + script.pool.shape[1:]
    if final.shape != want:
        raise ValueError(f"final_state: the prefill kernel returned shape {final.shape}, expected {want}")
    return final


def storage_dtype(drv):
    """The dtype a driver stores a handed-over state in: its pool's, or a replay kernel's checkpoint dtype."""
    storage = getattr(drv, "replay_storage", None)
    return storage[0] if storage else drv.state_dtype


class HandoffRun:
    """Prefill kernel ``prefill`` and decode kernel ``decoder`` on a :class:`oracle.handoff_recipes.HandoffScript`:
    ``states`` (what the prefill hands over), ``session`` (the decode judge's session from the handed states),
    ``decode_run`` (its :class:`SessionRun`) and ``report`` (every verdict and the diagnosis)."""

    def __init__(self, prefill, decoder, script, *, v_first=False):
        self.script = script
        self.storage = storage_dtype(driver(decoder, script.family, v_first))
        got = prefill_states(prefill, script, script.dtype)
        self.prefill_got = got
        self.states = got if script.installed is None else round_state(got, script.installed)
        self.session = Session.from_script(script.session(self.states, self.storage))
        self.decode_run = SessionRun(decoder, self.session, keep=True, v_first=v_first)
        self.report = self._judge()

    def _judge(self):
        script, run = self.script, self.decode_run
        slots = [s for group in script.slots for s in group]
        expected = script.handed_pool(self.states, self.storage)
        transfer = judge.transfer_verdict(run.initial_pool, expected, slots)
        o_dtype = run.judge.o_dtype or script.dtype
        if script.installed is None:
            exact, f32 = script.prefill_states(), script.prefill_states(np.float32)
            verdicts = [judge.prefill_verdict(self.prefill_got, exact, f32)]
        else:  # a given state: the oracle continues from that same state
            exact = f32 = self.states
            verdicts = []
        storage = None if self.storage == "float32" else self.storage
        ref = recipes.request_chain(script, exact)
        base = recipes.request_chain(script, np.asarray(f32, np.float32), np.float32, storage)
        masks = [rc.judged for rc in run.judge.ref]
        cat = [np.concatenate([np.asarray(x[m], np.float64).ravel() for x, m in zip(xs, masks)])
               for xs in ([o for o, _ in run.kept], [r.o for r in ref], [r.o for r in base])]
        request = judge.request_verdict(*cat, o_dtype)
        decoding = run.report
        report = Report(dtype=script.dtype)
        report.verdicts = verdicts + [transfer] + list(decoding.verdicts) + [request]
        report.profiles = dict(decoding.profiles or {})
        if not report.passed:
            found = []
            if verdicts:
                found += judge.prefill_findings(verdicts[0], self.prefill_got, exact, script.chunk_early_states(),
                                                script.lengths, recipes.CHUNK, self.storage)
            found += judge.transfer_findings(transfer, run.initial_pool, expected, slots)
            found += judge.fork_findings(run.judge.changed, [rc.plan for rc in run.judge.ref])
            if not found and not decoding.passed:
                found += list(decoding.diagnosis)
            report.diagnosis = [dataclasses.replace(f, primary=k == 0) for k, f in enumerate(found)]
        return report


class HandoffCase:
    """A hand-off session as validate's case (``ci/running/cases.py``'s protocol): the decode kernel is the kernel
    judged, ``prefill`` the kernel that prefills; ``v_first``: the decode kernel's ``[V, K]`` pool (the case
    ``<name>_vk``, for kernels that take FLA's layout keyword)."""

    compiles_ahead = False

    def __init__(self, script, prefill, prefill_name, v_first=False):
        self.script, self.prefill, self.prefill_name, self.v_first = script, prefill, prefill_name, bool(v_first)
        self.name = script.name + ("_vk" if v_first else "")
        self.dtype, self.mode, self.modes = script.dtype, script.mode, (script.mode,)
        self.family = script.family
        self.shape = script.pool.shape
        self.flags = (V_FIRST_KEYWORD,) if v_first else ()

    def describe(self):
        return {"case": self.name, "source": "hand-off", "mode": recipes.MODE, "dtype": self.dtype,
                "family": self.family, "shape": list(self.shape), "prefill": self.prefill_name,
                "lengths": list(self.script.lengths), "calls": len(self.script.calls),
                **({"installed": self.script.installed} if self.script.installed else {}),
                **({"pool_layout": "[P, HV, V, K]"} if self.v_first else {}), "purpose": self.script.purpose}

    def run(self, fn, mesh=None, *, capture=False, program=None) -> CaseResult:
        """Judge decode kernel ``fn`` on the session prefilled by :attr:`prefill`; a kernel that raises fails."""
        t0 = time.perf_counter()
        try:
            with guarded():
                run = HandoffRun(self.prefill, fn, self.script, v_first=self.v_first)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises fails this case
            return CaseResult.failed(self.describe(), exc, time.perf_counter() - t0)
        return CaseResult.judged(self.describe(), run.report, time.perf_counter() - t0)

    def release(self):
        pass


def session_family(prefill, family=None):
    """The family the sessions are written in: ``family`` when given, else the prefill kernel's (``prefill`` ``(kernel,
    spec text)``; its ``family`` attribute), else Gated DeltaNet's (a prefill of no FLA family fails its verdicts)."""
    if family is None:
        try:
            family = families.kernel_family(prefill[0], label=prefill[1])
        except ValueError:
            family = None
    return family if family in recipes.FAMILIES else recipes.FAMILY


def cases(prefill, modes, dtypes=("float32",), seed=0, only=None, family=None):
    """The hand-off cases (each script in both pool layouts; of the names in ``only`` when given) when ``modes``
    selects the registry's hand-off mode and ``prefill`` ``(kernel, spec text)`` is given, in
    :func:`session_family`; else none."""
    if prefill is None or recipes.MODE not in modes:
        return []
    scripts = recipes.scripts(tuple(dtypes), seed, session_family(prefill, family))
    out = [HandoffCase(s, *prefill, v) for s in scripts for v in (False, True)]
    return [c for c in out if only is None or c.name in only]

