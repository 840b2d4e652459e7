"""Range checks (helpers/ranges.py): a value outside its declared range fails the suite,
one inside passes.

Two levels: nbval itself run on a small notebook whose stored output came from an
in-range value, and every range that a lesson declares (in its ``SUMMARY = {...}``, or
an older ``EXPECTED = {...}``), fed a
value outside it, compared with the lesson's stored output the way nbval compares it
(after the sanitizer).
"""
import ast
import re
import subprocess
import sys

import nbformat
import pytest
from tool_scripts import load_tool

from helpers.paths import REPO_ROOT
from helpers.ranges import (
    IN_RANGE,
    MEASURED_VALUE,
    OUT_OF_RANGE,
    SUMMARY_HEADERS,
    in_range,
    measured_line,
    parse_value,
    print_measured,
    range_text,
    summary_lines,
)

SANITIZER = REPO_ROOT / "tests" / "nbval_sanitize.cfg"
run_twice = load_tool("run_twice")
LESSONS = sorted((REPO_ROOT / "notebooks").glob("0[1-9]_*.ipynb"))


def sanitize(text):
    """Apply tests/nbval_sanitize.cfg's regex/replace pairs, in order, as nbval does
    (read by tools/run_twice.py, which compares a second run's output the same way)."""
    return run_twice.sanitize(text, run_twice.sanitizers())


@pytest.mark.parametrize(
    "value, low, high, inside",
    [(0.8, 0.75, 1.0, True), (0.75, 0.75, 1.0, True), (0.7499, 0.75, 1.0, False),
     (7.8, 7, None, True), (6.9, 7, None, False), (1.2, None, 1.1, False),
     (float("nan"), 0, 1, False), (True, 0, 1, False)],
)
def test_in_range(value, low, high, inside):
    assert in_range(value, low, high) is inside


def test_lines_say_the_range_and_the_verdict():
    assert measured_line("accuracy", 0.8333, (0.75, 1.0)) == ("accuracy: 0.833  "
                                                              "(expected 0.75 to 1): "
                                                              "in range")
    assert measured_line("ratio", 6.5, (7, None), digits=1) == ("ratio: 6.5  "
                                                                "(expected >= 7): "
                                                                f"{OUT_OF_RANGE}")
    # exact values are replayed as they are
    assert measured_line("bytes", 125034448) == "bytes: 125034448"


def test_the_sanitizer_hides_the_value_and_keeps_the_verdict():
    inside, other_inside = (measured_line("a", 0.81, (0.75, 1.0)),
                            measured_line("a", 0.93, (0.75, 1.0)))
    outside = measured_line("a", 0.5, (0.75, 1.0))
    assert sanitize(inside) == sanitize(other_inside)
    assert sanitize(inside) != sanitize(outside)
    assert sanitize(measured_line("a", float("nan"), (0, 1))) == sanitize(
        measured_line("a", 5.0, (0, 1))
    )


def test_the_sanitizer_holds_the_summary_contracts_own_pattern():
    # nbval reads a .cfg, not Python: the pair is written there once, checked here
    assert MEASURED_VALUE in run_twice.sanitizers()


@pytest.mark.parametrize("bounds", [(0.75, 1.0), (7, None), (None, 0.99), None])
@pytest.mark.parametrize("value", [0.5, 0.9, 12.25, float("nan")])
def test_every_reader_gets_back_what_the_summary_line_wrote(value, bounds):
    name, text = measured_line("ratio", value, bounds).split(": ", 1)
    shown, written_range, written_verdict = parse_value(text)
    assert name == "ratio"
    if bounds is None:
        assert (shown, written_range, written_verdict) == (str(value), None, None)
    else:
        assert shown == f"{value:.3f}" and written_range == range_text(*bounds)
        assert written_verdict == (IN_RANGE if in_range(value, *bounds)
                                   else OUT_OF_RANGE)
    for header in SUMMARY_HEADERS:  # a lesson's or a lab's
        assert summary_lines(f"{header}\n{name}: {text}\n") == {"ratio": text}
    assert summary_lines("no summary here") == {}


@pytest.mark.parametrize("bad", [(None, None), (2, 1)])
def test_a_bad_range_gets_a_clear_error(bad):
    with pytest.raises(ValueError, match="range"):
        range_text(*bad)


