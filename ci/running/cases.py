"""A case put to work: ``case.run(kernel, mesh) -> CaseResult``, the running floor's half of the case protocol.

Every case kind the judge has -- :class:`DenseCase` (the plain contract), :class:`CallCase` (a training call in
its modes), :class:`FamilyRunCase` (a KDA or Gated DeltaNet call in FLA's signature), ``serving.ServingCase`` (a
serving session) -- has the same small interface: ``name``, ``dtype``, ``shape``, ``modes``, ``describe()``,
``release()`` and ``run(kernel, mesh=None, *, capture=False, program=None)``
returning a :class:`ci.grading.result.CaseResult`. The oracle's side of a case (data, reference, baselines, the
judgement) is the grading floor's (``ci/grading/case.py``, ``ci/grading/modes.py``, ``ci/grading/serving.py``); this
module only runs the kernel on the case's data and hands its results to the case's judge.
"""

from __future__ import annotations

import inspect
import time

from gdn2_oracle import oracle

from ..grading import family_diagnosis
from ..grading.case import Case
from ..grading.families import FamilyCase
from ..grading.modes import ModeCase
from ..grading.result import INPUT_ERROR, CaseResult
from . import harness, modes


class Runs:
    """``run`` for a case with ``data()``, a kernel call (:meth:`results`), a judge (:meth:`graded`), the reference
    (:meth:`reference_for`) and the names of its data (:meth:`inputs`).

    A subclass whose dataclass fields name one of these methods (:data:`PROTOCOL`) is refused when defined: an
    instance's field would hide the method (a case's ``exact`` field once made ``--dump`` call None)."""

    PROTOCOL = ("data", "results", "graded", "reference_for", "inputs", "describe", "release", "ahead", "run")
    compiles_ahead = False  # whether :meth:`ahead` gives the kernel's program, traced and compiled ahead of the case

    def __init_subclass__(cls, **kw):
        """TypeError naming a dataclass field of ``cls`` that would hide a method of :data:`PROTOCOL`."""
        super().__init_subclass__(**kw)
        fields = {*getattr(cls, "__dataclass_fields__", {}), *inspect.get_annotations(cls)}  # inherited, its own
        clash = sorted(fields & set(Runs.PROTOCOL))
        if clash:
            raise TypeError(f"{cls.__name__}: field(s) {clash} would hide the case method(s) of the same name")

    def run(self, fn, mesh=None, *, capture=False, program=None) -> CaseResult:
        """Judge kernel ``fn`` on this case: an input error when the case's data cannot be built (nothing known of the
        kernel), an error when the kernel raises, else the graded report. ``capture`` (``--dump``): the result's
        ``arrays`` hold ``{"input", "got", "ref", "profile"}`` (the last three only for a case not graded PASS)."""
        t0 = time.perf_counter()
        try:
            data = self.data()
        except Exception as exc:  # noqa: BLE001 - a bad input is reported for this case; the others are judged
            return CaseResult.failed(self.describe(), exc, time.perf_counter() - t0, kind=INPUT_ERROR,
                                     arrays={} if capture else None)
        arrays = {"input": self.inputs(*data)} if capture else None
        try:
            got = self.results(fn, data, mesh, program)
        except Exception as exc:  # noqa: BLE001 - any kernel failure is a failed case, reported by name
            return CaseResult.failed(self.describe(), exc, time.perf_counter() - t0, arrays=arrays)
        report = self.graded(fn, got)
        result = CaseResult.judged(self.describe(), report, time.perf_counter() - t0, arrays=arrays)
        if capture and not result.passed:  # only a dumped case keeps its arrays (the reference is cached by the case)
            ref = self.reference_for(fn)
            arrays.update(got=dict(got), ref={n: ref[n] for n in got if n in ref}, profile=dict(report.profiles))
        return result


class DenseCase(Runs, Case):
    """A dense case (:class:`ci.grading.case.Case`) that runs a kernel through ``harness.kernel_results``."""

    compiles_ahead = True

    def ahead(self, fn, program_cache=True):
        """``(signature, lower)`` of kernel ``fn``'s program on this case (``ci.running.ahead``): lowered through the
        program cache unless ``program_cache`` is false."""
        problem = self.data()[0]
        return (harness.program_signature(fn, problem, self.dtype),
                lambda: harness.lower(fn, problem, self.dtype, cache=program_cache))

    def results(self, fn, data, mesh, program):
        problem, do, dfs = data
        harness.check_representable(problem, self.dtype)
        return harness.kernel_results(fn, problem, do, dfs, dtype=self.dtype, mesh=mesh, program=program)

    def graded(self, fn, got):
        return self.judge(got)

    def reference_for(self, fn):
        """The reference results the kernel ``fn`` is judged against."""
        return self.reference()

    @staticmethod
    def inputs(problem, do, dfs):
        """The arrays of a dense case's data by name: q..w, h0 and the cotangents do, dfinal_state."""
        return {**dict(zip(oracle.INPUTS, problem.inputs())), "h0": problem.h0(), "do": do, "dfinal_state": dfs}


class CallCase(Runs, ModeCase):
    """A training-call case (:class:`ci.grading.modes.ModeCase`) run through ``modes.mode_results``; its states at
    chunk starts are judged at the kernel's chunk size (``modes.kernel_chunk_size``)."""

    def results(self, fn, data, mesh, program):
        call, do, dfs = data
        modes.check_representable(call, self.dtype)
        return modes.mode_results(fn, call, do, dfs, dtype=self.dtype, mesh=mesh)

    def graded(self, fn, got):
        return self.judge(got, chunk_size=modes.kernel_chunk_size(fn), names=modes.judged_names(fn, self.call))

    def reference_for(self, fn):
        """The reference, its states at chunk starts at the kernel ``fn``'s chunk size."""
        return self.reference(chunk_size=modes.kernel_chunk_size(fn))

    @staticmethod
    def inputs(call, do, dfs):
        """The arrays of a training call's data (those the call has) and its cotangents."""
        out = {}
        for name in (*call.input_names, "h0", "initial_state", "cu_seqlens"):
            x = getattr(call, name, None)
            if x is not None and not callable(x):
                out[name] = x
        return {**out, "do": do, "dfinal_state": dfs}


class FamilyRunCase(CallCase, FamilyCase):
    """A family case (:class:`ci.grading.families.FamilyCase`) run like a training call (``modes.mode_results``): the
    kernel in FLA's signature with the flags and mode keywords the case sets."""

    def graded(self, fn, got):
        """The training call's judgement with the family's own findings (``ci.grading.family_diagnosis.refine``)."""
        return family_diagnosis.refine(self, got, super().graded(fn, got))
