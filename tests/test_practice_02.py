"""Practice 2 (Trainer and Accelerator): right answers pass however written; near misses are "not quite", with the
hint naming what they did. Each exercise has at least three near misses, among them the lesson's own cell copied."""
import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import TrainingArguments
from transformers.training_args import IntervalStrategy

from helpers.practice.verdicts import CHECK_FAILED, CORRECT, NOT_DONE, WRONG
from helpers.practice import trainer_and_accelerator as l2

from practice_support import assert_verdict, draws_after_seeding


# --- 2.1: TrainingArguments for a GPU that fits 8 examples ------------------------------------------------

def arguments(**overrides):
    settings = dict(eval_strategy="epoch", per_device_train_batch_size=8, gradient_accumulation_steps=8,
                    activation_checkpointing=True, report_to="none")
    settings.update(overrides)
    return lambda output_dir: TrainingArguments(output_dir=output_dir, **settings)


@pytest.mark.parametrize("make", [
    arguments(),
    arguments(eval_strategy=IntervalStrategy.EPOCH, use_cpu=True,
              activation_checkpointing_kwargs={"use_reentrant": False}),
    lambda output_dir: TrainingArguments(output_dir, report_to="none", eval_strategy="epoch",
                                         gradient_accumulation_steps=64 // 8, per_device_train_batch_size=8,
                                         activation_checkpointing=True, logging_steps=10),
])
def test_2_1_accepts_the_arguments_however_written(make):
    assert_verdict(l2.check_training_arguments.verdict(make), CORRECT, "64 examples in 8 micro-batches of 8",
                   "ran its forward pass twice")


@pytest.mark.parametrize("make, fragments", [
    (arguments(gradient_accumulation_steps=4), ["learned from 32 examples (4 micro-batches of 8"]),
    (arguments(per_device_train_batch_size=64, gradient_accumulation_steps=1),
     ["took 64 examples at once", "exactly what does not fit"]),
    # the lesson's cell, copied: its micro-batches of 16
    (arguments(per_device_train_batch_size=16, gradient_accumulation_steps=4,
               activation_checkpointing_kwargs={"use_reentrant": False}), ["took 16 examples at once"]),
    (arguments(activation_checkpointing=None, gradient_checkpointing=True), ["deprecated name"]),
    (arguments(activation_checkpointing_kwargs={"every_n_layers": 2}),
     ["only 1 of the model's 2 layers was recomputed", "every_n_layers"]),
    (arguments(activation_checkpointing=False), ["no layer was recomputed"]),
    (arguments(eval_strategy="no"), ['eval_strategy is "no"']),
    (arguments(per_device_train_batch_size=64, gradient_accumulation_steps=64), ["4096 examples, not 64"]),
    (lambda output_dir: TrainingArguments(output_dir=output_dir, evaluation_strategy="epoch"),
     ["renamed evaluation_strategy"]),
    (lambda output_dir: {"eval_strategy": "epoch"}, ["should return TrainingArguments"]),
])
def test_2_1_near_misses_are_not_quite_and_named(make, fragments):
    assert_verdict(l2.check_training_arguments.verdict(make), WRONG, *fragments)


def test_2_1_the_deprecated_name_alone_is_the_only_problem_named():
    verdict = l2.check_training_arguments.verdict(arguments(activation_checkpointing=None,
                                                            gradient_checkpointing=True))
    assert_verdict(verdict, WRONG, "activation_checkpointing")
    assert "examples" not in verdict.message and "recomputed" not in verdict.message


# --- 2.2: predict Trainer's logged losses -----------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def measured_once():
    """The Trainer runs of 2.2 once for this module (every verdict would repeat the same two runs)."""
    real = l2.micro_batch_losses_and_logs
    l2.micro_batch_losses_and_logs = functools.lru_cache(maxsize=1)(real)
    yield
    l2.micro_batch_losses_and_logs = real


def groups(losses, accumulation):
    return [losses[start:start + accumulation] for start in range(0, len(losses), accumulation)]