def test_a_range_for_a_value_never_measured_is_an_error():
    with pytest.raises(KeyError, match="not measured: typo"):
        print_measured({"accuracy": 0.8}, {"typo": (0, 1)})


def test_print_measured_says_how_many_fell_outside_and_returns_nothing(capsys):
    assert (
        print_measured({"a": 0.9, "b": 3, "c": 0.1}, {"a": (0.75, 1), "c": (0.5, None)})
        is None
    )
    printed = capsys.readouterr().out.splitlines()
    assert printed[:3] == ["Measured in this lesson", "a: 0.900  (expected 0.75 to "
                                                      "1): in range", "b: 3"]
    assert (printed[3] == f"c: 0.100  (expected >= 0.5): {OUT_OF_RANGE}"
            and "1 value(s) outside" in printed[4])


def summary_notebook(value):
    cell = nbformat.v4.new_code_cell(
        "from helpers.ranges import print_measured\nprint_measured({'accuracy': "
        f"{value}}}, {{'accuracy': (0.75, 1.0)}})")
    return nbformat.v4.new_notebook(
        cells=[cell],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3",
                           "language": "python"}
        },
    )


def run_nbval(folder):
    """nbval over every notebook in ``folder``, in one pytest run: {notebook file name:
    "PASSED" or "FAILED"}, and the run's output."""
    result = subprocess.run(
        # -rA: a PASSED or FAILED line per cell; --rootdir=.: named by file name
        [sys.executable, "-m", "pytest", "-q", "-rA", "--color=no", "--rootdir=.",
         "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(SANITIZER), "."],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=300,
    )
    outcomes = re.findall(r"^(PASSED|FAILED) (\S+?)::", result.stdout, re.M)
    return {name: outcome for outcome, name in outcomes}, result.stdout


def test_nbval_passes_another_value_in_range_and_fails_one_outside(tmp_path):
    from nbclient import NotebookClient

    stored = summary_notebook(0.81)
    # the stored output, made by executing, as `make execute` does
    NotebookClient(stored).execute()
    expected = {}
    for value, outcome in ((0.93, "PASSED"), (0.5, "FAILED")):
        notebook = summary_notebook(value)
        notebook.cells[0].outputs = stored.cells[0].outputs
        notebook.cells[0].execution_count = stored.cells[0].execution_count
        path = tmp_path / f"summary_{value}.ipynb"
        nbformat.write(notebook, path)
        expected[path.name] = outcome
    # both in one run: one interpreter to start, not two
    outcomes, output = run_nbval(tmp_path)
    assert outcomes == expected, output[-2000:]


def parsed_code_cells(lesson, words):
    """(cell, its parsed source) for each code cell of ``lesson`` that mentions one of
    ``words``: the others may hold IPython magics, which are not Python."""
    for cell in nbformat.read(lesson, as_version=4).cells:
        if cell.cell_type == "code" and any(word in cell.source for word in words):
            yield cell, ast.parse(cell.source)


def declared_ranges(lesson):
    """The ranges a lesson declares, in its ``SUMMARY = {name: (value, range, row)}``
    or an older ``EXPECTED = {name: range}`` (in whichever cell declares it), and its
    ``print_measured`` cell's stored text.

    A range written as a name, not a literal (lesson 05's ``SPEED_RANGE``, chosen by the
    machine's kernels and hidden by its own sanitizer), is left out here.
    """
    expected, output = {}, ""
    for cell, tree in parsed_code_cells(lesson, ("EXPECTED", "SUMMARY",
                                                 "print_measured(")):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)):
                continue
            target = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for key, value in zip(node.value.keys, node.value.values):
                if target == ["SUMMARY"] and isinstance(value, ast.Tuple):
                    value = value.elts[1]  # (value, range, row)
                elif target != ["EXPECTED"]:
                    continue
                try:
                    bounds = ast.literal_eval(value)
                except ValueError:
                    continue
                if bounds is not None:
                    expected[ast.literal_eval(key)] = bounds
        if "print_measured(" in cell.source:
            output = "".join(
                o.get("text", "") for o in cell.outputs if o.output_type == "stream"
            )
    return expected, output


RANGES = [(lesson, name, bounds) for lesson in LESSONS
          for name, bounds in declared_ranges(lesson)[0].items()]


def test_the_lessons_declare_ranges():
    assert len({lesson for lesson, _, _ in RANGES}) >= 3, RANGES


