"""Checks for notebooks/practice/02_trainer_and_accelerator_practice.ipynb (lesson 02),
on the practice core. Each runs the answer for real on the tiny DistilBERT (a Trainer
step, an Accelerate loop) and measures what it did: the examples of each forward pass,
the layers recomputed in backward, the losses Trainer logged, the weights afterwards.
"""
import collections
import functools
import gc
import inspect

import torch
import torch.nn.functional as F

from helpers.data import make_dataloader
from helpers.models import flat_parameters
from helpers.practice import core, fixtures
from helpers.random_state import global_random_state_kept

# float32 rounding in a step or two
WEIGHTS_TOLERANCE = 1e-5 if fixtures.ON_CPU else 1e-4


def trainer_run(*args, **kwargs):
    """fixtures.trainer_run; its gc.collect() takes 0.5 s unless old objects freeze."""
    gc.freeze()
    try:
        return fixtures.trainer_run(*args, **kwargs)
    finally:
        gc.unfreeze()


# --- 2.1: the slide's batch on a smaller GPU ---------------------------------------

OLD_NAME = "`gradient_checkpointing` is deprecated"  # TrainingArguments' FutureWarning


def measure_arguments(make_training_args, config):
    """The learner's TrainingArguments: their evaluation strategy, whether they were
    given the deprecated name, and what one Trainer step with their batch and
    checkpointing settings did (``trained``)."""
    with core.explaining_warnings(OLD_NAME) as warnings:
        args = fixtures.learners_arguments(make_training_args)
    micro_batch, accumulation = (args.per_device_train_batch_size,
                                 args.gradient_accumulation_steps)
    if micro_batch * accumulation > 512:  # too many to train here, and wrong anyway
        raise core.Wrong(f"one optimizer step would learn from {micro_batch} x "
                         f"{accumulation} examples, not 64.")
    checkpointing = args.activation_checkpointing, args.activation_checkpointing_kwargs
    key = repr((micro_batch, accumulation, checkpointing))
    if key not in TRAINED:  # settings already trained, by this answer or a mistake
        TRAINED[key] = core.learner(trained, micro_batch, accumulation, *checkpointing)
    return {"eval_strategy": getattr(args.eval_strategy, "value", args.eval_strategy),
            "deprecated name": bool(warnings), **TRAINED[key]}


TRAINED = {}  # repr of the settings -> what one step with them did


def trained(micro_batch, accumulation, checkpointing, checkpointing_kwargs):
    """The examples of each forward pass in one Trainer step, and how often each
    layer's first module ran per forward pass (2: recomputed in backward)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model, rows, runs = fixtures.tiny_model(), [], collections.Counter()
    model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])),
        with_kwargs=True)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for index, layer in enumerate(layers):  # its first module runs inside its
        next(layer.children()).register_forward_pre_hook(  # checkpoint: recomputes
            lambda module, args, index=index: runs.update([index]))  # counted too
    trainer_run(micro_batch * accumulation, micro_batch, accumulation, model=model,
                activation_checkpointing=checkpointing,
                activation_checkpointing_kwargs=checkpointing_kwargs)
    return {"micro-batches": tuple(rows), "runs per micro-batch": tuple(
        runs[index] / len(rows) for index in range(len(layers)))}


def arguments(**changed):
    """A learner's make_training_args: the intended settings, ``changed``."""
    return fixtures.args_with(**{**dict(
        eval_strategy="epoch", per_device_train_batch_size=8,
        gradient_accumulation_steps=8, activation_checkpointing=True), **changed})