def predict_with_a_loop(micro_batch_losses, accumulation, accepts_loss_kwargs):
    logged = []
    for step in groups(micro_batch_losses, accumulation):
        logged.append(sum(step) if accepts_loss_kwargs else sum(step) / len(step))
    return logged


def predict_with_numpy(micro_batch_losses, accumulation, accepts_loss_kwargs):
    losses = np.array(micro_batch_losses)
    starts = np.arange(0, len(losses), accumulation)
    sums = np.add.reduceat(losses, starts)
    counts = np.diff(np.append(starts, len(losses)))
    return sums if accepts_loss_kwargs else sums / counts


def predict_with_torch(micro_batch_losses, accumulation, accepts_loss_kwargs):
    return tuple(torch.tensor(step).sum() / (1 if accepts_loss_kwargs else len(step))
                 for step in groups(micro_batch_losses, accumulation))


@pytest.mark.parametrize("predict", [predict_with_a_loop, predict_with_numpy, predict_with_torch])
def test_2_2_accepts_the_prediction_however_written(predict):
    assert_verdict(l2.check_logged_loss_prediction.verdict(predict), CORRECT, "3 optimizer steps of 4, 4, 2",
                   "2 real Trainer runs")


def means_always(losses, accumulation, accepts_loss_kwargs):  # believes Trainer always divides
    return [sum(step) / len(step) for step in groups(losses, accumulation)]


def sums_always(losses, accumulation, accepts_loss_kwargs):  # believes the fix changes nothing in the log
    return [sum(step) for step in groups(losses, accumulation)]


def last_step_divided_by_accumulation(losses, accumulation, accepts_loss_kwargs):
    return [sum(step) / (1 if accepts_loss_kwargs else accumulation) for step in groups(losses, accumulation)]


def four_times_the_mean(losses, accumulation, accepts_loss_kwargs):  # lesson 2's "4 times", applied everywhere
    factor = accumulation if accepts_loss_kwargs else 1
    return [sum(step) / len(step) * factor for step in groups(losses, accumulation)]