@pytest.mark.parametrize("lesson, name, bounds", RANGES,
                         ids=[f"{lesson.stem}-{name}" for lesson, name, _ in RANGES])
def test_every_declared_range_fails_the_suite_for_a_value_outside_it(
    lesson, name, bounds
):
    _, stored = declared_ranges(lesson)
    stored_lines = sanitize(stored).splitlines()
    low, high = bounds
    assert (
        sanitize(measured_line(name, low if low is not None else high, bounds))
        in stored_lines
    ), f"{lesson.name} does not show {name} in range: re-run it with `make execute`"
    outside = [low - abs(low) * 0.5 - 1 for _ in [0] if low is not None] + \
              [high + abs(high) * 0.5 + 1 for _ in [0] if high is not None]
    for value in outside:
        assert sanitize(measured_line(name, value, bounds)) not in stored_lines


def machine_chosen_ranges(lesson):
    """{summary name: the ranges a lesson may print for it}: a range assigned to a name
    with a choice the machine makes (lesson 05's ``SPEED_RANGE``, ``MATMUL_RANGE``, by
    its bfloat16 kernel), every literal range in that choice. A choice by
    ``device.type`` is left out: the tests run on the CPU."""
    choices, uses = {}, {}
    for _, tree in parsed_code_cells(lesson, ("_RANGE",)):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if (names and names[0].endswith("_RANGE")
                    and not isinstance(node.value, ast.Tuple)
                    and "device.type" not in ast.unparse(node.value)):
                choices[names[0]] = [
                    ast.literal_eval(t) for t in ast.walk(node.value)
                    if isinstance(t, ast.Tuple) and len(t.elts) == 2]
            if names == ["SUMMARY"] and isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values):
                    if isinstance(value, ast.Tuple) and isinstance(value.elts[1],
                                                                   ast.Name):
                        uses[ast.literal_eval(key)] = value.elts[1].id
    return {name: choices[range_name] for name, range_name in uses.items()
            if range_name in choices}


CHOSEN = [(lesson, name, ranges) for lesson in LESSONS
          for name, ranges in machine_chosen_ranges(lesson).items()]


def test_lesson_05_chooses_its_speed_ranges_by_the_machine():
    names = {name for _, name, _ in CHOSEN}
    assert {"bf16_step_time_ratio", "bf16_large_matmul_time_ratio"} <= names, CHOSEN


@pytest.mark.parametrize("lesson, name, ranges", CHOSEN,
                         ids=[f"{lesson.stem}-{name}" for lesson, name, _ in CHOSEN])
def test_a_range_the_machine_chooses_prints_the_same_on_every_machine(
    lesson, name, ranges
):
    # the stored line came from one machine's kernel; nbval on another compares it:
    # the sanitizer must hide which range was printed, and keep the verdict
    lines = {sanitize(measured_line(name, high if low is None else low, (low, high)))
             for low, high in ranges}
    assert len(ranges) >= 2 and len(lines) == 1, (ranges, lines)


def test_the_summary_table_gives_each_value_its_meaning_and_no_verdict():
    from helpers.ranges import summary_table

    table = summary_table(
        {"ratio": 15.64, "accuracy": 0.5, "steps": 252},
        {"ratio": (10, None), "accuracy": (0.75, 1.0)},
        {"ratio": ("less memory kept", "{:.1f}x"), "accuracy": ("accuracy", "{:.2f}"),
         "steps": ("optimizer steps", "{}")},
    ).data.splitlines()
    # issue 42: a slide shows what was measured and its value, no range or verdict;
    # only a value outside its range is flagged, in words
    assert table[0] == "| what you measured | on this machine |"
    assert table[2] == "| less memory kept | 15.6x |"
    assert table[3] == ("| accuracy | **0.50: outside the range the lesson's text "
                        "relies on** |")
    assert table[4] == "| optimizer steps | 252 |"
    assert not any("in range" in row or "expected" in row for row in table)


def test_a_labs_summary_says_so_and_nothing_else_is_accepted(capsys):
    print_measured({"a": 1}, {}, where="lab")
    assert capsys.readouterr().out.splitlines() == ["Measured in this lab", "a: 1"]
    with pytest.raises(ValueError, match="'lesson' or 'lab'"):
        print_measured({"a": 1}, {}, where="chapter")


