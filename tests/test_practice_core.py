"""The practice core (helpers/practice/core.py), on a toy exercise: the four verdicts,
mistakes named by their outcome, several configurations, numbers of any type."""
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from practice_support import assert_judged, assert_verdict, draws_after_seeding

from helpers.practice.core import (
    CHECK_FAILED,
    CORRECT,
    NOT_DONE,
    WRONG,
    Exercise,
    Wrong,
    as_number,
    check,
    checker,
    close,
    explaining_warnings,
    learner,
)

ADDED = "you added 2 instead of doubling. Hint: multiply by 2."
CONSTANT = "your answer ignores x. Hint: use the argument."
NEGATIVE = "negative numbers have no square root here. Hint: double, don't root."

DOUBLE = Exercise(
    number="0.1",
    measure=lambda answer, x: as_number(learner(answer, x), "double(x)"),
    intended=lambda x: 2 * x,
    mistakes=[(ADDED, lambda x: x + 2), (CONSTANT, lambda x: 2),
              (NEGATIVE, lambda x: __import__("math").sqrt(-x))],
    configs=(1, 3.5),
    describe=lambda got, expected, x: f"double({x}) gave {got}, not {expected}.",
    correct=lambda got, x: f"double({x}) = {got}.",
    name="double",
    error_hints=[("ZeroDivisionError", "x may be 0.")],
)


@checker(DOUBLE)
def check_double(double):
    """``double(x)``: twice x."""


def test_right_answers_pass_and_each_mistake_gets_its_own_hint():
    assert_judged(DOUBLE, lambda x: x + x, lambda x: np.float32(x) * 2)
    assert check(DOUBLE, lambda x: x * 2).message == "double(1) = 2."


def test_an_answer_that_ignores_the_argument_fails_on_the_second_configuration():
    assert_verdict(check(DOUBLE, lambda x: 2), WRONG, CONSTANT)
    assert_verdict(check(DOUBLE, lambda x: 2 * x if x == 1 else 8), WRONG,
                   "double(3.5) gave 8, not 7.0")  # describe: no mistake matched


def test_a_mistake_is_named_only_where_it_matches_on_every_configuration():
    verdict = check(DOUBLE, lambda x: x + 2 if x == 1 else 0)  # x + 2 on 1 only
    assert_verdict(verdict, WRONG, "double(1) gave 3, not 2.")
    assert ADDED not in verdict.message


def test_the_default_description_names_the_parts_that_differ_and_the_hint():
    halves = Exercise("0.3", lambda answer, x: learner(answer, x), lambda x: {
        "half": x / 2, "x": x}, configs=(2, 4), label="x={}", describe="halve x.")
    assert_verdict(check(halves, lambda x: {"half": x / 2 if x < 3 else 0, "x": x}),
                   WRONG, "with x=4, what differs from the intended answer: half 0. "
                   "Hint: halve x.")


def test_a_learners_exception_is_one_sentence_with_a_hint():
    assert_verdict(check(DOUBLE, lambda x: 1 / 0), WRONG,
                   "calling double raised ZeroDivisionError", "x may be 0.")
    assert_verdict(check(DOUBLE, lambda x: {}[x]), WRONG, "KeyError: 1",
                   "run it on its own")
    assert_verdict(check(DOUBLE, lambda x: __import__("math").sqrt(-x)), WRONG,
                   "ValueError: math domain error: " + NEGATIVE)
    assert_verdict(check(DOUBLE, lambda x: "2"), WRONG, "should be a number")


def unfinished(x):
    return 2 * ...


def test_an_answer_holding_a_placeholder_is_not_done_yet():
    for answer in (..., unfinished, eval("lambda x: ...")):
        assert_verdict(check(DOUBLE, answer), NOT_DONE, "`...`")


def test_a_check_that_fails_itself_says_so_where_and_whom_to_tell():
    broken = Exercise("0.2", measure=lambda answer, config: {}["missing"],
                      intended=None)
    verdict = check(broken, 1)
    assert_verdict(verdict, CHECK_FAILED, "bug in the check", "KeyError: 'missing'",
                   "tests/test_practice_core.py, line", "course maintainers")
    raises = Exercise("0.4", lambda answer, x: learner(answer, x), lambda x: 1 / 0)
    line = raises.intended.__code__.co_firstlineno  # the intended answer's own line
    assert_verdict(check(raises, lambda x: 1), CHECK_FAILED, "ZeroDivisionError",
                   f"at tests/test_practice_core.py, line {line}.")


def test_the_printed_verdict(capsys):
    check_double(lambda x: x + 2)
    assert capsys.readouterr().out == f"Exercise 0.1: not quite. {ADDED[:1].upper()}" \
                                      f"{ADDED[1:]}\n"
    assert check_double.verdict(lambda x: 2 * x).status == CORRECT


@pytest.mark.parametrize("value, number", [
    (3, 3), (np.int64(3), 3), (np.float32(0.5), 0.5), (Fraction(1, 4), 0.25),
    (Decimal("1.5"), 1.5), (torch.tensor(2.5), 2.5),
    (torch.tensor(4.0, requires_grad=True), 4.0), (np.sum([2, 2, 2, 2]), 8),
])
def test_every_number_type_is_a_number(value, number):
    assert as_number(value) == number and type(as_number(value)) in (int, float)


@pytest.mark.parametrize("value, fragment", [
    (True, "truth value"), ("8", "of type str"), (torch.ones(2), "of shape (2,)"),
    (float("nan"), "nan"), (torch.empty((), device="meta"), "meta device"),
    (None, "of type NoneType"), (1 + 2j, "of type complex"),
])
def test_what_is_not_a_number_is_named(value, fragment):
    with pytest.raises(Wrong, match="should be a number") as raised:
        as_number(value)
    assert fragment in str(raised.value)


def test_a_whole_number_must_be_whole():
    assert as_number(np.float64(6.0), whole=True) == 6
    with pytest.raises(Wrong, match="rounds up"):
        as_number(6.5, whole=True)


def test_closeness_follows_the_tolerance_it_is_given():
    same = close(rel=1e-3)
    assert same({"a": (1.0, torch.tensor([1.0, float("nan")]))},
                {"a": (1.0005, torch.tensor([1.0, float("nan")]))})
    assert not same(torch.tensor([1.0]), torch.tensor([1.1]))
    assert not same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not same([1, 2], [1, 2, 3]) and not same({"a": 1}, {"b": 1})


def test_warnings_explained_are_caught_and_all_others_shown():
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with explaining_warnings("use_reentrant") as explained:
            warnings.warn("pass use_reentrant explicitly", stacklevel=1)
            warnings.warn("something else", stacklevel=1)
    assert [str(w.message) for w in explained] == ["pass use_reentrant explicitly"]
    assert [str(w.message) for w in shown] == ["something else"]


def test_a_check_leaves_the_learners_threads_and_random_numbers_alone():
    threads = torch.get_num_threads()

    def draws(x):
        torch.rand(3)
        return 2 * x

    assert draws_after_seeding(lambda: check(DOUBLE, draws)) == draws_after_seeding()
    assert torch.get_num_threads() == threads