def no_last_step(losses, accumulation, accepts_loss_kwargs):
    return predict_with_a_loop(losses, accumulation, accepts_loss_kwargs)[:len(losses) // accumulation]


def one_per_micro_batch(losses, accumulation, accepts_loss_kwargs):
    return [loss * (1 if accepts_loss_kwargs else 1 / accumulation) for loss in losses]


def swapped(losses, accumulation, accepts_loss_kwargs):
    return predict_with_a_loop(losses, accumulation, not accepts_loss_kwargs)


@pytest.mark.parametrize("predict, fragments", [
    (means_always, ["accepts_loss_kwargs=True", "divides by nothing", "sum of each step's micro-batch losses"]),
    (swapped, ["accepts_loss_kwargs=True", "divides by nothing"]),
    (sums_always, ["accepts_loss_kwargs=False", "divides each micro-batch's loss", "logs their mean"]),
    (last_step_divided_by_accumulation, ["accepts_loss_kwargs=False", "only 2 micro-batches",
                                         "not by gradient_accumulation_steps=4"]),
    (four_times_the_mean, ["accepts_loss_kwargs=True", "only 2 micro-batches", "not 4 times"]),
    (no_last_step, ["one more, smaller optimizer step", "3 numbers"]),
    (one_per_micro_batch, ["one number per micro-batch", "once per optimizer step"]),
    (lambda losses, accumulation, accepts_loss_kwargs: sum(losses), ["list of numbers"]),
])
def test_2_2_near_misses_are_not_quite_and_named(predict, fragments):
    assert_verdict(l2.check_logged_loss_prediction.verdict(predict), WRONG, *fragments)


def test_2_2_the_truth_is_trainers_own_log():
    # the prediction is checked against Trainer's logs, which follow the rule the right answer states
    losses, logged = l2.micro_batch_losses_and_logs()
    assert len(losses) == 10 and len(logged[True]) == len(logged[False]) == 3
    assert l2.same_numbers(logged[True], predict_with_a_loop(losses, 4, True))
    assert l2.same_numbers(logged[False], predict_with_a_loop(losses, 4, False))


# --- 2.3: the two bugs of accumulate_by_hand --------------------------------------------------------------

def fixed_by_hand(accelerator, model, optimizer, dataloader):
    step_losses, losses = [], []
    for step, batch in enumerate(dataloader):
        loss = model(**batch).loss
        accelerator.backward(loss)
        losses.append(loss.item())
        if (step + 1) % accelerator.gradient_accumulation_steps == 0:
            optimizer.step()
            step_losses.append(sum(losses) / len(losses))
            losses = []
            optimizer.zero_grad()
    return step_losses


def fixed_with_accumulate(accelerator, model, optimizer, dataloader):
    step_losses, losses = [], []
    for batch in dataloader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            accelerator.backward(outputs.loss)
            losses.append(outputs.loss.item())
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.sync_gradients:
                step_losses.append(sum(losses) / len(losses))
                losses = []
    return step_losses


def fixed_by_dividing_the_loss(accelerator, model, optimizer, dataloader):
    step_losses, losses = [], []
    for step, batch in enumerate(dataloader):
        loss = model(**batch).loss
        (loss / 2).backward()
        losses.append(loss.item())
        if step % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
            step_losses.append(np.mean(losses))
            losses = []
    return step_losses


def accumulate_around_the_loop_as_given(accelerator, model, optimizer, dataloader):
    step_losses, losses = [], []
    for step, batch in enumerate(dataloader):
        with accelerator.accumulate(model):  # skips zero_grad between steps; divides in backward
            loss = model(**batch).loss
            accelerator.backward(loss)
            losses.append(loss.item())
            if (step + 1) % accelerator.gradient_accumulation_steps == 0:
                optimizer.step()
                step_losses.append(sum(losses) / len(losses))
                losses = []
            optimizer.zero_grad()
    return step_losses


@pytest.mark.parametrize("loop", [fixed_by_hand, fixed_with_accumulate, fixed_by_dividing_the_loss,
                                  accumulate_around_the_loop_as_given])
def test_2_3_accepts_fixes_however_written(loop):
    assert_verdict(l2.check_fixed_loop.verdict(loop), CORRECT, "2 optimizer steps", "the mean loss of each step")


def lessons_loop(accelerator, model, optimizer, dataloader):  # lesson 2's cell, copied: it returns nothing
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()


def records_every_micro_batch(accelerator, model, optimizer, dataloader):
    losses = []
    for batch in dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            losses.append(loss.item())
            optimizer.step()
            optimizer.zero_grad()
    return losses


def records_the_sum(accelerator, model, optimizer, dataloader):
    step_losses, losses = [], []
    for batch in dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            losses.append(loss.item())
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.sync_gradients:
                step_losses.append(sum(losses))
                losses = []
    return step_losses


def raises(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        model(batch)  # a dict where the model wants input_ids


@pytest.mark.parametrize("loop, fragments", [
    (l2.accumulation_by_hand(), ["the loop as given", "both bugs"]),
    (l2.accumulation_by_hand(plain_backward=False), ["only the last micro-batch's gradient", "erased"]),
    (l2.accumulation_by_hand(zero_grad_every_micro_batch=False), ["added, not averaged",
                                                                 "accelerator.backward(loss)"]),
    (l2.accumulation_by_hand(plain_backward=False, zero_grad_every_micro_batch=False, never_zero_grad=True),
     ["never reset"]),
    (l2.accumulation_by_hand(plain_backward=False, zero_grad_every_micro_batch=False,
                             step_every_micro_batch=True), ["stepped 4 times", "after every micro-batch"]),
    (lessons_loop, ["weights are right", "returned None"]),
    (records_every_micro_batch, ["one loss per micro-batch"]),
    (records_the_sum, ["the sum of the micro-batches' losses"]),
    (raises, ["calling fixed_loop raised"]),
])
def test_2_3_near_misses_are_not_quite_and_named(loop, fragments):
    assert_verdict(l2.check_fixed_loop.verdict(loop), WRONG, *fragments)


def test_2_3_the_comparison_shows_the_symptom_not_the_cause(capsys):
    l2.compare_with_bigger_batches(l2.accumulation_by_hand())
    assert capsys.readouterr().out == ("optimizer steps: 2 (2 plain steps on batches of 16: 2)\n"
                                       "weights equal to those of 2 plain SGD steps on batches of 16: False\n"
                                       "losses returned: 2\n")


# --- 2.4: compute_loss_func over uneven micro-batches -----------------------------------------------------

@pytest.mark.parametrize("loss_function", [
    lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels, reduction="sum")
    / num_items_in_batch,
    lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels) * len(labels)
    / num_items_in_batch,
    lambda outputs, labels, num_items_in_batch: torch.nn.CrossEntropyLoss(reduction="sum")(
        outputs["logits"], labels) / num_items_in_batch.item(),
    lambda outputs, labels, num_items_in_batch: -torch.log_softmax(outputs[0], dim=-1).gather(
        1, labels[:, None]).sum() / num_items_in_batch,
])
def test_2_4_accepts_the_loss_however_written(loss_function):
    assert_verdict(l2.check_step_mean_loss.verdict(loss_function), CORRECT, "all 40 examples at once")


