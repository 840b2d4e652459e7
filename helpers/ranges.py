"""Measured values checked against the ranges a lesson declares (lessons 01-06, in each
summary cell).

A count, a shape or a byte count computed from shapes is the same on every machine: the
lessons print it as it is, and the tests replay it exactly. A loss, an accuracy or a
time ratio depends on the hardware (another CPU's kernels, a GPU, the machine's load),
so a lesson declares the range that its text relies on, and ``print_measured`` prints
the value beside that range and a verdict:

    trainer_eval_accuracy: 0.833  (expected 0.75 to 1): in range

The tests hide the value (``tests/nbval_sanitize.cfg``) and compare the rest: a value
outside its range prints ``OUT OF RANGE`` and fails the suite on any machine.

A lesson declares each measured value once, in one dict (issue 47), and both
``print_measured(SUMMARY)`` and ``summary_table(SUMMARY)`` read it:

    SUMMARY = {  # name: (value, the range the text relies on or None, its table row)
        "steps": (steps, None, None),  # printed, not in the table
        "eval_accuracy": (accuracy, (0.75, 1.0), ("validation accuracy", "{:.3f}",
                                                  "it learned the task")),
    }

A row is ``(what, format)`` or ``(what, format, meaning)``; it may start with its place
in the table (1, 2, ...) when the table shows the values in another order than the
printed lines. ``format`` is a ``str.format`` pattern or a function of the value.
"""
import math
import numbers
import re

IN_RANGE, OUT_OF_RANGE = "in range", "OUT OF RANGE"
# The summary's contract, in one place: print_measured writes it; make bench, make
# reference, make run-twice, the tests and nbval's sanitizer read it with what follows.
# the line above a summary's values: a lesson's, or its lab's
SUMMARY_HEADERS = ("Measured in this lesson", "Measured in this lab")
SUMMARY_HEADER = SUMMARY_HEADERS[0]
OUTSIDE_TEXT = "outside the range"  # in every warning that a value fell outside
# a range-checked line's value; tests/nbval_sanitize.cfg holds this pair (a test checks)
MEASURED_VALUE = (r"(\w+): -?(\d+(\.\d*)?|nan|inf)  \(expected",
                  r"\1: MEASURED  (expected")


def range_text(low, high):
    """``(0.75, 1.0)`` as 'expected 0.75 to 1', ``(7, None)`` as 'expected >= 7'."""
    if low is None and high is None:
        raise ValueError("a range needs a low or a high end (or both); give None only "
                         "for an open end")
    if low is not None and high is not None and low > high:
        raise ValueError(f"the range's low end {low} is above its high end {high}")
    if high is None:
        return f"expected >= {low:g}"
    if low is None:
        return f"expected <= {high:g}"
    return f"expected {low:g} to {high:g}"


def in_range(value, low, high):
    """Whether ``value`` lies in [low, high] (None: no bound on that side); NaN never
    does."""
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
        or math.isnan(value)):
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def verdict(value, low, high):
    """IN_RANGE or OUT_OF_RANGE: what a summary says of ``value`` against [low,
    high]."""
    return IN_RANGE if in_range(value, low, high) else OUT_OF_RANGE


def measured_line(name, value, expected_range=None, digits=3):
    """One summary line: the value alone when it is exact, else the value, its range and
    the verdict."""
    if expected_range is None:
        return f"{name}: {value}"
    low, high = expected_range
    shown = (f"{value:.{digits}f}"
             if isinstance(value, numbers.Real) and not isinstance(value, bool)
             else repr(value))
    return f"{name}: {shown}  ({range_text(low, high)}): {verdict(value, low, high)}"


def declared(summary):
    """A lesson's one declaration, ``{name: (value, range or None, row or None)}``,
    split into what the older calls take: ``(measured, expected, findings)``, the
    findings in the table's order."""
    if not isinstance(summary, dict):
        raise TypeError("a summary is a dict {name: (value, range or None, row or "
                        f"None)}}, not {type(summary).__name__}")
    bad = [name for name, entry in summary.items()
           if not (isinstance(entry, tuple) and len(entry) == 3)]
    if bad:
        raise ValueError("each declared value is (value, range or None, row or None); "
                         f"fix: {', '.join(bad)} (or give the ranges apart: "
                         "print_measured(measured, EXPECTED))")
    measured = {name: value for name, (value, _, _) in summary.items()}
    expected = {name: bounds for name, (_, bounds, _) in summary.items()
                if bounds is not None}
    rows = {name: row for name, (_, _, row) in summary.items() if row is not None}
    placed = [name for name, row in rows.items()
              if isinstance(row, tuple) and row and isinstance(row[0], int)]
    if placed and len(placed) != len(rows):
        raise ValueError("give every table row its place or none: "
                         f"{', '.join(sorted(set(rows) - set(placed)))} "
                         "has no place")
    if placed:
        places = sorted(rows[name][0] for name in placed)
        if places != list(range(1, len(places) + 1)):
            raise ValueError(f"the table's places are {places}: number the rows 1 to "
                             f"{len(places)}, each once")
        rows = {name: rows[name][1:] for name in sorted(rows, key=lambda n: rows[n][0])}
    return measured, expected, rows


