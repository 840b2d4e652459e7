"""Practice 2 (Trainer and Accelerator): the intended answers and right ones written
otherwise pass, each listed mistake gets its own hint, and a form problem is "not
quite", never a failed check. The right answers are written here as a learner would."""
import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from practice_support import assert_judged, assert_verdict, draws_after_seeding
from transformers import TrainingArguments
from transformers.training_args import IntervalStrategy

from helpers.models import flat_parameters
from helpers.practice import check_trainer_and_accelerator as l2
from helpers.practice import fixtures
from helpers.practice.core import CORRECT, NOT_DONE, WRONG, cached_outcome, check


def unfinished(*args, **kwargs):
    return ...


# --- 2.1: TrainingArguments for a GPU that fits 8 examples


def test_2_1_training_arguments():
    assert_judged(
        l2.TRAINING_ARGUMENTS,
        lambda output_dir: TrainingArguments(
            output_dir, report_to="none", eval_strategy=IntervalStrategy.EPOCH
        ).set_training(batch_size=8, gradient_accumulation_steps=64 // 8,
                       activation_checkpointing=True),
        lambda output_dir: dataclasses.replace(  # a copy: its old name mirrors the new
            l2.arguments(activation_checkpointing_kwargs={"use_reentrant": False})(
                output_dir), logging_steps=5))
    assert_verdict(check(l2.TRAINING_ARGUMENTS, lambda output_dir: {}), WRONG,
                   "should return TrainingArguments")
    assert_verdict(check(l2.TRAINING_ARGUMENTS, l2.arguments(
        per_device_train_batch_size=64, gradient_accumulation_steps=64)), WRONG,
        "64 x 64 examples, not 64")
    assert_verdict(check(l2.TRAINING_ARGUMENTS, lambda output_dir: TrainingArguments(
        output_dir, evaluation_strategy="epoch")), WRONG, "renamed it eval_strategy")
    assert_verdict(l2.check_training_arguments.verdict(unfinished), NOT_DONE)


# --- 2.2: predict Trainer's logged losses


def predict_with_numpy(micro_batch_losses, accumulation, accepts_loss_kwargs):
    losses = np.array(micro_batch_losses)
    starts = np.arange(0, len(losses), accumulation)
    sums = np.add.reduceat(losses, starts)
    return sums if accepts_loss_kwargs else sums / np.diff([*starts, len(losses)])


def predict_with_torch(micro_batch_losses, accumulation, accepts_loss_kwargs):
    steps = torch.tensor(micro_batch_losses).split(accumulation)
    return [step.sum() / (1 if accepts_loss_kwargs else len(step)) for step in steps]


def test_2_2_logged_loss_prediction():
    assert_judged(l2.LOGS, predict_with_torch, predict_with_numpy)
    assert_verdict(check(l2.LOGS, lambda losses, accumulation, accepts: sum(losses)),
                   WRONG, "should return a list of numbers")
    assert_verdict(check(l2.LOGS, lambda losses, accumulation, accepts: [1.0] * 3),
                   WRONG, "gradient_accumulation_steps=4 and accepts_loss_kwargs=True",
                   "the sum of its micro-batches' losses")
    assert_verdict(l2.check_logged_loss_prediction.verdict(unfinished), NOT_DONE)


# --- 2.3: the two bugs of accumulate_by_hand


def fixed_with_accumulate(accelerator, model, optimizer, dataloader):
    step_losses, losses = [], []
    for batch in dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            losses.append(loss)  # tensors, with their graphs
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.sync_gradients:
                step_losses.append(torch.stack(losses).mean())
                losses = []
    return tuple(step_losses)