TRAINING_ARGUMENTS = core.Exercise(
    "2.1", measure_arguments, arguments(), name="make_training_args",
    mistakes=[
        ("each forward pass took 16 examples, but the GPU fits 8: "
         "per_device_train_batch_size=8, 8 of them accumulated.",
         arguments(per_device_train_batch_size=16, gradient_accumulation_steps=4)),
        ("a step learned from 4 micro-batches of 8, not 64 examples: "
         "gradient_accumulation_steps counts a step's micro-batches.",
         arguments(gradient_accumulation_steps=4)),
        ("a micro-batch of 64 is what does not fit: accumulate 8 micro-batches of 8.",
         arguments(per_device_train_batch_size=64, gradient_accumulation_steps=1)),
        ("no layer was recomputed in backward: activation_checkpointing=True.",
         arguments(activation_checkpointing=False)),
        ("every_n_layers=2 left one of the 2 layers out: the exercise asks for every "
         "layer.", arguments(activation_checkpointing_kwargs={
             "every_n_layers": 2, "use_reentrant": False})),
        ("gradient_checkpointing is the deprecated name: use activation_checkpointing.",
         arguments(activation_checkpointing=None, gradient_checkpointing=True)),
        ('evaluation should run every epoch: eval_strategy="epoch".',
         arguments(eval_strategy="no"))],
    error_hints=[
        ("evaluation_strategy", "Transformers renamed it eval_strategy."),
        ("Unexpected keyword", "Trainer passes activation_checkpointing_kwargs on to "
                               "torch.utils.checkpoint.checkpoint; leave it out.")],
    describe='64 examples per step, 8 at a time, every layer recomputed, eval "epoch".',
    correct=lambda got, config: (
        f"a real Trainer step learned from {sum(got['micro-batches'])} examples in "
        f"{len(got['micro-batches'])} micro-batches of {got['micro-batches'][0]}, each "
        "layer ran forward twice per micro-batch (recomputed in backward), and "
        "evaluation runs every epoch."))


@core.checker(TRAINING_ARGUMENTS)
def check_training_arguments(make_training_args):
    """``make_training_args(output_dir)``: 64 examples a step in micro-batches of 8,
    checkpointed, eval per epoch."""


# --- 2.2: predict what Trainer logs -------------------------------------------------

# 10 micro-batches of 16, accumulated 4 by 4 (steps of 4, 4, 2), then 3 by 3 (3, 3, 3,
# 1), each for a model whose accepts_loss_kwargs is True and False
SETTINGS, MICRO_BATCHES = ((4, True), (4, False), (3, True), (3, False)), 10


@functools.cache
def micro_batch_losses():
    """Each micro-batch's loss, at the weights Trainer starts from (learning rate 0)."""
    with torch.no_grad():
        model = fixtures.tiny_model()
        return [model(**batch).loss.item()
                for batch in fixtures.fixed_batches(16, MICRO_BATCHES)]


