"""The typed result of judging one kernel on one case (every case kind: dense, training call, serving session).

A :class:`CaseResult` is what ``case.run(kernel, mesh)`` returns and what the diagnosis, the summaries and the
reports read; :meth:`CaseResult.to_dict` writes the JSON record a user gets (``validate``'s ``kernels[].cases[]``),
:meth:`CaseResult.from_dict` reads one back. Outcomes: ``pass``, ``precision``, ``fail`` (graded), ``error`` (the
kernel raised; graded FAIL), ``input-error`` (the case's own data could not be built: nothing judged, no grade).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .grades import FAIL, PASS, PRECISION, Verdict

# A judged case's outcome by its grade (PRECISION: over tolerance, within the precision-loss bound).
GRADE_OUTCOME = {PASS: "pass", PRECISION: "precision", FAIL: "fail"}
ERROR, INPUT_ERROR = "error", "input-error"
# How much of a kernel's or an input's error message a result keeps (its first line).
ERROR_CHARS = 500


def error_text(exc, limit=ERROR_CHARS):
    """``"Type: message"``: the first line of an exception's text, at most ``limit`` characters."""
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:limit]


@dataclass
class CaseResult:
    """One kernel judged on one case. ``case``: the case's identity (``case.describe()``); ``verdicts``
    (:class:`Verdict`) and ``diagnosis`` (findings with ``as_dict()``, or their dicts) of a judged case; ``error``
    the first line of what went wrong when nothing was judged; ``profiles`` the per-token (or per-call) error
    profiles of the results over tolerance; ``arrays`` what ``--dump`` writes (dropped once written)."""

    case: dict
    outcome: str
    grade: str | None
    verdicts: list = field(default_factory=list)
    diagnosis: list = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    profiles: dict = field(default_factory=dict)
    arrays: dict | None = None

    @classmethod
    def judged(cls, case, report, seconds, **kw):
        """The result of a graded tolerance ``Report`` (its verdicts, diagnosis and profiles)."""
        return cls(case, GRADE_OUTCOME[report.grade], report.grade, list(report.verdicts), list(report.diagnosis),
                   None, seconds, dict(report.profiles or {}), **kw)

    @classmethod
    def failed(cls, case, exc, seconds, *, kind=ERROR, **kw):
        """A kernel that raised (``kind`` ``error``: graded FAIL; or ``timeout``), or a case whose data could not be
        built (``kind`` ``input-error``: not judged, no grade). ``exc``: the exception or its text."""
        text = exc if isinstance(exc, str) else error_text(exc, 1000 if kind == INPUT_ERROR else ERROR_CHARS)
        if kind == INPUT_ERROR:
            return cls(case, INPUT_ERROR, None, [], [{"kind": kind, "text": text, "token": None}], text, seconds, **kw)
        return cls(case, ERROR, FAIL, [], [{"kind": kind, "text": text, "token": None}], text, seconds, **kw)

    @property
    def passed(self):
        return self.grade == PASS

    @property
    def name(self):
        return self.case.get("case")

    @property
    def modes(self):
        """The case's call modes, as its identity records them: a training call's ``modes``, a serving session's
        ``mode``; empty for a dense call."""
        mode = self.case.get("mode")
        return frozenset(self.case.get("modes") or ()) | ({mode} if isinstance(mode, str) else set())

    def verdict_dicts(self):
        return [v.as_dict() if isinstance(v, Verdict) else dict(v) for v in self.verdicts]

    def diagnosis_dicts(self):
        return [f if isinstance(f, dict) else f.as_dict() for f in self.diagnosis]

    def to_dict(self):
        """The JSON record: the case's identity, then ``passed, outcome, grade, verdicts, error, diagnosis,
        seconds`` (``validate/4``'s case keys)."""
        return {**self.case, "passed": self.passed, "outcome": self.outcome, "grade": self.grade,
                "verdicts": self.verdict_dicts(), "error": self.error, "diagnosis": self.diagnosis_dicts(),
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d):
        """A result from its JSON record (:meth:`to_dict`): verdicts as :class:`Verdict`, findings as dicts."""
        keys = ("passed", "outcome", "grade", "verdicts", "error", "diagnosis", "seconds")
        case = {k: v for k, v in d.items() if k not in keys}
        outcome = d.get("outcome") or ("pass" if d.get("passed") else "fail")
        grade = d.get("grade", None if outcome == INPUT_ERROR else (PASS if d.get("passed") else FAIL))
        return cls(case, outcome, grade, [Verdict.from_dict(v) for v in d.get("verdicts") or []],
                   list(d.get("diagnosis") or []), d.get("error"), d.get("seconds", 0.0))
