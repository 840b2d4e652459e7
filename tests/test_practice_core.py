"""The practice core (helpers/practice/core.py), on a toy exercise: the four verdicts,
mistakes named by their outcome, configurations, numbers of any type, warnings."""
import math
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from practice_support import assert_judged, assert_verdict, draws_after_seeding

from helpers.practice import core
from helpers.practice.core import CORRECT, NOT_DONE, WRONG, Exercise, check

ADDED = "you added 2 instead of doubling. Hint: multiply by 2."
CONSTANT = "your answer ignores x. Hint: use the argument."
NEGATIVE = "negative numbers have no square root here. Hint: double, don't root."

DOUBLE = Exercise(
    "0.1", lambda answer, x: core.as_number(core.learner(answer, x), "double(x)"),
    intended=lambda x: 2 * x, configs=(1, 3.5), name="double",
    mistakes=[(ADDED, lambda x: x + 2), (CONSTANT, lambda x: 2),
              (NEGATIVE, lambda x: math.sqrt(-x))],
    describe=lambda got, expected, x: f"double({x}) gave {got}, not {expected}.",
    correct=lambda got, x: f"double({x}) = {got}.",
    error_hints=[("ZeroDivisionError", "x may be 0.")])


@core.checker(DOUBLE)
def check_double(double):
    """``double(x)``: twice x."""


def test_right_answers_pass_each_mistake_gets_its_own_hint_and_nothing_else_changes():
    threads = torch.get_num_threads()
    assert_judged(DOUBLE, lambda x: x + x, lambda x: np.float32(x) * 2)
    assert check(DOUBLE, lambda x: x * 2).message == "double(1) = 2."
    seeded = draws_after_seeding(  # with an answer that draws random numbers
        lambda: check(DOUBLE, lambda x: (torch.rand(3), 2 * x)[1]))
    assert seeded == draws_after_seeding() and torch.get_num_threads() == threads


def test_a_mistake_is_named_only_where_it_matches_on_every_configuration():
    assert_verdict(check(DOUBLE, lambda x: 2), WRONG, CONSTANT)
    assert_verdict(check(DOUBLE, lambda x: 2 * x if x == 1 else 8), WRONG,
                   "double(3.5) gave 8, not 7.0")  # describe: no mistake matched
    assert check(DOUBLE, lambda x: x + 2 if x == 1 else 0).message == (  # not ADDED
        "double(1) gave 3, not 2.")
    # the default description: what differs, on which configuration, and the hint
    halves = Exercise("0.3", lambda answer, x: core.learner(answer, x), lambda x: {
        "half": x / 2, "x": x}, configs=(2, 4), label="x={}", describe="halve x.")
    assert check(halves, lambda x: {"half": x / 2 if x < 3 else 0, "x": x}).message == (
        "with x=4, what differs from the intended answer: half 0. Hint: halve x.")


def test_a_learners_exception_or_nan_is_not_quite_in_one_sentence():
    assert_verdict(check(DOUBLE, lambda x: 1 / 0), WRONG,
                   "calling double raised ZeroDivisionError", "x may be 0.")
    assert_verdict(check(DOUBLE, str.upper), WRONG, "raised TypeError", "on its own")
    assert_verdict(check(DOUBLE, lambda x: math.sqrt(-x)), WRONG,
                   "ValueError: math domain error: " + NEGATIVE)
    assert_verdict(check(DOUBLE, lambda x: x * math.inf), WRONG,
                   "double(x) should be a number, but it is inf")


def test_an_answer_holding_a_placeholder_is_not_done_yet():
    def unfinished(x):
        return x[..., 0] * ...  # slicing with ... is code; the other ... a placeholder

    def finished(x):
        return x[..., 0]

    for answer in (..., unfinished, eval("lambda x: ..."), [1, ...], {"A": ...}):
        assert_verdict(check(DOUBLE, answer), NOT_DONE, "`...`")
    assert not any(map(core.is_unfinished, (finished, {"A": 1}, [0])))


