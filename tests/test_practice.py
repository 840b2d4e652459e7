"""The practice notebooks (notebooks/practice/): each practice notebook is what
`make practice` (tools/make_practice.py) writes from its solution, each solution says
why its answer works, each check answers in both. The checks themselves:
tests/test_practice_core.py and tests/test_practice_0N.py.
"""
import re

import pytest

from helpers.paths import REPO_ROOT
from tests.tool_scripts import load_tool

PRACTICE = REPO_ROOT / "notebooks" / "practice"
LESSONS = ["01_gradient_checkpointing", "02_trainer_and_accelerator", "03_local_sgd",
           "04_adamw", "05_mixed_precision", "06_sharding", "07_plan_a_run"]
make_practice = load_tool("make_practice")


@pytest.mark.parametrize("stem", LESSONS)
def test_each_practice_notebook_is_made_from_its_solution(stem, read_notebook):
    path, made = make_practice.made_text(PRACTICE / f"{stem}_solution.ipynb")
    assert path.read_text(encoding="utf-8") == made, (
        "the practice notebook is not what `make practice` writes from the solution: "
        "edit the solution (an exercise's practice text is its cell's metadata "
        "\"practice\"), then run `make practice` and `make execute NB=...`; a practice "
        "written by hand: `python tools/make_practice.py --adopt` its solution, once")
    practice = read_notebook(path)["cells"]
    solution = [cell
                for cell in read_notebook(PRACTICE / f"{stem}_solution.ipynb")["cells"]
                if "explanation" not in cell["metadata"].get("tags", [])]
    for p, s in zip(practice, solution, strict=True):
        if "exercise" in p["metadata"].get("tags", []):
            assert "..." in "".join(p["source"]) and "..." not in "".join(s["source"])
        elif "intro" not in p["metadata"].get("tags", []):
            assert p["source"] == s["source"], "a practice text on a shared cell"


def test_make_practice_leaves_out_the_explanations_and_keeps_unchanged_outputs():
    import nbformat

    code, said = nbformat.v4.new_code_cell, nbformat.v4.new_output
    why = nbformat.v4.new_markdown_cell("Why", metadata={"tags": ["explanation"]})
    solution = nbformat.v4.new_notebook(cells=[
        why, code("x = 1", id="answer", metadata={"practice": ["x = ...\n", "# fill"]}),
        code("check(x)", id="check", outputs=[said("stream", text="correct")])])
    not_done = [said("stream", text="not done yet")]
    stored = nbformat.v4.new_notebook(cells=[
        code("x = ...\n# fill", id="answer", execution_count=1),
        code("check(x)", id="check", execution_count=2, outputs=not_done),
        code("old", id="gone")])
    made = make_practice.practice_from(solution, stored)
    assert [(c.id, c.source, c.outputs, c.execution_count) for c in made.cells] == [
        ("answer", "x = ...\n# fill", [], 1), ("check", "check(x)", not_done, 2)]
    assert "practice" not in made.cells[0].metadata
    solution.cells[2].source = "check(x, 2)"  # a changed cell waits for make execute
    assert make_practice.practice_from(solution, stored).cells[1].outputs == []


def test_adopt_makes_a_hand_written_practice_the_one_made_from_its_solution(
    tmp_path, monkeypatch
):
    import nbformat

    code, text = nbformat.v4.new_code_cell, nbformat.v4.new_markdown_cell
    exercise = {"tags": ["exercise"]}
    nbformat.write(nbformat.v4.new_notebook(cells=[
        text("Solutions", id="s0"), text("Why", id="s1", metadata={"tags": [
            "explanation"]}), code("x = 1", id="s2", metadata=exercise)]),
        tmp_path / "01_x_solution.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[
        text("Practice", id="p0"), code("x = ...", id="p1", metadata=exercise)]),
        tmp_path / "01_x_practice.ipynb")
    catalog = tmp_path / "hi" / "practice" / "01_x_practice.po"
    catalog.parent.mkdir(parents=True)
    catalog.write_text('msgctxt "p0"\nmsgid "Practice"\nmsgstr "अभ्यास"\n',
                       encoding="utf-8")
    monkeypatch.setattr(make_practice, "LOCALES_DIR", tmp_path)
    make_practice.adopt(tmp_path / "01_x_solution.ipynb")
    solution = nbformat.read(tmp_path / "01_x_solution.ipynb", as_version=4)
    assert [c.metadata.get("practice") for c in solution.cells] == [
        ["Practice"], None, ["x = ..."]]
    practice = nbformat.read(tmp_path / "01_x_practice.ipynb", as_version=4)
    assert [(c.id, c.source) for c in practice.cells] == [("s0", "Practice"),
                                                          ("s2", "x = ...")]
    assert 'msgctxt "s0"' in catalog.read_text(encoding="utf-8")


@pytest.mark.parametrize("stem", LESSONS)
def test_each_solution_says_why_and_each_heading_how_hard(stem, read_notebook):
    for kind in ("practice", "solution"):
        cells = read_notebook(PRACTICE / f"{stem}_{kind}.ipynb")["cells"]
        for before, cell in zip(cells, cells[1:]):
            text = "".join(cell["source"])
            if text.startswith("## Exercise"):
                assert re.match(r"## Exercise \d\.\d \((easy|medium|hard), \d+ "
                                r"minutes\): ", text), text.splitlines()[0]
            if kind == "solution" and "exercise" in cell["metadata"].get("tags", []):
                why = "".join(before["source"])
                assert ("**Why this works.**" in why
                        and "**The usual wrong answer.**" in why), why


def outputs_text(cell):
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.mark.parametrize("stem", LESSONS)
def test_every_check_answers_not_done_in_practice_and_correct_in_solution(
    stem, read_notebook
):
    for kind, status in (("practice", "not done yet"), ("solution", "correct")):
        checks = [
            c
            for c in read_notebook(PRACTICE / f"{stem}_{kind}.ipynb")["cells"]
            if c["cell_type"] == "code" and "".join(c["source"]).startswith("check_")
        ]
        assert len(checks) >= 3
        for cell in checks:
            assert f": {status}." in outputs_text(cell), outputs_text(cell)


@pytest.mark.parametrize("stem", LESSONS)
def test_each_lesson_links_to_its_practice_and_the_readme_lists_it(stem, read_notebook):
    cells = read_notebook(REPO_ROOT / "notebooks" / f"{stem}.ipynb")["cells"]
    lesson = "".join("".join(c["source"]) for c in cells)
    assert f"practice/{stem}_practice.ipynb" in lesson
    readme = (REPO_ROOT / "README.md").read_text()
    assert (f"notebooks/practice/{stem}_practice.ipynb" in readme
            and f"{stem}_solution.ipynb" in readme)
