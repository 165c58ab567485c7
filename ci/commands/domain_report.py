"""The ``domain`` report: its JSON record, where each result leaves PASS along each sweep (the boundary sentences),
the summary paragraph and the text the CLI prints."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gdn2_oracle.oracle import RESULTS, call_modes

from ..grading.families import FAMILY_RESULTS, GDN2
from ..grading.grades import FAIL, PASS
from ..grading.modes import MODE_RESULTS
from .domain_points import MODE_T, PLAIN, RESETS, UNORDERED, Point, value_label
from .output import table

# 2: + interrupted; 3: + modes, not_accepted_modes (and mode panels); 4: + family, not_accepted_flags (and a family
# kernel's panels: the beta regimes at one decay regime and group size, each with its "family")
SCHEMA = "gdn2-oracle/domain/4"


@dataclass
class DomainReport:
    """A domain map: per sweep (panel) its cells (plain JSON dicts), the boundaries found and the summary."""

    kernel: str
    grid: str
    seeds: list
    chunk: int
    shape: dict
    base: dict
    results: list
    panels: list
    seconds: float
    environment: dict
    interrupted: bool = False  # Ctrl-C: only the cells finished before it
    modes: list = dataclasses.field(default_factory=lambda: [PLAIN])  # the sweeps selected (--modes)
    not_accepted_modes: list = dataclasses.field(default_factory=list)  # selected, not in the kernel's signature
    family: str = GDN2  # the kernel's family (ci/running/families.py): gdn2, or a family kernel's map (gdn, kda)
    not_accepted_flags: list = dataclasses.field(default_factory=list)  # FLA keywords of columns not swept
    boundaries: list = dataclasses.field(default_factory=list)
    summary: str = ""

    def to_json(self):
        """The JSON report (schema :data:`SCHEMA`)."""
        return {"schema": SCHEMA, **dataclasses.asdict(self)}


def _pos(panel, cell):
    """How a cell's position is named in a sentence (a decay strength by the span it produced, then s)."""
    if panel["field"] == "strength" and cell["value"] != RESETS:
        return f"{cell['span']:.3g} (s = {cell['label']})"
    return cell["label"]


def _subject(panel, chunk):
    if panel["field"] == "strength":
        return f"the {chunk}-token log-decay span"
    return panel["label"]


def _runs(grades):
    """``[(grade, first index, last index)]`` of the runs of equal grades."""
    runs = []
    for i, g in enumerate(grades):
        if runs and runs[-1][0] == g:
            runs[-1] = (g, runs[-1][1], i)
        else:
            runs.append((g, i, i))
    return runs


def panel_results(panel):
    """The results a panel's cells were judged on, in report order (the nine dense ones; a mode call's may add
    ``intermediate_states``, ``dA_log``, ``ddt_bias``; a family call's are ``FAMILY_RESULTS``)."""
    if panel.get("family", GDN2) != GDN2:
        return list(FAMILY_RESULTS)
    have = {n for c in panel["cells"] if c["results"] is not None for n in c["results"]}
    return [n for n in MODE_RESULTS if n in have] if not call_modes.is_base(panel.get("mode", PLAIN)) else list(RESULTS)


def result_boundary(panel, name, chunk):
    """Where result ``name`` leaves PASS along a panel, as a predicate with ``{leaves}``/``{is}`` for the verb
    (None if it is PASS in every judged cell)."""
    cells = [c for c in panel["cells"] if c["results"] is not None and name in c["results"]]
    ordered = [c for c in cells if c["value"] != RESETS]
    grades = [c["results"][name]["grade"] for c in ordered]
    runs, subject = _runs(grades), _subject(panel, chunk)
    text = ""
    if len(runs) == 1 and runs[0][0] != PASS:
        text = f"{{is}} {runs[0][0]} at every {panel['label']} ({ordered[0]['label']}-{ordered[-1]['label']})"
    elif len(runs) > 1 and panel["field"] in UNORDERED:  # no order: name the cells
        bad = {}
        for c, g in zip(ordered, grades):
            if g != PASS:
                bad.setdefault(g, []).append(c["label"])
        text = f"{{is}} not PASS along {subject}: " + "; ".join(f"{g} at {', '.join(v)}" for g, v in bad.items())
    elif len(runs) > 1:
        g, _, j = runs[0]
        later = ", ".join(f"{h}{' again' if h == g == PASS else ''} from {_pos(panel, ordered[i])}"
                          for h, i, _ in runs[1:])
        if g == PASS:
            text = f"{{leaves}} PASS once {subject} exceeds ~{_pos(panel, ordered[j])}: {later}"
        elif j == 0:
            text = f"{{is}} {g} at {panel['label']} {_pos(panel, ordered[0])}, {later}"
        else:
            text = f"{{is}} {g} along {subject} up to {_pos(panel, ordered[j])}, {later}"
    resets = [c for c in cells if c["value"] == RESETS]
    if resets and resets[0]["results"][name]["grade"] != PASS:
        grade = resets[0]["results"][name]["grade"]
        text += f"; {grade} under resets" if text else f"{{is}} {grade} under resets"
    return text or None


