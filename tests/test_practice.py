"""The practice notebooks (notebooks/practice/): each practice and its solution agree
outside the exercises, each solution says why its answer works, each check answers in
both. The checks themselves: tests/test_practice_core.py and tests/test_practice_0N.py.
"""
import re

import pytest

from helpers.paths import REPO_ROOT

PRACTICE = REPO_ROOT / "notebooks" / "practice"
LESSONS = ["01_gradient_checkpointing", "02_trainer_and_accelerator", "03_local_sgd",
           "04_adamw", "05_mixed_precision", "06_sharding", "07_plan_a_run"]


@pytest.mark.parametrize("stem", LESSONS)
def test_practice_and_solution_differ_only_in_the_exercise_cells(stem, read_notebook):
    practice = read_notebook(PRACTICE / f"{stem}_practice.ipynb")["cells"]
    solution = [cell  # each solution's "Why this works" is in the solution only
                for cell in read_notebook(PRACTICE / f"{stem}_solution.ipynb")["cells"]
                if "explanation" not in cell["metadata"].get("tags", [])]
    assert len(practice) == len(solution)
    for p, s in zip(practice, solution):
        tags = p["metadata"].get("tags", [])
        assert tags == s["metadata"].get("tags", [])
        if "exercise" in tags:
            assert "..." in "".join(p["source"]) and "..." not in "".join(s["source"])
        elif "intro" not in tags:
            assert p["source"] == s["source"], ("a shared cell was edited in only one "
                                                "of the two notebooks")


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