def test_2_3_fixed_loop(capsys):
    assert_judged(l2.LOOP, l2.miss(l2.DIVIDED, l2.AFTER_A_STEP), fixed_with_accumulate)
    hard_coded_2 = l2.miss(  # divides by 2, not by the accumulation
        (l2.BACKWARD, "(loss / 2).backward()"), l2.AFTER_A_STEP)
    assert_verdict(check(l2.LOOP, hard_coded_2), WRONG, "with gradient_accumulation_"
                   "steps=3, what differs from the intended answer: weights")
    assert_verdict(l2.check_fixed_loop.verdict(unfinished), NOT_DONE)
    l2.compare_with_bigger_batches(l2.accumulate_by_hand)
    assert capsys.readouterr().out.splitlines() == [
        "optimizer steps: 2 (2 plain steps on batches of 16: 2)",
        "weights equal to those of 2 plain SGD steps on batches of 16: False",
        "losses returned: 2"]


# --- 2.4: compute_loss_func over uneven micro-batches


def test_2_4_step_mean_loss():
    assert_judged(
        l2.UNEVEN,
        lambda outputs, labels, num_items_in_batch: (
            F.cross_entropy(outputs.logits, labels) * len(labels) / num_items_in_batch),
        lambda outputs, labels, num_items_in_batch: -torch.log_softmax(
            outputs["logits"], dim=-1).gather(1, labels[:, None]).sum()
        / num_items_in_batch.item())
    assert_verdict(l2.check_step_mean_loss.verdict(l2.UNEVEN.intended), CORRECT,
                   "one SGD step on all 40 examples at once")
    for index, (examples, _) in enumerate(l2.UNEVEN.configs):  # what CORRECT claims
        model = fixtures.tiny_model()
        loss = model(**fixtures.fixed_batches(examples, 1)[0]).loss
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=l2.SGD["learning_rate"]).step()
        assert l2.SAME_WEIGHTS(cached_outcome(l2.UNEVEN, "intended", index), {
            "weights": flat_parameters(model).cpu(), "logged": loss.item()})

    def forgot_return(outputs, labels, num_items_in_batch):
        F.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch

    for loss_function, hint in [
            (forgot_return, "no `return` of a value"),
            (lambda outputs, labels, num_items_in_batch: outputs.loss / 40,
             "outputs.loss is None")]:
        assert_verdict(check(l2.UNEVEN, loss_function), WRONG, hint)
    assert_verdict(l2.check_step_mean_loss.verdict(unfinished), NOT_DONE)


def test_a_check_that_trains_leaves_the_learners_random_numbers_alone():
    def fixed_loop(*args):
        return l2.miss(l2.DIVIDED, l2.AFTER_A_STEP)(*args)

    assert draws_after_seeding(
        lambda: l2.check_fixed_loop.verdict(fixed_loop)) == draws_after_seeding()


def test_2_4_a_number_returned_is_named_not_blamed_on_a_raise():
    """The second tester: `.item()` returned a float, and the check said "calling
    step_mean_loss raised AttributeError ... run it on its own" (Trainer raised)."""
    def as_float(outputs, labels, num_items_in_batch):
        return (F.cross_entropy(outputs.logits, labels, reduction="sum")
                / num_items_in_batch).item()

    verdict = check(l2.UNEVEN, as_float)
    assert_verdict(verdict, WRONG, "returned a float, not a tensor", "a tensor")
    assert "raised" not in verdict.message and "on its own" not in verdict.message


def test_2_4_a_none_returned_is_named_by_where_it_came_from():
    """Issue 44: `return outputs.loss` (None: Trainer took the labels out) was told
    "did you forget `return`?"."""
    verdict = check(l2.UNEVEN, lambda outputs, labels, num_items_in_batch: outputs.loss)
    assert_verdict(verdict, WRONG, "returned None, which is outputs.loss",
                   "takes the labels out", "outputs.logits and labels")
    assert "forget" not in verdict.message and "no `return`" not in verdict.message

    def no_return(outputs, labels, num_items_in_batch):
        F.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch

    assert_verdict(check(l2.UNEVEN, no_return), WRONG, "no `return` of a value")