def sentence(names, predicate, every=RESULTS):
    """``predicate`` (from :func:`result_boundary`) with its subject: every result (all of ``every``), or the named
    ones."""
    if list(names) == list(every):
        subject, plural = "every result", False
    else:
        subject, plural = ", ".join(f"`{n}`" for n in names), len(names) > 1
    return f"{subject} " + predicate.format(leaves="leave" if plural else "leaves", **{"is": "are" if plural else "is"})


def boundaries(report):
    """``[{"panel", "label", "dtype", "results", "text"}]``: the results sharing each boundary, per panel."""
    out = []
    for panel in report.panels:
        groups = {}
        every = panel_results(panel)
        for name in every:
            predicate = result_boundary(panel, name, report.chunk)
            if predicate:
                groups.setdefault(predicate, []).append(name)
        for predicate, names in groups.items():
            out.append({"panel": panel["field"], "label": panel["label"], "dtype": panel["dtype"],
                        "results": names, "every": len(names) == len(every),
                        "text": sentence(names, predicate, every)})
    return out


def _range_of(panel):
    values = [c["label"] for c in panel["cells"]]
    return f"{values[0]}-{values[-1]}" if len(values) > 2 else " and ".join(values)


def worst_cell(report):
    """``{ratio, result, label, value, dtype}`` of the largest finite error / tolerance of any judged cell."""
    found = [(float(r["ratio"]), name, p["label"], c["label"], p["dtype"]) for p in report.panels
             for c in p["cells"] if c["results"] is not None for name, r in c["results"].items()
             if math.isfinite(float(r["ratio"]))]
    if not found:
        return None
    return dict(zip(("ratio", "result", "label", "value", "dtype"), max(found)))


def summary(report):
    """One paragraph: the base point, then each boundary found, then the sweeps with none."""
    mapped = " mapped before the interrupt" if report.interrupted else ""
    text = (f"{report.kernel} ({report.grid} grid, {len(report.seeds)} seed(s) per cell; {'; '.join(_mapped(report))}, "
            "float32 unless stated):")
    said = [("in bfloat16, " if b["dtype"] == "bfloat16" else "") + b["text"] for b in report.boundaries]
    clean_text = (f"every result is PASS in every cell{mapped}." if judged_cells(report) else
                  "no cell was judged before the interrupt." if report.interrupted else
                  "no cell was judged (EMPTY: nothing is known about the kernel; not a pass).")
    text += " " + ("; ".join(said) + "." if said else clean_text)
    if report.not_accepted_modes:
        text += (f" Not swept: {', '.join(report.not_accepted_modes)} (the kernel's signature does not accept the "
                 "mode's keywords; not a failure).")
    if getattr(report, "not_accepted_flags", None):
        text += (f" Not swept: the beta regimes that need {', '.join(report.not_accepted_flags)} (the kernel's "
                 "signature does not take it; not a failure).")
    if report.interrupted:
        text += " INTERRUPTED: only the cells finished before the interrupt are mapped."
    worst = worst_cell(report)
    if worst and not said:
        text = text[:-1] + (f" (worst error / tolerance {worst['ratio']:.2g}: `{worst['result']}` at {worst['label']} "
                            f"{worst['value']}, {worst['dtype']}).")
    clean = [p for p in report.panels if not any(b["panel"] == p["field"] and b["dtype"] == p["dtype"]
                                                    for b in report.boundaries)]
    if clean and said:
        dtypes = {}
        for p in clean:
            dtypes.setdefault((p["label"], _range_of(p)), []).append(p["dtype"])
        text += f" Every result is PASS{mapped} along " + ", ".join(
            f"{label} {span}{'' if d == ['float32'] else ' (' + ' and '.join(d) + ')'}"
            for (label, span), d in dtypes.items()) + "."
    na = sorted({f"{p['label']} {c['label']} ({p['dtype']}): {c['note']}" for p in report.panels
                 for c in p["cells"] if c["results"] is None})
    if na:
        text += " Not judged: " + "; ".join(na) + "."
    raised = {}
    for p in report.panels:
        for c in p["cells"]:
            if c["note"].startswith("error: "):
                raised.setdefault(c["note"].removeprefix("error: "), set()).add(f"{p['label']} ({p['dtype']})")
    for error, where in raised.items():
        text += f" The kernel raised {error!r} in cells of {', '.join(sorted(where))}."
    return text


