"""Practice 3 (Local SGD): right answers written several ways pass, each listed mistake
gets its own hint, on real processes. An exercise's first check measures its intended
answer and every mistake in one launch; the later checks reuse those. What
show_communication prints is compared by nbval, in both practice 3 notebooks."""
import fractions

import numpy as np
import pytest
import torch
from accelerate.local_sgd import LocalSGD
from practice_support import assert_judged, assert_verdict, draws_after_seeding

from helpers.practice import check_local_sgd as l3
from helpers.practice.core import CORRECT, NOT_DONE, WRONG, check

# --- 3.1 and 3.2: predict the bytes ---------------------------------------------------


def test_the_measured_bytes_are_what_lesson_3_says():
    assert (l3.parameter_bytes(l3.HIDDEN), l3.parameter_bytes(l3.WIDER)) == (1800, 3464)
    for cases, hidden in l3.STEP_CASES:
        p = l3.parameter_bytes(hidden)
        assert [l3.lesson_3_measured(s, k, p) for s, k in cases] == [
            (s // k + 1) * p for s, k in cases]
    for cases, hidden in l3.ACCUMULATION_CASES:
        p = l3.parameter_bytes(hidden)
        assert [l3.both_measured(m, a, k, p) for m, a, k in cases] == [
            (m // a * p, (m // k + 1) * p) for m, a, k in cases]


def test_3_1_judges_predictions_written_several_ways():
    assert_judged(l3.PREDICT, lambda s, k, p: p * (s // k + 1),
                  lambda s, k, p: np.int64((s // k + 1) * p),
                  lambda s, k, p: fractions.Fraction((s // k + 1) * p),
                  lambda s, k, p: torch.tensor(float((s // k + 1) * p)))


@pytest.mark.parametrize("prediction, fragment", [
    (lambda s, k, p: 3 * p, "for steps=12, local_sgd_steps=8 and 1,800 bytes of "
     "parameters, you predicted 5,400; measured on 2 processes, the loop all-reduced "
     "3,600"),
    (lambda s, k, p: {(16, 8): 5400}[(s, k)], "raised KeyError: (12, 8)"),
    (lambda s, k, p: f"{p} bytes", "should be a number"),
])
def test_3_1_says_what_an_unlisted_answer_did(prediction, fragment):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG, fragment)


def test_3_2_judges_both_predictions_and_keeps_the_learners_random_numbers():
    assert_judged(l3.PREDICT_BOTH, lambda m, a, k, p: [m // a * p, (m // k + 1) * p],
                  lambda m, a, k, p: (np.float64(m / a * p), (m // k + 1) * p))
    assert draws_after_seeding(lambda: check(
        l3.PREDICT_BOTH, l3.PREDICT_BOTH.intended)) == draws_after_seeding()


def assert_measured_as_intended(exercise, measure, processes, *right_answers):
    """Right answers of a launching exercise, measured in one launch with the intended
    one, are the same as it by the exercise's own tolerance: the check's first test."""
    intended, *results = l3.launch([(measure, answer) for answer in (
        exercise.intended, *right_answers)], processes)
    for result in results:
        assert exercise.same(result, intended), result


# --- 3.3: the misplaced lines ---------------------------------------------------------

def fixed_with_enumerate(accelerator, model, optimizer, dataloader):
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8,
                  enabled=True) as local_sgd:
        for _, batch in enumerate(dataloader):
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
                local_sgd.step()


def test_3_3_judges_the_loop_by_what_it_communicates_and_trains():
    assert_judged(l3.FIX)  # one launch: the intended loop and every mistake
    assert_measured_as_intended(l3.FIX, l3.runs_of, 2, fixed_with_enumerate,
                                l3.from_source(l3.FIXED_LOOP,
                                               ("        model.train()\n", "")))
    assert l3.check_fixed_loop is l3.check_fixed_local_sgd_loop


def test_3_3_names_an_unfinished_loop_and_one_that_raises():
    def unfinished(accelerator, model, optimizer, dataloader):
        ...

    def raises(accelerator, model, optimizer, dataloader):
        for _ in dataloader:
            local_sgd.step()  # noqa: F821

    assert_verdict(l3.check_fixed_loop.verdict(unfinished), NOT_DONE, "`...`")
    assert_verdict(l3.check_fixed_loop.verdict(raises), WRONG,
                   "calling fixed_train_loop raised NameError", "inside that block")


# --- 3.4: one all-reduce per averaging ------------------------------------------------

def all_reduce_then_divide(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.distributed.all_reduce(flat)
        torch.nn.utils.vector_to_parameters(flat / accelerator.num_processes,
                                            model.parameters())


def copied_by_hand(accelerator, model):
    parameters = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in parameters])
    flat = accelerator.reduce(flat, reduction="mean")
    with torch.no_grad():
        for p, part in zip(parameters, flat.split([p.numel() for p in parameters])):
            p.copy_(part.view_as(p))


def test_3_4_judges_the_averaging_on_three_processes():
    assert_judged(l3.AVERAGING)
    assert_measured_as_intended(l3.AVERAGING, l3.probe, 3, all_reduce_then_divide,
                                copied_by_hand)
    assert_verdict(l3.check_average_parameters.verdict(l3.AVERAGING.intended),
                   CORRECT, "one all-reduce of 1,800 bytes (3,464 on the wider")


def test_3_4_names_an_answer_that_is_not_a_function():
    assert_verdict(l3.check_average_parameters.verdict(None), WRONG,
                   "should be a function, not None")
