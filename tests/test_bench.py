"""`make bench` (tools/bench.py): each notebook's slowest cell, and issue 16's time
targets flagged."""
import contextlib
import io
import json

import nbformat
import pytest
from tool_scripts import load_tool

from helpers.ranges import OUT_OF_RANGE, SUMMARY_HEADER

bench = load_tool("bench")

# its index in the notebook below: cells count from 0, the Markdown cell too
SLEEPING_CELL = 2
# as helpers.ranges prints it
SUMMARY = f"{SUMMARY_HEADER}\nloss: 9.0  (expected 0 to 1): {OUT_OF_RANGE}"


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    """One run of bench, as `make bench` runs it (a process per notebook), on a tiny
    notebook: two trivial code cells around one that sleeps 0.3 s, then a summary cell
    with a value out of range.

    Returns what it printed, bench.json's rows, and the message it exited with.
    """
    folder = tmp_path_factory.mktemp("bench")
    notebook = folder / "tiny.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_markdown_cell("# A tiny notebook"),
                   nbformat.v4.new_code_cell("x = 1"),
                   nbformat.v4.new_code_cell("import time\ntime.sleep(0.3)"),
                   nbformat.v4.new_code_cell("y = x + 1"),
                   nbformat.v4.new_code_cell(f"print({SUMMARY!r})")]
        ),
        notebook,
    )
    printed, exit_message = io.StringIO(), None
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(bench, "OUT_DIR", folder)
        try:
            bench.main([str(notebook)])
        except SystemExit as exited:
            exit_message = str(exited)
    return (printed.getvalue(), json.loads((folder / "bench.json").read_text()),
            exit_message)


def test_the_slowest_cell_is_the_one_that_sleeps(benched):
    _, [row], _ = benched
    seconds = dict(row["cell_s"])
    # every code cell timed, the Markdown cell not
    assert sorted(seconds) == [1, 2, 3, 4]
    assert row["slowest_cell"]["index"] == SLEEPING_CELL
    assert row["slowest_cell"]["seconds"] == seconds[SLEEPING_CELL] >= 0.3
    assert row["slowest_cell"]["first_line"] == "import time"
    assert all(seconds[index] < seconds[SLEEPING_CELL] for index in (1, 3, 4))


def test_the_table_shows_wall_time_peak_rss_and_the_slowest_cell(benched):
    printed, [row], _ = benched
    header, line = printed.splitlines()[:2]
    assert header.split()[:7] == ["notebook", "wall", "s", "peak", "RSS", "MiB",
                                  "slowest"]
    assert line.split()[:3] == [row["notebook"], f"{row['wall_s']:.1f}",
                                str(row["peak_rss_mib"])]
    assert f"{row['slowest_cell']['seconds']:.1f} s #{SLEEPING_CELL}" in line
    assert line.endswith("ok") and row["over_targets"] == [] and "OVER" not in printed
    assert 0 < row["wall_s"] and 0 < row["peak_rss_mib"]


def row_for(notebook, wall_s, cell_s=((1, 0.1),)):
    return {"notebook": notebook, "wall_s": wall_s,
            "cell_s": [list(pair) for pair in cell_s]}


def target_s(notebook):
    # issue 42: a lesson (the spine) 30 s, its lab 45 s, a practice notebook 20 s
    return 20 if "practice" in notebook else 45 if "_lab" in notebook else 30


@pytest.mark.parametrize(
    "notebook, wall_s, over",
    [
        ("notebooks/03_local_sgd.ipynb", 30.0, False),
        ("notebooks/03_local_sgd.ipynb", 30.1, True),
        ("notebooks/00_start_here.ipynb", 31.0, True),
        ("notebooks/03_local_sgd_lab.ipynb", 45.0, False),
        ("notebooks/03_local_sgd_lab.ipynb", 45.1, True),
        ("notebooks/practice/03_local_sgd_solution.ipynb", 20.0, False),
        ("notebooks/practice/03_local_sgd_practice.ipynb", 20.1, True),
        # neither a lesson nor a practice: no notebook target
        ("notebooks/scratch.ipynb", 600.0, False),
    ],
)
def test_a_notebook_over_its_target_is_flagged(notebook, wall_s, over):
    flagged = bench.over_targets(row_for(notebook, wall_s))
    assert flagged == (
        [f"notebook {wall_s:.1f} s > {target_s(notebook)} s"]
        if over
        else []
    )


def test_every_cell_over_15_s_is_flagged_in_any_notebook():
    row = row_for(
        "notebooks/scratch.ipynb", 40.0, cell_s=[(1, 15.0), (4, 15.2), (6, 22.0)]
    )
    assert bench.over_targets(row) == ["cell 4 15.2 s > 15 s", "cell 6 22.0 s > 15 s"]


def test_the_table_marks_a_notebook_over_a_target():
    rows = [
        {**row_for(name, wall_s), "peak_rss_mib": 100,
         "slowest_cell": {"index": 1, "seconds": 0.1}}
        for name, wall_s in [("notebooks/01_a.ipynb", 50.0),
                             ("notebooks/02_b.ipynb", 5.0)]
    ]
    for row in rows:
        row["over_targets"] = bench.over_targets(row)
    _, over, ok = bench.table(rows).splitlines()
    assert over.endswith("OVER") and ok.endswith("ok")


def test_a_value_out_of_range_still_fails_the_bench_after_the_table_and_the_json(
    benched,
):
    printed, [row], exit_message = benched
    assert exit_message == ("bench: measured values outside the lessons' "
                            "ranges: tiny loss")
    assert row["measured"] == {"loss": f"9.0  (expected 0 to 1): {OUT_OF_RANGE}"}
    assert (
        f"  tiny  loss: 9.0  (expected 0 to 1): {OUT_OF_RANGE}" in printed.splitlines()
    )
