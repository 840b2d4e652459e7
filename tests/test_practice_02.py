"""Practice 2 (Trainer and Accelerator): right answers pass; near misses and typical mistakes get the intended message."""
import math

import pytest
from transformers import TrainingArguments

from helpers import training
from helpers.practice.verdicts import CORRECT, WRONG
from helpers.practice import trainer_and_accelerator as l2

from practice_support import assert_verdict, draws_after_seeding


def arguments(**overrides):
    settings = dict(eval_strategy="epoch", per_device_train_batch_size=16, gradient_accumulation_steps=4,
                    activation_checkpointing=True, use_cpu=True, report_to="none")
    settings.update(overrides)
    return lambda output_dir: TrainingArguments(output_dir=output_dir, **settings)


def test_2_1_accepts_todays_names_and_notes_the_deprecated_one():
    assert_verdict(l2.check_training_arguments.verdict(arguments()), CORRECT, "checkpointing on")
    def old_name(output_dir):
        return TrainingArguments(output_dir=output_dir, eval_strategy="epoch", per_device_train_batch_size=16,
                                 gradient_accumulation_steps=4, gradient_checkpointing=True, report_to="none")
    assert_verdict(l2.check_training_arguments.verdict(old_name), CORRECT, "deprecated name")


@pytest.mark.parametrize("make, fragment", [
    (lambda output_dir: TrainingArguments(output_dir=output_dir, evaluation_strategy="epoch"), "renamed evaluation_strategy"),
    (arguments(no_cuda=True), "renamed no_cuda"),
    (arguments(per_device_train_batch_size=64, gradient_accumulation_steps=1), "64 examples, not 16"),
    (arguments(activation_checkpointing=False), "checkpointing is off"),
    (lambda output_dir: {"eval_strategy": "epoch"}, "should return TrainingArguments"),
])
def test_2_1_rejects_typical_arguments(make, fragment):
    assert_verdict(l2.check_training_arguments.verdict(make), WRONG, fragment)


def test_2_2_accepts_the_effective_batch_and_the_steps():
    assert_verdict(l2.check_batch_arithmetic.verdict(64, 63), CORRECT, "64 examples", "63 optimizer steps")
    assert_verdict(l2.check_batch_arithmetic.verdict(64.0, math.ceil(250 / 4)), CORRECT)


@pytest.mark.parametrize("answers, fragment", [
    ((16, 63), "that is one micro-batch"),
    ((64, 250), "that is the number of micro-batches"),
    ((64, 62), "one more, smaller step"),
])
def test_2_2_rejects_typical_arithmetic(answers, fragment):
    assert_verdict(l2.check_batch_arithmetic.verdict(*answers), WRONG, fragment)


def test_2_2_is_measured_not_assumed():
    # the check's truth comes from a real Trainer step: 16 x 4 examples with these arguments
    assert l2.examples_seen_in_one_optimizer_step(training.MICRO_BATCH_SIZE, training.TRAINER_ACCUMULATION) == 64


def set_and_return(model):
    model.accepts_loss_kwargs = False
    return model


@pytest.mark.parametrize("prepare", [lambda model: setattr(model, "accepts_loss_kwargs", False), set_and_return])
def test_2_3_accepts_the_fix(prepare):
    assert_verdict(l2.check_logged_loss_fix.verdict(prepare), CORRECT, "true mean loss")


@pytest.mark.parametrize("prepare, fragment", [
    (lambda model: None, "4 x the true mean loss"),
    (lambda model: setattr(model.config, "accepts_loss_kwargs", False), "not of its config"),
    (lambda model: setattr(model, "accepts_loss_kwargs", True), "4 x the true mean loss"),
])
def test_2_3_rejects_typical_fixes(prepare, fragment):
    assert_verdict(l2.check_logged_loss_fix.verdict(prepare), WRONG, fragment)


def accumulate_with_named_outputs(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def accumulate_zero_grad_first(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
        optimizer.zero_grad()  # outside the block: Accelerate only resets on a real step either way


@pytest.mark.parametrize("loop", [accumulate_with_named_outputs, accumulate_zero_grad_first])
def test_2_4_accepts_accumulation_loops(loop):
    assert_verdict(l2.check_accumulation_loop.verdict(loop), CORRECT, "2 optimizer steps")


@pytest.mark.parametrize("mistake, fragment", [
    ("plain_backward", "accelerator.backward(loss) divides"),
    ("no_accumulate", "stepped 4 times"),
    ("no_zero_grad", "never reset"),
])
def test_2_4_rejects_typical_loops(mistake, fragment):
    assert_verdict(l2.check_accumulation_loop.verdict(l2.mistaken_loop(**{mistake: True})), WRONG, fragment)


def test_a_check_that_builds_or_trains_leaves_the_learners_random_numbers_alone():
    check = lambda: l2.check_logged_loss_fix.verdict(set_and_return)  # "2.3 (trains with Trainer)"
    assert draws_after_seeding(check) == draws_after_seeding()