@pytest.mark.parametrize("loss_function, fragments", [
    # the model's own loss, as lesson 2 trained: each micro-batch's mean
    (lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels),
     ["each micro-batch's own mean", "about 3 times too far"]),
    (lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels) / 3,
     ["averaged the 3 micro-batch means", "8 examples, not 16"]),
    (lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels, reduction="sum"),
     ["the sum of the micro-batch's losses", "40 times the mean"]),
    (lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels, reduction="sum") / 48,
     ["divided by 48", "only 40 examples"]),
    (lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels) / num_items_in_batch,
     ["by num_items_in_batch again"]),
    (lambda outputs, labels, num_items_in_batch: outputs.loss / num_items_in_batch, ["outputs.loss is None"]),
    (lambda outputs, labels, num_items_in_batch: F.cross_entropy(outputs.logits, labels).item(),
     ["return the loss as a tensor"]),
    (lambda outputs, labels: F.cross_entropy(outputs.logits, labels), ["num_items_in_batch=..."]),
])
def test_2_4_near_misses_are_not_quite_and_named(loss_function, fragments):
    assert_verdict(l2.check_step_mean_loss.verdict(loss_function), WRONG, *fragments)


# --- every check -------------------------------------------------------------------------------------------

def unfinished(*args, **kwargs):
    ...


@pytest.mark.parametrize("check", [l2.check_training_arguments, l2.check_logged_loss_prediction,
                                   l2.check_fixed_loop, l2.check_step_mean_loss])
def test_an_unfinished_answer_is_not_done_yet(check):
    assert_verdict(check.verdict(unfinished), NOT_DONE, "`...`")


def test_a_bug_in_the_check_says_so_and_where(monkeypatch):
    def broken_reference():
        raise RuntimeError("the reference broke")

    monkeypatch.setattr(l2, "reference_run", broken_reference)
    assert_verdict(l2.check_fixed_loop.verdict(fixed_by_hand), CHECK_FAILED, "RuntimeError: the reference broke",
                   "helpers/practice/trainer_and_accelerator.py, line")


@pytest.mark.parametrize("check, answer", [
    (l2.check_training_arguments, arguments()),  # trains one Trainer step
    (l2.check_fixed_loop, fixed_by_hand),  # an Accelerate loop
    (l2.check_step_mean_loss, lambda outputs, labels, num_items_in_batch: F.cross_entropy(
        outputs.logits, labels, reduction="sum") / num_items_in_batch),  # a Trainer step
])
def test_a_check_that_builds_or_trains_leaves_the_learners_random_numbers_alone(check, answer):
    assert draws_after_seeding(lambda: check.verdict(answer)) == draws_after_seeding()


def test_2_2_leaves_the_learners_random_numbers_alone():
    l2.micro_batch_losses_and_logs.cache_clear()  # the Trainer runs themselves, not the module's cached copy
    assert draws_after_seeding(lambda: l2.check_logged_loss_prediction.verdict(predict_with_a_loop)) \
        == draws_after_seeding()