def trainer_logs(micro_batch_losses, accumulation, accepts_loss_kwargs):
    """The intended answer, measured: the losses a real Trainer logs over one epoch of
    the micro-batches at learning rate 0 (it reads no prediction)."""
    model = fixtures.tiny_model()
    model.accepts_loss_kwargs = accepts_loss_kwargs
    run = trainer_run(16 * MICRO_BATCHES, 16, accumulation, model=model,
                      steps=-(-MICRO_BATCHES // accumulation), learning_rate=0.0)
    return fixtures.logged_losses(run)


def measure_predictions(predict, setting):
    prediction = core.learner(predict, list(micro_batch_losses()), *setting)
    if isinstance(prediction, str) or not hasattr(prediction, "__iter__"):
        raise core.Wrong("predict_logged_losses should return a list of numbers, one "
                         f"per optimizer step; it returned {prediction!r:.60}.")
    return tuple(core.as_number(value, "each logged loss") for value in prediction)


def logged(losses, accumulation, summed):
    """A learner's rule: each step's sum, or its mean."""
    steps = [losses[i:i + accumulation] for i in range(0, len(losses), accumulation)]
    return [sum(step) / (1 if summed else len(step)) for step in steps]


LOGS = core.Exercise(
    "2.2", measure_predictions, trainer_logs, configs=SETTINGS,
    name="predict_logged_losses", label="gradient_accumulation_steps={} and "
    "accepts_loss_kwargs={}", describe="Trainer logs one loss per optimizer step: the "
    "sum of its micro-batches' losses (accepts_loss_kwargs=True) or their mean.",
    same=core.close(rel=1e-4),  # float32 sums in Trainer; the mistakes are far off
    mistakes=[
        ("for accepts_loss_kwargs=True Trainer divides by nothing (it trusts the model "
         "to divide): it logs the sum of each step's micro-batch losses.",
         lambda losses, accumulation, accepts: logged(losses, accumulation, False)),
        ("for accepts_loss_kwargs=False, Trainer logs the mean of each step's "
         "micro-batch losses.",
         lambda losses, accumulation, accepts: logged(losses, accumulation, True)),
        ("you swapped the two: accepts_loss_kwargs=True logs each step's sum, False "
         "its mean.", lambda losses, accumulation, accepts: logged(
             losses, accumulation, not accepts)),
        ("the last step is shorter: Trainer divides by the micro-batches it "
         "accumulated, not by gradient_accumulation_steps.",
         lambda losses, accumulation, accepts: [
             total / (1 if accepts else accumulation)
             for total in logged(losses, accumulation, True)]),
        ("Trainer logs once per optimizer step, not per micro-batch.",
         lambda losses, accumulation, accepts: losses),
        ("the micro-batches left over make one more, smaller step, logged too.",
         lambda losses, accumulation, accepts: logged(
             losses, accumulation, accepts)[:len(losses) // accumulation]),
        ("the check's second run accumulates 3: group by the argument accumulation.",
         lambda losses, accumulation, accepts: logged(losses, 4, accepts))],
    correct=f"you predicted the losses of {len(SETTINGS)} real Trainer runs: 10 "
    "micro-batches accumulated 4 by 4 make steps of 4, 4 and 2; as is, Trainer logs "
    "each step's sum, with the fix their mean, the last divided by 2.")


@core.checker(LOGS)
def check_logged_loss_prediction(predict_logged_losses):
    """``predict_logged_losses(micro_batch_losses, accumulation, accepts_loss_kwargs)``:
    the losses Trainer logs, one per optimizer step."""


# --- 2.3: find the two bugs in an accumulation loop ---------------------------------

LOOP_LEARNING_RATE = 0.5  # plain SGD: a wrong gradient scale shows in the weights
LOOP_RUNS = (2, 3)  # accumulation steps, over 2 optimizer steps of micro-batches of 8


def measure_loop(loop, accumulation):
    """Run ``loop(accelerator, model, optimizer, dataloader)`` on 2 x ``accumulation``
    prepared micro-batches of 8: the weights after, the learning rate of each real
    optimizer step, and the losses it returned (a list), else what it returned."""
    from accelerate import Accelerator

    model = fixtures.tiny_model(seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LOOP_LEARNING_RATE)
    rates = []  # one per real step: Accelerate skips the calls that only accumulate
    optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: rates.append(optimizer.param_groups[0]["lr"]))
    examples, tokenizer = fixtures.training_examples(2 * accumulation * 8)
    with fixtures.fresh_accelerate_state():
        accelerator = Accelerator(gradient_accumulation_steps=accumulation,
                                  cpu=fixtures.ON_CPU)
        accelerator.sync_gradients = True  # as in a fresh process, whatever ran before
        prepared = accelerator.prepare(model, optimizer,
                                       make_dataloader(examples, tokenizer, 8))
        returned = core.learner(loop, accelerator, *prepared)
    if inspect.isgenerator(returned):
        raise core.Wrong("fixed_loop is a generator function (it holds `yield`): "
                         "calling it runs none of its body. Hint: return a list.")
    losses = (tuple(core.as_number(loss, "each loss fixed_loop returned")
                    for loss in returned) if isinstance(returned, (list, tuple))
              else type(returned).__name__)  # None, a tensor...
    return {"weights": flat_parameters(model).cpu(), "rates": tuple(rates),
            "losses": losses}


def bigger_batches(accelerator, model, optimizer, dataloader):
    """The intended result: plain SGD, one step on the mean loss of each
    gradient_accumulation_steps micro-batches, a batch that many times bigger."""
    micro_batches, size, step_losses = list(dataloader), len(dataloader) // 2, []
    for batches in (micro_batches[:size], micro_batches[size:]):
        loss = sum(model(**batch).loss for batch in batches) / len(batches)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step_losses.append(loss.item())
    return step_losses


def accumulate_by_hand(backward, zero_grad_after="micro-batch"):
    """Exercise 2.3's loop, with the given backward and zero_grad placement (as given:
    loss.backward(), and zero_grad after every micro-batch)."""
    def loop(accelerator, model, optimizer, dataloader):
        step_losses, losses = [], []
        for step, batch in enumerate(dataloader):
            loss = model(**batch).loss
            backward(accelerator, loss)
            losses.append(loss.item())
            if (step + 1) % accelerator.gradient_accumulation_steps == 0:
                optimizer.step()
                step_losses.append(sum(losses) / len(losses))
                losses = []
                if zero_grad_after == "step":
                    optimizer.zero_grad()
            if zero_grad_after == "micro-batch":
                optimizer.zero_grad()
        return step_losses
    return loop


def smaller_learning_rate(accelerator, model, optimizer, dataloader):
    for group in optimizer.param_groups:
        group["lr"] /= accelerator.gradient_accumulation_steps
    return accumulate_by_hand(lambda accelerator, loss: loss.backward(), "step")(
        accelerator, model, optimizer, dataloader)


PLAIN, DIVIDED = (lambda accelerator, loss: loss.backward(),
                  lambda accelerator, loss: accelerator.backward(loss))
LOOP = core.Exercise(
    "2.3", measure_loop, bigger_batches, configs=LOOP_RUNS, name="fixed_loop",
    label="gradient_accumulation_steps={}",
    mistakes=[
        ("these are the loop as given: zero_grad() after each micro-batch erased the "
         "one before, and loss.backward() does not divide by the accumulation steps.",
         accumulate_by_hand(PLAIN)),
        ("zero_grad() after every micro-batch erased the one before. Hint: reset the "
         "gradients only after an optimizer step.", accumulate_by_hand(DIVIDED)),
        ("the gradients were added, not averaged. Hint: accelerator.backward(loss) "
         "divides by the accumulation steps; loss.backward() does not.",
         accumulate_by_hand(PLAIN, "step")),
        ("each gradient was divided twice: accelerator.backward(loss) already divides "
         "the loss by the accumulation steps.", accumulate_by_hand(
             lambda accelerator, loss: accelerator.backward(
                 loss / accelerator.gradient_accumulation_steps), "step")),
        ("the gradients were never reset. Hint: optimizer.zero_grad() after each "
         "optimizer step.", accumulate_by_hand(DIVIDED, "never")),
        ("you lowered the learning rate: that moves plain SGD as averaging does, but "
         "not AdamW. Hint: leave it; average the gradients.", smaller_learning_rate),
        ("the weights are right, but fixed_loop returned None: return step_losses, "
         "each optimizer step's mean loss.", fixtures.accelerate_loop)],
    describe="each step must use the mean gradient of its micro-batches, and return "
    "each step's mean loss.",
    same=core.close(rel=1e-4, abs_=WEIGHTS_TOLERANCE),  # mistakes move weights 5e-2+
    correct="4 micro-batches of 8 gave the weights of 2 plain SGD steps on batches of "
    "16, and each step's mean loss; the same with 3 micro-batches per step.")


@core.checker(LOOP)
def check_fixed_accumulation_loop(fixed_loop):
    """``fixed_loop(accelerator, model, optimizer, dataloader)``: exercise 2.3's loop,
    its bugs fixed."""


check_fixed_loop = check_fixed_accumulation_loop  # the name practice 2 calls


def compare_with_bigger_batches(loop):
    """Print what ``loop`` did beside 2 plain SGD steps on batches of 16."""
    with core.one_thread(), global_random_state_kept():
        mine, bigger = (measure_loop(answer, 2) for answer in (loop, bigger_batches))
    losses = mine["losses"]
    print(f"optimizer steps: {len(mine['rates'])} (2 plain steps on batches of 16: 2)\n"
          "weights equal to those of 2 plain SGD steps on batches of 16: "
          f"{LOOP.same(mine['weights'], bigger['weights'])}\nlosses returned: "
          f"{len(losses) if isinstance(losses, tuple) else losses}")


# --- 2.4: uneven micro-batches, every example alike ---------------------------------

# one Trainer step over 40 examples in micro-batches of 16, 16 and 8, accumulated 3 at
# a time; then one over 24 (16 and 8, 2 at a time): 40 written in fails there
UNEVEN_STEPS = ((40, 3), (24, 2))  # (examples, gradient_accumulation_steps)
SGD = dict(learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
           max_grad_norm=0.0)  # no clipping, which would hide a wrong scale


def measure_loss_function(step_mean_loss, config):
    """The weights after one Trainer step with ``step_mean_loss``, and the loss it
    logged."""
    examples, accumulation = config
    trainer = core.learner(trainer_run, examples, 16, accumulation, **SGD,
                           compute_loss_func=step_mean_loss)
    return {"weights": flat_parameters(trainer.model).cpu(),
            "logged": fixtures.logged_losses(trainer)[0]}


@functools.cache
def one_big_step(examples):
    """The weights after one plain SGD step on all ``examples`` at once (lesson 2's
    claim, measured)."""
    model = fixtures.tiny_model()
    model(**fixtures.fixed_batches(examples, 1)[0]).loss.backward()
    torch.optim.SGD(model.parameters(), lr=SGD["learning_rate"]).step()
    return flat_parameters(model).cpu()


def uneven_correct(got, config):
    if not UNEVEN.same(got["weights"], one_big_step(config[0])):  # lesson 2's claim
        raise RuntimeError("the intended loss no longer gives one big step's weights")
    return ("a Trainer step over micro-batches of 16, 16 and 8 gave the weights of one "
            "SGD step on all 40 examples at once (16 and 8: on all 24), and logged "
            "their mean loss: every example weighed alike.")


def summed(outputs, labels, divisor):  # the mistakes' code, as a learner writes it
    return F.cross_entropy(outputs.logits, labels, reduction="sum") / divisor


def mean(outputs, labels):
    return F.cross_entropy(outputs.logits, labels)


UNEVEN = core.Exercise(
    "2.4", measure_loss_function,
    lambda outputs, labels, num_items_in_batch: summed(outputs, labels,
                                                       num_items_in_batch),
    configs=UNEVEN_STEPS, name="step_mean_loss",
    mistakes=[
        ("each micro-batch's own mean: with a compute_loss_func Trainer does not "
         "divide by the accumulation steps, so the step went about 3 times too far.",
         lambda outputs, labels, num_items_in_batch: mean(outputs, labels)),
        ("the mean of the 3 micro-batch means weighs the 8 examples of the last one "
         "twice. Sum the losses and divide by num_items_in_batch.",
         lambda outputs, labels, num_items_in_batch: mean(outputs, labels) / 3),
        ("the sum of the losses, 40 times the mean: divide it by num_items_in_batch.",
         lambda outputs, labels, num_items_in_batch: summed(outputs, labels, 1)),
        ("48 = 16 x 3, but the step has 40 examples: divide by num_items_in_batch.",
         lambda outputs, labels, num_items_in_batch: summed(outputs, labels, 48)),
        ("the mean is already divided by its examples: divide the sum by "
         "num_items_in_batch instead.", lambda outputs, labels, num_items_in_batch:
         mean(outputs, labels) / num_items_in_batch),
        ("40 is the first step's count; the check's second step has 24: divide by "
         "num_items_in_batch.",
         lambda outputs, labels, num_items_in_batch: summed(outputs, labels, 40))],
    error_hints=[
        ("*=: 'NoneType'", "step_mean_loss returned None: did you forget `return`?"),
        ("NoneType' and", "Trainer takes the labels out of the batch, so outputs.loss "
                          "is None: use outputs.logits and labels."),
        ("num_items_in_batch", "Trainer calls compute_loss_func(outputs, labels, "
                               "num_items_in_batch=...)."),
        ("has no attribute 'backward'", "return the loss as a tensor, not a number."),
        ("only for scalar", "return one number per micro-batch."),
        ("does not require grad", "return a tensor computed from outputs.logits (no "
                                  ".item(), no .detach()).")],
    same=core.close(rel=1e-4, abs_=WEIGHTS_TOLERANCE),  # mistakes move weights 4e-3+
    correct=uneven_correct, label="{} examples accumulated {} at a time",
    describe="each micro-batch's share is the sum of its examples' losses divided by "
    "num_items_in_batch.")


@core.checker(UNEVEN)
def check_step_mean_loss(step_mean_loss):
    """``step_mean_loss(outputs, labels, num_items_in_batch)``: Trainer's
    compute_loss_func for uneven micro-batches."""