def test_the_printed_verdict_and_a_check_that_fails_itself(capsys):
    check_double(lambda x: x + 2)
    assert capsys.readouterr().out == f"Exercise 0.1: not quite. Y{ADDED[1:]}\n"
    broken = Exercise("0.2", measure=lambda answer, config: {}["missing"], intended=0)
    core.checker(broken)(lambda answer: None)(1)
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and printed.startswith(
        "Exercise 0.2: the check itself failed. This is a bug in the check, not in "
        "your answer: KeyError: 'missing', raised at tests/test_practice_core.py, line")
    raises = Exercise("0.4", lambda answer, x: core.learner(answer, x), lambda x: 1 / 0)
    line = raises.intended.__code__.co_firstlineno  # the intended answer's own line
    assert_verdict(check(raises, lambda x: 1), core.CHECK_FAILED, "ZeroDivisionError",
                   f"at tests/test_practice_core.py, line {line}.", "maintainers")


@pytest.mark.parametrize("value, number", [
    (3, 3), (np.sum([2, 2, 2, 2]), 8), (np.array(3), 3), (torch.tensor(3), 3),
    (np.float64(6.0), 6), (Fraction(8, 2), 4), (np.float32(0.5), 0.5),
    (Fraction(1, 4), 0.25), (Decimal("1.5"), 1.5),
    (torch.tensor(4.0, dtype=torch.float64, requires_grad=True), 4.0)])
def test_every_number_type_is_a_number_and_a_whole_one_an_int(value, number):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a tensor that requires grad, converted quietly
        assert core.as_number(value) == number
        if float(number).is_integer():
            assert type(core.as_number(value, whole=True)) is int


@pytest.mark.parametrize("value, said", [
    (True, "truth value"), (torch.tensor(True), "truth value"), ("8", "of type str"),
    (None, "of type NoneType"), ([8], "of type list"), (torch.ones(2), "of shape (2,)"),
    (torch.tensor(1, device="meta"), "device='meta'"), (2.5, "rounds up (math.ceil)"),
    (torch.tensor(math.nan), "nan: a division"), (-math.inf, "-inf: a division")])
def test_what_is_not_a_whole_number_is_named_with_a_hint(value, said):
    with pytest.raises(core.Wrong, match="^bytes should be a whole number, but") as no:
        core.as_number(value, "bytes", whole=True)
    assert said in str(no.value) and "Hint: " in str(no.value)


def test_closeness_follows_the_tolerance_it_is_given():
    same = core.close(rel=1e-3)
    assert same({"a": (1.0, torch.tensor([1.0, math.nan]))},
                {"a": (1.0005, torch.tensor([1.0, math.nan]))})
    assert not same(torch.tensor([1.0]), torch.tensor([1.1]))
    assert not same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not same([1, 2], [1, 2, 3]) and not same({"a": 1}, {"b": 1})


def test_warnings_explained_are_caught_and_all_others_shown_even_after_an_error():
    def warns(answer, config):
        with core.explaining_warnings("old name") as explained:
            warnings.warn("the old name is deprecated", FutureWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
        return len(explained)

    warning = Exercise("0.5", warns, None, correct=lambda got, _: f"explained {got}")
    with pytest.warns(UserWarning) as shown:
        assert_verdict(check(warning, None), CORRECT, "explained 1")
        with pytest.raises(ValueError), core.explaining_warnings("explained"):
            warnings.warn("shown anyway", UserWarning, stacklevel=1)
            raise ValueError
    assert [str(w.message) for w in shown] == ["something else", "shown anyway"]


def doubled_and_counted(values):  # a toy intended answer for core.edited
    total, count = 0, 0
    for value in values:
        total += 2 * value
        count += 1
    return total, count


def test_a_near_miss_is_the_intended_answer_edited_line_by_line():
    cut = core.edited(doubled_and_counted, ("count += 1", ""))
    two_lines = core.edited(doubled_and_counted, ("total += 2 * value", (
        "if value > 0:\n    total += 2 * value")))
    out_of_the_loop = core.edited(doubled_and_counted, ("count += 1", "count += 1", -1))
    assert doubled_and_counted([1, -2, 3]) == (4, 3)
    assert (cut([1, -2, 3]), two_lines([1, -2, 3]), out_of_the_loop([1, -2, 3])) == (
        (4, 0), (8, 3), (4, 1))
    assert cut is not doubled_and_counted  # defined anew beside it, not replaced
    with pytest.raises(ValueError, match="has no line 'count \\+= 2' to edit"):
        core.edited(doubled_and_counted, ("count += 2", ""))