def _mapped(report):
    """What the map covers, for the summary: the Point sweeps around their base and the mode sweeps, or a family
    kernel's decay x beta map."""
    shape, family = report.shape, getattr(report, "family", GDN2)
    if family != GDN2:
        base = report.base
        groups = ", ".join(str(g) for g in base["groups"])
        return [f"family {family}: decay regime ({', '.join(base['decays'])}) x beta regime, G = {groups} value "
                f"heads per key head; B={shape['B']}, T={shape['T']}, H={shape['H']}, K={shape['K']}, V={shape['V']}, "
                f"q/k {value_label('qk', base['qk'])}, initial state "
                f"{value_label('initial_state', base['initial_state'])}, judged by the family judge"]
    base = Point(**report.base)
    modes = getattr(report, "modes", [PLAIN])
    swept = [m for m in modes if not call_modes.is_base(m) and m not in report.not_accepted_modes]
    plain = (f"B={shape['B']}, H={shape['H']}, K={shape['K']}, V={shape['V']}; base: T={base.T}, log-decay strength "
             f"{value_label('strength', base.strength)}, erase ~{base.erase:g}, write ~{base.write:g}, "
             f"q/k {value_label('qk', base.qk)}, initial state {value_label('initial_state', base.initial_state)}")
    calls = (f"mode sweeps {', '.join(swept)}: FLA training calls at H={shape['H']}, K={shape['K']}, V={shape['V']}, "
             f"T={MODE_T} unless swept, initial state on, judged by the modes judge")
    return ([plain] if PLAIN in modes else []) + ([calls] if swept else [])


def _where(boundary):
    """A boundary's sentence without its subject ("every result leaves PASS once ..." -> "once ...")."""
    text = boundary["text"]
    for verb in (" leaves PASS ", " leave PASS ", " is ", " are "):
        if verb in text:
            return text.split(verb, 1)[1]
    return text


def format_domain(report):
    """The text the CLI prints: a short table of where each result leaves PASS along each sweep, and the verdict
    (the full paragraph is summary.txt and the JSON's ``summary``)."""
    cells = sum(len(p["cells"]) for p in report.panels)
    family = getattr(report, "family", GDN2)
    lines = [f"gdn2-oracle domain: {report.kernel}{'' if family == GDN2 else f' (family {family})'}, {report.grid} "
             f"grid, {cells} cells x {len(report.seeds)} seed(s) in {report.seconds:.0f} s", ""]
    rows = [[b["label"], b["dtype"], "all" if b.get("every", len(b["results"]) == len(RESULTS)) else
             ", ".join(b["results"]), _where(b)] for b in report.boundaries]
    clean = [f"{p['label']} ({p['dtype']})" for p in report.panels
             if not any(b["panel"] == p["field"] and b["dtype"] == p["dtype"] for b in report.boundaries)]
    if rows:
        lines.append(table(["sweep", "dtype", "results", "where they leave PASS"], rows))
    if clean:
        lines += ["", f"PASS everywhere{' mapped before the interrupt' if report.interrupted else ''} along: "
                  + ", ".join(clean)]
    if report.not_accepted_modes:
        lines += ["", f"not swept: {', '.join(report.not_accepted_modes)} (not accepted by the kernel's signature; "
                      "not a failure)"]
    if getattr(report, "not_accepted_flags", None):
        lines += ["", f"not swept: the beta regimes that need {', '.join(report.not_accepted_flags)} (not accepted by "
                      "the kernel's signature; not a failure)"]
    failed = failed_cells(report)
    verdict = (f"FAIL in {failed} of {cells} cells" if failed else
               "no FAIL" if judged_cells(report) or report.interrupted else "EMPTY: no cell judged (not a pass)")
    lines += ["", f"domain: {verdict}{' (INTERRUPTED)' if report.interrupted else ''}"]
    return "\n".join(lines)


def judged_cells(report):
    """How many cells were judged (have results)."""
    return sum(c["results"] is not None for p in report.panels for c in p["cells"])


def failed_cells(report):
    """How many judged cells have a result graded FAIL."""
    return sum(any(r["grade"] == FAIL for r in c["results"].values()) for p in report.panels for c in p["cells"]
               if c["results"] is not None)
