"""Practice 3 (Local SGD): right answers written several ways pass, each listed mistake
gets its own hint, on real processes. A kernel's first check on 2 (or 3) processes
measures every listed answer there in one launch; the later checks reuse them. What
show_communication prints is compared by nbval, in both practice 3 notebooks."""
import fractions
import time

import numpy as np
import torch
from accelerate.local_sgd import LocalSGD
from practice_support import assert_judged, assert_verdict, draws_after_seeding

from helpers.practice import check_local_sgd as l3
from helpers.practice import core
from helpers.practice.core import CORRECT, NOT_DONE, WRONG, check, edited


def test_3_3_names_an_unfinished_loop_and_one_that_raises():
    """First: its launch also measures every listed answer on 2 processes."""
    def unfinished(accelerator, model, optimizer, dataloader):
        ...

    def raises(accelerator, model, optimizer, dataloader):
        for _ in dataloader:
            local_sgd.step()  # noqa: F821

    assert_verdict(l3.check_fixed_loop.verdict(unfinished), NOT_DONE, "`...`")
    assert_verdict(l3.check_fixed_loop.verdict(raises), WRONG,
                   "calling fixed_train_loop raised NameError")


def test_the_measured_bytes_are_what_lesson_3_says():
    assert (l3.P, l3.P_WIDER) == (1800, 3464)
    assert [l3.PREDICT.intended(*case) for case in l3.STEP_CASES] == [
        (s // k + 1) * p for s, k, p in l3.STEP_CASES]
    assert [l3.PREDICT_BOTH.intended(*case) for case in l3.ACCUMULATION_CASES] == [
        (m // a * p, (m // k + 1) * p) for m, a, k, p in l3.ACCUMULATION_CASES]


def test_3_1_and_3_2_judge_predictions_written_several_ways():
    assert_judged(l3.PREDICT, lambda s, k, p: p * (s // k + 1),
                  lambda s, k, p: np.int64((s // k + 1) * p),
                  lambda s, k, p: fractions.Fraction((s // k + 1) * p),
                  lambda s, k, p: torch.tensor(float((s // k + 1) * p)))
    assert_judged(l3.PREDICT_BOTH, lambda m, a, k, p: [m // a * p, (m // k + 1) * p],
                  lambda m, a, k, p: (np.float64(m / a * p), (m // k + 1) * p))
    assert draws_after_seeding(lambda: check(
        l3.PREDICT_BOTH, l3.PREDICT_BOTH.intended)) == draws_after_seeding()


def test_3_1_says_what_an_unlisted_answer_did():
    for prediction, fragment in [
            (lambda s, k, p: 3 * p, "with steps=12, local_sgd_steps=8, "
             "parameter_bytes=1800, predicted_bytes gave 5400. Hint: count"),
            (lambda s, k, p: {(16, 8): 5400}[(s, k)], "raised KeyError: (12, 8)"),
            (lambda s, k, p: f"{p} bytes", "should be a number")]:
        assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG, fragment)


def test_3_3_judges_the_loop_by_what_it_communicates_and_trains():
    assert_judged(l3.FIX)
    assert l3.check_fixed_loop is l3.check_fixed_local_sgd_loop


def test_3_4_judges_the_averaging_on_three_processes():
    assert_verdict(l3.check_average_parameters.verdict(None), WRONG,
                   "raised TypeError: 'NoneType' object is not callable")
    assert_judged(l3.AVERAGING)
    assert_verdict(l3.check_average_parameters.verdict(l3.AVERAGING.intended),
                   CORRECT, "one all-reduce of 1,800 bytes (3,464 on the wider")


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


def test_3_3_and_3_4_right_answers_written_otherwise_measure_as_the_intended_ones():
    """In one launch on 2 processes: 3.4's check runs 3 only to tell a mistake apart
    (dividing by 2)."""
    loops = [fixed_with_enumerate, edited(l3.fixed_train_loop, ("model.train()", ""))]
    averages = [l3.AVERAGING.intended, all_reduce_then_divide, copied_by_hand]
    *runs, intended, averaged, copied = l3.launch(
        [(l3.run_loop, loop) for loop in loops] + [(l3.probe, f) for f in averages])
    fixed = l3.launched(l3.run_loop, l3.FIX.intended)  # kept from the first launch
    assert all(l3.FIX.same(run, fixed) for run in runs)
    assert l3.AVERAGING.same(averaged, intended), averaged
    assert l3.AVERAGING.same(copied, intended), copied


def test_3_2_a_pair_as_an_array_or_a_tensor_is_a_pair():
    """Issue 44: the right pair as np.array([ddp, local]) was told "should be a
    number"; a dict gets its own words."""
    def right(m, a, k, p):
        return m // a * p, (m // k + 1) * p

    assert_judged(l3.PREDICT_BOTH, lambda *case: np.array(right(*case)),
                  lambda *case: torch.tensor(right(*case)))
    assert_verdict(check(l3.PREDICT_BOTH, lambda *case: dict(zip("ab", right(*case)))),
                   WRONG, "is a dict", "as a tuple")


def only_process_0_copies_back(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        flat = accelerator.reduce(flat, reduction="mean")
        if accelerator.is_main_process:
            torch.nn.utils.vector_to_parameters(flat, model.parameters())


def test_3_4_every_process_must_hold_the_mean():
    """Issue 44: copying back on process 0 alone was called correct."""
    verdict = check(l3.AVERAGING, only_process_0_copies_back)
    assert_verdict(verdict, WRONG, "only process 0's parameters hold the mean")


def step_on_process_0_only(accelerator, model, optimizer, dataloader):
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8,
                  enabled=True) as local_sgd:
        for batch in dataloader:
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
                if accelerator.is_main_process:
                    local_sgd.step()


def test_3_3_a_collective_one_process_skips_gets_its_hint_in_seconds():
    """Issue 44: local_sgd.step() on process 0 only waited 61.8 s (gloo's 60 s), and
    the verdict ended "run it on its own"."""
    assert_verdict(check(l3.FIX, l3.FIX.intended), CORRECT)  # the listed, measured
    start = time.perf_counter()
    verdict = check(l3.FIX, step_on_process_0_only)
    assert_verdict(verdict, WRONG, "never joined", "is_main_process")
    assert "run it on its own" not in verdict.message
    # the practice's own timeout, not gloo's 60 s: the rule (issue 44) is a setting;
    # the wall time is only bounded below gloo's, so a loaded machine cannot fail it
    assert core.COLLECTIVE_TIMEOUT_S <= 15
    assert time.perf_counter() - start < 50