def print_measured(measured, expected=None, digits=3, where="lesson"):
    """Print a lesson's summary: every ``measured`` value, range-checked where
    ``expected`` names a range.

    ``measured`` is the lesson's declaration (module docstring), or a dict of values
    with ``expected`` beside it, mapping a name to ``(low, high)``; each name in it must
    be measured. Returns nothing, so that a notebook cell ending with this call shows
    only the printed lines.
    """
    if expected is None:
        measured, expected, _ = declared(measured)
    unknown = set(expected) - set(measured)
    if unknown:
        raise KeyError("EXPECTED names values that were not measured: "
                       f"{', '.join(sorted(unknown))}")
    header = f"Measured in this {where}"
    if header not in SUMMARY_HEADERS:
        raise ValueError(f"where is 'lesson' or 'lab', not {where!r}")
    print(header)
    outside = []
    for name, value in measured.items():
        line = measured_line(name, value, expected.get(name), digits)
        if line.endswith(OUT_OF_RANGE):
            outside.append(name)
        print(line)
    if outside:
        print(f"{len(outside)} value(s) {OUTSIDE_TEXT} this lesson expects: the "
              "text above may not hold on "
              "this machine. Re-run the lesson; if it persists, report the lines "
              "above to the course maintainers.")


def parse_value(text):
    """What ``measured_line`` printed after ``name: ``, read back: ``(value, range,
    verdict)`` as texts; an exact value has no range and no verdict (None).

    >>> parse_value("0.833  (expected 0.75 to 1): in range")
    ('0.833', 'expected 0.75 to 1', 'in range')
    """
    found = re.fullmatch(r"(.*)  \((expected [^)]*)\): (.*)", text.strip())
    return found.groups() if found else (text.strip(), None, None)


def summary_lines(text):
    """``{name: what was printed after "name: "}`` for the lines a summary printed
    below one of ``SUMMARY_HEADERS``; {} when ``text`` holds no summary."""
    header = next((h for h in SUMMARY_HEADERS if h in text), None)
    if header is None:
        return {}
    lines = text.split(header, 1)[1].strip().splitlines()
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def summary_table(measured, expected=None, findings=None):
    """A lesson's summary as a table a person reads: what was measured, and its value on
    this machine (lesson 01 on).

    ``measured`` is the lesson's declaration (module docstring), whose rows are the
    table's; or a dict of values, with ``expected`` and ``findings`` beside it.
    ``findings`` maps a measured name to ``(what, format)`` or ``(what, format,
    meaning)``, in the order the table shows them: a few words a learner reads ("memory
    kept for backward, off / on"), a ``str.format`` pattern for the value ("{:.1f}x
    less") or a function of it, and, for a third column, what the value means for a
    run ("pull it when activations fill the memory"; STYLE 17). Ranges and verdicts stay
    in ``print_measured``'s lines, for the tests (issue 42: none on a slide); a
    value outside its range in ``expected`` is still flagged here, in words. Returns a
    Markdown object, which the notebook shows as a table.
    """
    from IPython.display import Markdown

    if expected is None and findings is None:
        measured, expected, findings = declared(measured)
    elif expected is None or findings is None:
        raise TypeError("give summary_table the declaration alone, or the measured "
                        "values, their ranges and the findings")
    unknown = [name for name in findings if name not in measured]
    if unknown:
        raise KeyError("findings names values that were not measured: "
                       f"{', '.join(unknown)}")
    bad = [name for name, row in findings.items() if len(row) not in (2, 3)]
    if bad:
        raise ValueError("each finding is (what, format) or (what, format, meaning); "
                         f"fix: {', '.join(bad)}")
    with_meaning = any(len(row) == 3 for row in findings.values())
    header = ["what you measured", "on this machine"] + ["what it means"] * with_meaning
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for name, (what, pattern, *meaning) in findings.items():
        value = measured[name]
        shown = pattern(value) if callable(pattern) else pattern.format(value)
        if name in expected and verdict(value, *expected[name]) != IN_RANGE:
            # bold: the eye finds it; the text relies on the range
            shown = f"**{shown}: {OUTSIDE_TEXT} the lesson's text relies on**"
        cells = [what, shown] + (meaning or [""]) * with_meaning
        rows.append("| " + " | ".join(cells) + " |")
    return Markdown("\n".join(rows))
