"""Grades and verdicts (docs/DESIGN.md §4, "Grades and the precision-loss bound").

``PASS`` (within the tolerance), ``PRECISION`` (over it, within the precision-loss bound) or ``FAIL``
(beyond the bound, or not finite); a :class:`Verdict` judges one result, its :attr:`Verdict.ratio` is
error / tolerance, and a report takes the worst grade of its verdicts.

A run (or one kernel's part of it) has two more grades, never a verdict's: ``EMPTY`` when it judged nothing and
``INTERRUPTED`` when a signal stopped it before its end (:func:`run_grade`). Neither is a pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

PASS, PRECISION, FAIL = "PASS", "PRECISION", "FAIL"
GRADES = (PASS, PRECISION, FAIL)  # best first
EMPTY, INTERRUPTED = "EMPTY", "INTERRUPTED"  # a run's grade: nothing judged; stopped by a signal before its end


class PrecisionLossWarning(UserWarning):
    """A result graded PRECISION: over the working-precision tolerance, within the precision-loss bound."""


def worst_grade(grades):
    """The worst of some grades (PASS < PRECISION < FAIL); PASS when there are none."""
    return max(grades, key=GRADES.index, default=PASS)


def run_grade(grades, *, interrupted=False):
    """The grade of a run from its judged grades: FAIL if one is (a FAIL found stands), else INTERRUPTED when it was
    stopped before its end, else EMPTY when nothing was judged, else the worst."""
    grades = list(grades)
    if FAIL in grades:
        return FAIL
    if interrupted:
        return INTERRUPTED
    return worst_grade(grades) if grades else EMPTY


def grade_rank(grade):
    """0 for PASS, 1 for PRECISION, 2 for FAIL."""
    return GRADES.index(grade)


def ratio(err, tol):
    """``err / tol`` (>1: over); inf for a non-finite error, 0/0 counts as 0."""
    if not math.isfinite(err):
        return math.inf
    return err / tol if tol > 0 else (0.0 if err == 0 else math.inf)


@dataclass(frozen=True)
class Verdict:
    """The judgement of one output or gradient against its tolerance."""

    name: str
    err_ratio: float
    max_err: float
    tol_ratio: float
    tol_max: float
    rule: str
    passed: bool
    note: str = ""
    grade: str = ""  # PASS | PRECISION | FAIL; defaults to PASS / FAIL from ``passed``
    bound_ratio: float | None = None  # the precision-loss bound, when it was computed
    bound_max: float | None = None

    def __post_init__(self):
        if not self.grade:
            object.__setattr__(self, "grade", PASS if self.passed else FAIL)
        if self.grade not in GRADES:
            raise ValueError(f"grade: {self.grade!r} not one of {GRADES}")
        if bool(self.passed) != (self.grade == PASS):  # one fact: ``passed`` is ``grade == PASS`` (kept for the JSON)
            raise ValueError(f"passed: {self.passed!r} contradicts grade {self.grade!r}")

    @property
    def ratio(self):
        """Error / tolerance: the larger of the rms and max metrics' ratios (>1: over the tolerance)."""
        return max(ratio(self.err_ratio, self.tol_ratio), ratio(self.max_err, self.tol_max))

    def as_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        """The verdict of a JSON report's verdict dict (as :meth:`as_dict` wrote it)."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
