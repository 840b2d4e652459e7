"""Practice 3 (Local SGD): right answers pass; near misses and typical mistakes get the intended message."""
import contextlib
import math

import pytest
from accelerate.local_sgd import LocalSGD

from helpers.practice.verdicts import CORRECT, WRONG, checker
from helpers.practice import local_sgd as l3

from practice_support import assert_verdict


def test_3_1_accepts_the_formula_written_two_ways():
    assert_verdict(l3.check_predicted_bytes.verdict(lambda s, k, p: (s // k + 1) * p), CORRECT)
    assert_verdict(l3.check_predicted_bytes.verdict(lambda s, k, p: p * (math.floor(s / k) + 1)), CORRECT)


@pytest.mark.parametrize("prediction, fragment", [
    (lambda s, k, p: s // k * p, "averages once more"),
    (lambda s, k, p: s * p, "that is DDP"),
    (lambda s, k, p: (s / k + 1) * p, "use //"),
    (lambda s, k, p: "many", "how many times"),
])
def test_3_1_rejects_typical_predictions(prediction, fragment):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG, fragment)


def local_sgd_loop(local_sgd_steps, enabled=True, call_step=True, steps_per_batch=1, accumulate=False, guard=False):
    """Lesson 3's loop, and the ways a learner may get it wrong."""
    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps, enabled=enabled) as local_sgd:
            for batch in dataloader:
                with accelerator.accumulate(model) if accumulate else contextlib.nullcontext():
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    if call_step and (accelerator.sync_gradients or not guard):
                        for _ in range(steps_per_batch):
                            local_sgd.step()
    return loop


def ddp_loop(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()


@pytest.fixture(scope="module")
def loop_runs():
    """One launch of 2 processes measures every variant of exercise 3.2 (24 steps, k = 8)."""
    variants = {"right": local_sgd_loop(8), "ddp": ddp_loop, "disabled": local_sgd_loop(8, enabled=False),
                "no step": local_sgd_loop(8, call_step=False), "step twice": local_sgd_loop(8, steps_per_batch=2)}
    return dict(zip(variants, l3.measure_loops(variants.values(), micro_batches=24)))


def judged(judge, *args):
    @checker("test")
    def check():
        judge(*args)
        return "ok"
    return check.verdict()


def test_3_2_measures_what_the_formula_predicts(loop_runs):
    run = loop_runs["right"]
    assert run["all_reduce_bytes"] == l3.expected_rounds(24, 8) * run["parameter_bytes"]
    assert run["sync_steps"] == [8, 16, 24] and run["final_gap"] == 0.0
    assert_verdict(judged(l3.judge_local_sgd_run, run, 24, 8), CORRECT)
    assert loop_runs["ddp"]["all_reduce_bytes"] == 24 * run["parameter_bytes"]


@pytest.mark.parametrize("variant, fragment", [
    ("ddp", "plain DDP"), ("disabled", "plain DDP"), ("no step", "only once"), ("step twice", "once per step"),
])
def test_3_2_rejects_typical_loops(loop_runs, variant, fragment):
    assert_verdict(judged(l3.judge_local_sgd_run, loop_runs[variant], 24, 8), WRONG, fragment)


def learners_train_loop(accelerator, model, optimizer, dataloader, local_sgd_steps):
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps, enabled=True) as local_sgd:
        for batch in dataloader:
            outputs = model(**batch)
            accelerator.backward(outputs.loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()


def test_3_2_whole_check_compares_with_the_prediction():
    verdict = l3.check_local_sgd_loop.verdict(learners_train_loop, lambda s, k, p: (s // k + 1) * p)
    assert_verdict(verdict, CORRECT, "4 averagings", "which matches")


def misspelled_loop(accelerator, model, optimizer, dataloader, local_sgd_steps):
    with LocalSGDD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps) as local_sgd:  # noqa: F821
        local_sgd.step()


def step_without_the_block(accelerator, model, optimizer, dataloader, local_sgd_steps):
    for batch in dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
        local_sgd.step()  # noqa: F821, the `with LocalSGD(...) as local_sgd:` line is missing


@pytest.mark.parametrize("loop, fragments", [
    (misspelled_loop, ("NameError", "LocalSGDD", "import it first")),
    (step_without_the_block, ("NameError", "'local_sgd'", "open that block")),
])
def test_3_2_a_failing_worker_is_one_sentence_not_a_traceback(loop, fragments):
    assert_verdict(l3.check_local_sgd_loop.verdict(loop), WRONG, *fragments)


@pytest.fixture(scope="module")
def accumulation_runs():
    """One launch measures every variant of exercise 3.3 (32 micro-batches, accumulation 2)."""
    variants = {"k=16": local_sgd_loop(16, accumulate=True), "k=8 on real steps": local_sgd_loop(8, accumulate=True, guard=True),
                "k=8": local_sgd_loop(8, accumulate=True), "k=4": local_sgd_loop(4, accumulate=True),
                "no step": local_sgd_loop(16, accumulate=True, call_step=False)}
    return dict(zip(variants, l3.measure_loops(variants.values(), micro_batches=32, gradient_accumulation_steps=2)))


@pytest.mark.parametrize("variant", ["k=16", "k=8 on real steps"])
def test_3_3_accepts_both_ways_to_count_optimizer_steps(accumulation_runs, variant):
    assert_verdict(judged(l3.judge_accumulation_run, accumulation_runs[variant], 16), CORRECT)


@pytest.mark.parametrize("variant, fragment", [
    ("k=8", "every 4 optimizer steps"), ("k=4", "every 2 optimizer steps"), ("no step", "only once"),
])
def test_3_3_rejects_counting_micro_batches(accumulation_runs, variant, fragment):
    assert_verdict(judged(l3.judge_accumulation_run, accumulation_runs[variant], 16), WRONG, fragment)
