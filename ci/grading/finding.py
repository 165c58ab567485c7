"""A diagnosis's unit: one :class:`Finding` (docs/DESIGN.md §4, "Diagnosis"), and the error size that means a logic
error in every kind of case."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# err_ratio at or above this is an O(1) relative error: a logic error, not precision loss.
LOGIC_ERROR = 0.1


@dataclass(frozen=True)
class Finding:
    """One diagnosis: its kind, a sentence, and where it points.

    ``token``: the first bad token (forward results first); ``primary``: the case's (or kernel's) main
    finding, the others support it; ``results``: the results it is about; ``period``: tokens between the
    repeated onsets of a periodic error; ``chunk``: the chunk size whose ``|G|`` the errors follow best;
    ``evidence``: the numbers behind it (JSON-able)."""

    kind: str
    text: str
    token: int | None = None
    primary: bool = False
    results: tuple = ()
    period: int | None = None
    chunk: int | None = None
    evidence: dict = field(default_factory=dict)

    def __str__(self):
        return f"{self.kind}: {self.text}"

    def as_dict(self):
        d = asdict(self)
        d["results"] = list(self.results)
        return d
