"""The practice checkers (helpers/practice): right answers pass, typical wrong ones get
the intended message.

Every exercise has correct variants a learner might write and at least two typical
mistakes. The notebooks themselves are run by nbval; the last tests check the
practice/solution pairs. Each lesson's checks are tested in tests/test_practice_0N.py.
"""
import math
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from practice_support import assert_verdict

from helpers.paths import REPO_ROOT
from helpers.practice.core import (
    CORRECT,
    WRONG,
    Exercise,
    Wrong,
    as_number,
    check,
    checker,
    explaining_warnings,
    is_unfinished,
    learner,
)

PRACTICE = REPO_ROOT / "notebooks" / "practice"


# --- the shared machinery
# ---------------------------------------------------------------

def unfinished_function(x):
    return ...


def unfinished_in_body(x):
    y = x[..., 0]  # slicing with ... is code, not a placeholder
    ...
    return y


def finished_with_slicing(x):
    return x[..., 0]


def test_placeholders_are_found_in_values_containers_and_function_sources():
    assert (is_unfinished(...) and is_unfinished({"A": ..., "B": 1})
            and is_unfinished([1, ...]))
    assert is_unfinished(unfinished_function) and is_unfinished(unfinished_in_body)
    assert (not is_unfinished(finished_with_slicing) and not is_unfinished({"A": 1})
            and not is_unfinished(0))


def test_a_check_that_fails_itself_says_so_where_and_whom_to_tell(capsys):
    # a bug in the check, not in the answer
    @checker(Exercise("0.1", lambda answer, _: {"expected": 42}["missing key"], 42))
    def check_crashes(answer):
        """The answer is passed on as it is."""

    check_crashes(42)
    printed = capsys.readouterr().out
    assert printed.startswith("Exercise 0.1: the check itself failed. This is a bug "
                              "in the check, not in your answer")
    assert ("KeyError: 'missing key'" in printed
            and "tests/test_practice.py, line" in printed)
    assert "report it" in printed and "course maintainers" in printed
    assert ("not quite" not in printed and "Traceback" not in printed
            and printed.count("\n") == 1)


def test_an_exception_in_the_learners_code_is_not_quite_in_one_sentence(capsys):
    @checker(Exercise("0.2", lambda answer, x: learner(answer, x), lambda x: x,
                      configs=(1,), name="answer"))
    def check_calls(answer):
        """The answer is passed on as it is."""

    def answer(x):
        return {"a": 1}["b"]

    check_calls(answer)
    printed = capsys.readouterr().out
    assert printed.startswith("Exercise 0.2: not quite. Calling answer "
                              "raised KeyError: 'b'.")
    assert ("check itself" not in printed and "Traceback" not in printed
            and printed.count("\n") == 1)


def test_a_check_lets_warnings_through_unless_it_explains_them():
    def warns(answer, config):
        with explaining_warnings("old name") as explained:
            warnings.warn("the old name is deprecated", FutureWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
        return len(explained)

    warning = Exercise("0.3", warns, None, correct=lambda got, _: f"explained {got}")
    with pytest.warns(UserWarning, match="something else") as shown:
        # the answer is the intended one: measured once
        assert_verdict(check(warning, None), CORRECT, "explained 1")
    assert [str(w.message) for w in shown] == ["something else"]


def test_explaining_warnings_shows_the_others_even_when_the_block_raises():
    with pytest.warns(UserWarning, match="shown anyway"), pytest.raises(ValueError):
        with explaining_warnings("explained"):
            warnings.warn("shown anyway", UserWarning, stacklevel=1)
            raise ValueError


@pytest.mark.parametrize(
    "value",
    [
        # NumPy's sums and products
        4724744,
        np.int64(4724744),
        np.int32(4724744),
        np.uint64(4724744),
        torch.tensor(4724744),
        np.array(4724744),  # 0-dimensional integer tensor and array
        4724744.0,
        np.float64(4724744.0),
        torch.tensor(4724744.0, dtype=torch.float64),
        Fraction(9449488, 2),
        # converted without a warning
        torch.tensor(4724744.0, dtype=torch.float64, requires_grad=True),
    ],
)
def test_a_whole_number_is_anything_integral_or_equal_to_an_int(value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        number = as_number(value, "bytes", whole=True)
    assert number == 4724744 and type(number) is int


@pytest.mark.parametrize(
    "value, said",
    [(float("nan"), "nan: a division by zero"),
     (np.float64("nan"), "nan: a division by zero"),
     (torch.tensor(float("nan")), "nan: a division by zero"),
     (float("inf"), "inf: a division by zero"), (-math.inf, "-inf: a division"),
     (np.float32("inf"), "inf: a division by zero"),
     (2.5, "rounds up (math.ceil) or down (//)"), (Fraction(1, 3), "rounds up"),
     (True, "a truth value"), (np.bool_(False), "a truth value"),
     (torch.tensor(True), "a truth value"), ("256", "of type str"),
     (None, "of type NoneType"), ([256], "of type list"), (1 + 0j, "of type complex"),
     (torch.tensor([256]), "shape (1,)"), (np.array([256, 1]), "shape (2,)"),
     (torch.empty((), device="meta"), "meta device"),
     (torch.tensor(1, device="meta"), "meta device")],
)
def test_a_whole_number_says_why_anything_else_is_not_one(value, said):
    with pytest.raises(Wrong) as raised:
        as_number(value, "bytes", whole=True)
    assert str(raised.value).startswith(
        "bytes should be a whole number, but it is "
    ) and said in str(raised.value)
    assert "Hint: " in str(raised.value)


def test_a_learners_nan_is_not_quite_never_a_check_that_failed_itself():
    @checker(Exercise("0.4", lambda answer, _: as_number(learner(answer), "count",
                                                         whole=True),
                      lambda: 12, correct=lambda got, _: f"{got:,} bytes"))
    def check_count(answer):
        """The answer is passed on as it is."""

    assert_verdict(check_count.verdict(lambda: float("nan")), WRONG,
                   "count should be a whole number, but it is nan")
    assert_verdict(check_count.verdict(lambda: float("-inf")), WRONG,
                   "count should be a whole number, but it is -inf")
    assert_verdict(check_count.verdict(lambda: np.int64(3) * 4), CORRECT, "12 bytes")


# --- the notebooks
# ------------------------------------------------------------------------

LESSONS = ["01_gradient_checkpointing", "02_trainer_and_accelerator", "03_local_sgd",
           "04_adamw", "05_mixed_precision", "06_sharding"]
# markdown that only a solution has: why its answer works, the usual wrong one


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