def test_the_summary_table_says_what_each_value_means_in_a_third_column():
    from helpers.ranges import summary_table

    table = summary_table(
        {"ratio": 15.64, "steps": 252}, {},
        {"ratio": ("less memory kept", "{:.1f}x", "pull it when memory is full"),
         "steps": ("optimizer steps", "{}")},
    ).data.splitlines()
    # STYLE 17: what you measured, here, and what it means; a row without a meaning
    # leaves its cell empty
    assert table[0] == "| what you measured | on this machine | what it means |"
    assert table[1] == "| --- | --- | --- |"
    assert table[2] == "| less memory kept | 15.6x | pull it when memory is full |"
    assert table[3] == "| optimizer steps | 252 |  |"
    with pytest.raises(ValueError, match="fix: steps"):
        summary_table({"steps": 1}, {}, {"steps": ("optimizer steps",)})


def test_the_summary_table_refuses_a_finding_never_measured():
    from helpers.ranges import summary_table

    with pytest.raises(KeyError, match="not measured: typo"):
        summary_table({"a": 1}, {}, {"typo": ("meaning", "{}")})


def test_one_declaration_prints_the_lines_and_the_table_of_the_three_dicts(capsys):
    from helpers.ranges import declared, summary_table

    # issue 47: each value once; the printed lines as print_measured(measured,
    # EXPECTED) wrote them, and the table as summary_table(measured, EXPECTED, findings)
    measured = {"steps": 252, "ratio": 15.64, "accuracy": 0.5, "plans": ["a", "b"]}
    expected = {"ratio": (10, None), "accuracy": (0.75, 1.0)}
    findings = {"accuracy": ("accuracy", "{:.2f}", "it learned"),
                "ratio": ("less memory kept", "{:.1f}x", "pull it"),
                "plans": ("plans", ", ".join)}
    summary = {
        "steps": (252, None, None),
        "ratio": (15.64, (10, None), (2, "less memory kept", "{:.1f}x", "pull it")),
        "accuracy": (0.5, (0.75, 1.0), (1, "accuracy", "{:.2f}", "it learned")),
        "plans": (["a", "b"], None, (3, "plans", ", ".join)),
    }
    assert declared(summary) == (measured, expected, findings)
    print_measured(measured, expected, digits=2, where="lab")
    old_lines = capsys.readouterr().out
    print_measured(summary, digits=2, where="lab")
    assert capsys.readouterr().out == old_lines
    assert "accuracy: 0.50  (expected 0.75 to 1): OUT OF RANGE" in old_lines
    table = summary_table(summary).data
    assert table == summary_table(measured, expected, findings).data
    assert table.splitlines()[2].startswith("| accuracy | **0.50: outside")
    assert table.splitlines()[4] == "| plans | a, b |  |"
    # without places, the table keeps the declaration's order
    unplaced = {name: (value, bounds, row and row[1:])
                for name, (value, bounds, row) in summary.items()}
    assert list(declared(unplaced)[2]) == ["ratio", "accuracy", "plans"]


@pytest.mark.parametrize("summary, message", [
    ({"a": 0.5}, "fix: a"),
    ({"a": (0.5, None)}, "fix: a"),
    ({"a": (1, None, (1, "a", "{}")), "b": (2, None, ("b", "{}"))}, "b has no place"),
    ({"a": (1, None, (1, "a", "{}")), "b": (2, None, (3, "b", "{}"))},
     "number the rows 1 to 2"),
])
def test_a_bad_declaration_gets_a_clear_error(summary, message):
    from helpers.ranges import summary_table

    with pytest.raises(ValueError, match=message):
        print_measured(summary)
    with pytest.raises(ValueError, match=message):
        summary_table(summary)
    with pytest.raises(TypeError, match="declaration alone"):
        summary_table({"a": 1}, {})


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.stem for lesson in LESSONS])
def test_a_lesson_declares_each_measured_value_once(lesson):
    code = "\n".join(cell.source for cell in nbformat.read(lesson, as_version=4).cells
                     if cell.cell_type == "code")
    if "print_measured(" not in code:
        return  # no summary: nothing measured against a range
    assert "SUMMARY = {" in code, f"{lesson.name}: declare the values in SUMMARY"
    assert not re.search(r"^(EXPECTED|measured) = ", code, re.M), lesson.name
    assert re.findall(r"(?:print_measured|summary_table)\((\w+)[,)]", code) \
        == ["SUMMARY"] * len(re.findall(r"(?:print_measured|summary_table)\(", code))
