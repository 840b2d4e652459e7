"""Practice 2's checks (lesson 02): each runs the answer for real and measures it."""
import ast
import functools

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from helpers.data import make_dataloader
from helpers.models import flat_parameters
from helpers.practice import core, fixtures
from helpers.random_state import global_random_state_kept

# float32 rounding in a step or two; the mistakes move the weights by 4e-3 or more
SAME_WEIGHTS = core.close(rel=1e-4, abs_=1e-5 if fixtures.ON_CPU else 1e-4)
SGD = dict(learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
           max_grad_norm=0.0)  # plain SGD, unclipped: a wrong scale shows in weights


def measure_arguments(make_training_args, config):
    """Examples per forward, layer runs, eval strategy, old name: in a Trainer step."""
    with core.explaining_warnings("`gradient_checkpointing` is deprecated") as old:
        args = fixtures.learners_arguments(make_training_args)
        micro_batch = args.per_device_train_batch_size
        accumulation = args.gradient_accumulation_steps
        if micro_batch * accumulation > 512:  # too many to train here, and wrong anyway
            raise core.Wrong(f"one optimizer step would learn from {micro_batch} x "
                             f"{accumulation} examples, not 64.")
        model, rows, runs = fixtures.tiny_model(), [], []
        model.register_forward_pre_hook(
            lambda module, inputs, kwargs: rows.append(len(kwargs["input_ids"])),
            with_kwargs=True)
        layers = model.distilbert.transformer.layer  # each a GradientCheckpointingLayer
        for layer in layers:  # its first module runs inside the checkpoint: recomputed
            next(layer.children()).register_forward_pre_hook(lambda *_: runs.append(1))
        core.learner(fixtures.trainer_run, micro_batch * accumulation, micro_batch,
                     accumulation, make_args=make_training_args, model=model)
    return {"eval_strategy": getattr(args.eval_strategy, "value", args.eval_strategy),
            "deprecated name": bool(old), "micro-batches": tuple(rows),
            "runs per micro-batch": len(runs) / len(rows) / len(layers)}


def arguments(**changed):
    """A learner's make_training_args: the intended settings, ``changed``."""
    return fixtures.args_with(**{**dict(
        eval_strategy="epoch", per_device_train_batch_size=8,
        gradient_accumulation_steps=8, activation_checkpointing=True), **changed})


TRAINING_ARGUMENTS = core.Exercise(
    "2.1", measure_arguments, arguments(), name="make_training_args", mistakes=[
        ("each forward pass took 16 examples at once (the lesson's settings), but the "
         "GPU fits only 8: per_device_train_batch_size=8, 8 of them accumulated.",
         arguments(per_device_train_batch_size=16, gradient_accumulation_steps=4)),
        ("a step learned from 4 micro-batches of 8, not 64 examples: "
         "gradient_accumulation_steps counts a step's micro-batches.",
         arguments(gradient_accumulation_steps=4)),
        ("no layer was recomputed in backward: activation_checkpointing=True.",
         arguments(activation_checkpointing=False)),
        ("gradient_checkpointing is the deprecated name: use activation_checkpointing.",
         arguments(activation_checkpointing=None, gradient_checkpointing=True))],
    error_hints=[("evaluation_strategy", "Transformers renamed it eval_strategy.")],
    describe='64 examples per step, 8 at a time, every layer recomputed, eval "epoch".',
    correct=lambda got, config: "a real Trainer step learned from {} examples in {} "
    "micro-batches of {}, each layer ran forward twice per micro-batch (recomputed in "
    "backward), and evaluation runs every epoch.".format(
        sum(got["micro-batches"]), len(got["micro-batches"]), got["micro-batches"][0]))


@core.checker(TRAINING_ARGUMENTS)
def check_training_arguments(make_training_args):
    """``make_training_args(output_dir)``: exercise 2.1's TrainingArguments."""


def trainer_logs(micro_batch_losses, accumulation, accepts_loss_kwargs):
    """The intended answer, measured: what a real Trainer logs at learning rate 0."""
    model = fixtures.tiny_model()
    model.accepts_loss_kwargs = accepts_loss_kwargs
    return fixtures.logged_losses(fixtures.trainer_run(
        160, 16, accumulation, model=model, steps=-(-10 // accumulation),
        learning_rate=0.0))


def measure_predictions(predict, setting):
    prediction = core.learner(predict, list(micro_batch_losses()), *setting)
    if isinstance(prediction, str) or not hasattr(prediction, "__iter__"):
        raise core.Wrong("predict_logged_losses should return a list of numbers, one "
                         f"per optimizer step; it returned {prediction!r:.60}.")
    return tuple(core.as_number(value, "each logged loss") for value in prediction)


def logged(losses, accumulation, summed):  # a learner's rule: each step's sum or mean
    steps = [losses[i:i + accumulation] for i in range(0, len(losses), accumulation)]
    return [sum(step) / (1 if summed else len(step)) for step in steps]


# the loss of each of the 10 micro-batches, as Trainer logs it with no accumulation
micro_batch_losses = functools.cache(lambda: trainer_logs(None, 1, False))
LOGS = core.Exercise(  # accumulated 4 by 4 (steps of 4, 4, 2), then 3 by 3 (3, 3, 3, 1)
    "2.2", measure_predictions, trainer_logs, name="predict_logged_losses",
    configs=((4, True), (4, False), (3, True), (3, False)),
    label="gradient_accumulation_steps={} and accepts_loss_kwargs={}", mistakes=[
        ("for accepts_loss_kwargs=True Trainer divides by nothing (it trusts the model "
         "to divide): it logs the sum of each step's micro-batch losses.",
         lambda losses, accumulation, accepts: logged(losses, accumulation, False)),
        ("for accepts_loss_kwargs=False, Trainer logs the mean of each step's "
         "micro-batch losses.",
         lambda losses, accumulation, accepts: logged(losses, accumulation, True)),
        ("the last step is shorter: Trainer divides by the micro-batches it "
         "accumulated, not by gradient_accumulation_steps.",
         lambda losses, accumulation, accepts: [
             total / (1 if accepts else accumulation)
             for total in logged(losses, accumulation, True)]),
        ("the micro-batches left over make one more, smaller step, logged too.",
         lambda losses, accumulation, accepts: logged(
             losses, accumulation, accepts)[:len(losses) // accumulation])],
    describe="Trainer logs one loss per optimizer step: the sum of its micro-batches' "
    "losses (accepts_loss_kwargs=True) or their mean.",
    same=core.close(rel=1e-4),  # float32 sums in Trainer; the mistakes are far off
    correct="you predicted the losses of 4 real Trainer runs: 10 micro-batches "
    "accumulated 4 by 4 make steps of 4, 4 and 2; as is, Trainer logs each step's "
    "sum, with the fix their mean, the last divided by 2.")


@core.checker(LOGS)
def check_logged_loss_prediction(predict_logged_losses):
    """predict_logged_losses(micro_batch_losses, accumulation, accepts_loss_kwargs)"""


def measure_loop(loop, accumulation):
    """What ``loop`` did on 2 x ``accumulation`` micro-batches of 8."""
    model = fixtures.tiny_model(seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD["learning_rate"])
    rates = []  # one per real step: Accelerate skips the calls that only accumulate
    optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: rates.append(optimizer.param_groups[0]["lr"]))
    examples, tokenizer = fixtures.training_examples(2 * accumulation * 8)
    with fixtures.fresh_accelerate_state():
        accelerator = Accelerator(gradient_accumulation_steps=accumulation,
                                  cpu=fixtures.ON_CPU)
        accelerator.sync_gradients = True  # as in a fresh process, whatever ran before
        returned = core.learner(loop, accelerator, *accelerator.prepare(
            model, optimizer, make_dataloader(examples, tokenizer, 8)))
    return {"weights": flat_parameters(model).cpu(), "rates": tuple(rates),
            "losses": tuple(core.as_number(loss, "each loss fixed_loop returned")
                            for loss in returned) if isinstance(returned, (list, tuple))
            else type(returned).__name__}  # None, a tensor...


def bigger_batches(accelerator, model, optimizer, dataloader):
    """The intended result: each step a plain SGD step on all its micro-batches."""
    micro_batches, size, step_losses = list(dataloader), len(dataloader) // 2, []
    for batches in (micro_batches[:size], micro_batches[size:]):
        loss = sum(model(**batch).loss for batch in batches) / len(batches)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step_losses.append(loss.item())
    return step_losses


def accumulate_by_hand(accelerator, model, optimizer, dataloader):
    """Exercise 2.3's loop, as given: zero_grad after each micro-batch, no division."""
    step_losses, losses = [], []
    for step, batch in enumerate(dataloader):
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.item())
        if (step + 1) % accelerator.gradient_accumulation_steps == 0:
            optimizer.step()
            step_losses.append(sum(losses) / len(losses))
            losses = []
        optimizer.zero_grad()
    return step_losses


BACKWARD, ZERO = "loss.backward()", "optimizer.zero_grad()"
DIVIDED, AFTER_A_STEP = ((BACKWARD, "accelerator.backward(loss)"),  # its two fixes
                         (ZERO, f"if not losses:\n    {ZERO}"))
miss = functools.partial(core.edited, accumulate_by_hand)  # a near miss of 2.3's loop
LOOP = core.Exercise(
    "2.3", measure_loop, bigger_batches, configs=(2, 3), name="fixed_loop",
    label="gradient_accumulation_steps={}", mistakes=[
        ("these are the loop as given: zero_grad() after each micro-batch erased the "
         "one before, and loss.backward() does not divide by the accumulation steps.",
         accumulate_by_hand),
        ("zero_grad() after every micro-batch erased the one before. Hint: reset the "
         "gradients only after an optimizer step.", miss(DIVIDED)),
        ("the gradients were added, not averaged. Hint: accelerator.backward(loss) "
         "divides by the accumulation steps; loss.backward() does not.",
         miss(AFTER_A_STEP)),
        ("each gradient was divided twice: accelerator.backward(loss) already divides "
         "the loss by the accumulation steps.", miss(AFTER_A_STEP, (
             BACKWARD,
             "accelerator.backward(loss / accelerator.gradient_accumulation_steps)")))],
    describe="each step must use the mean gradient of its micro-batches, and return "
    "each step's mean loss.", same=SAME_WEIGHTS,
    correct="4 micro-batches of 8 gave the weights of 2 plain SGD steps on batches of "
    "16, and each step's mean loss; the same with 3 micro-batches per step.")


@core.checker(LOOP)
def check_fixed_accumulation_loop(fixed_loop):
    """``fixed_loop(accelerator, model, optimizer, dataloader)``"""


check_fixed_loop = check_fixed_accumulation_loop  # the name practice 2 calls


def compare_with_bigger_batches(loop):
    """Print what ``loop`` did beside 2 plain SGD steps on batches of 16."""
    with core.one_thread(), global_random_state_kept():
        mine, bigger = measure_loop(loop, 2), core.cached_outcome(LOOP, "intended", 0)
    losses = mine["losses"]
    print(f"optimizer steps: {len(mine['rates'])} (2 plain steps on batches of 16: 2)\n"
          "weights equal to those of 2 plain SGD steps on batches of 16: "
          f"{LOOP.same(mine['weights'], bigger['weights'])}\nlosses returned: "
          f"{len(losses) if isinstance(losses, tuple) else losses}")


def none_said(step_mean_loss):
    """``step_mean_loss``, whose None says which None: outputs.loss, or no return."""
    def loss(outputs, labels, num_items_in_batch):
        value = step_mean_loss(outputs, labels, num_items_in_batch)
        if torch.is_tensor(value):
            return value
        tree = core.source_tree(step_mean_loss) or ast.Module(body=[])
        if value is None and tree.body and not any(isinstance(n, ast.Lambda) or (
                isinstance(n, ast.Return) and n.value) for n in ast.walk(tree)):
            raise core.Wrong("step_mean_loss returned None: it has no `return` of a "
                             "value. Hint: return the loss.")
        said = "None" if value is None else f"a {type(value).__name__}, not a tensor"
        raise core.Wrong(f"step_mean_loss returned {said}" + (  # Trainer backward()s it
            ", which is outputs.loss: Trainer takes the labels out of the batch "
            "before the forward. Hint: compute the loss from outputs.logits and labels."
            if value is None and outputs.loss is None else ". Hint: return the loss, a "
            "tensor."))
    return loss


def measure_loss_function(step_mean_loss, config):
    """The weights after a Trainer step with ``step_mean_loss``, the loss logged."""
    trainer = core.learner(fixtures.trainer_run, config[0], 16, config[1], **SGD,
                           compute_loss_func=none_said(step_mean_loss))
    return {"weights": flat_parameters(trainer.model).cpu(),
            "logged": fixtures.logged_losses(trainer)[0]}


def summed(outputs, labels, num_items_in_batch):  # the intended answer
    return F.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch


UNEVEN = core.Exercise(  # 40 examples in micro-batches of 16, 16 and 8; then 16 and 8
    "2.4", measure_loss_function, summed, configs=((40, 3), (24, 2)),
    name="step_mean_loss", label="{} examples accumulated {} at a time", mistakes=[
        ("each micro-batch's own mean: with a compute_loss_func Trainer does not "
         "divide by the accumulation steps, so the step went about 3 times too far.",
         lambda outputs, labels, _: summed(outputs, labels, len(labels))),
        ("the mean of the 3 micro-batch means weighs the 8 examples of the last one "
         "twice. Sum the losses and divide by num_items_in_batch.",
         lambda outputs, labels, _: summed(outputs, labels, 3 * len(labels))),
        ("the sum of the losses, 40 times the mean: divide it by num_items_in_batch.",
         lambda outputs, labels, _: summed(outputs, labels, 1)),
        ("40 is the first step's count; the check's second step has 24: divide by "
         "num_items_in_batch.",
         lambda outputs, labels, _: summed(outputs, labels, 40))],
    error_hints=[
        ("NoneType' and", "Trainer takes the labels out of the batch, so outputs.loss "
                          "is None: use outputs.logits and labels.")],
    describe="each micro-batch's share is the sum of its examples' losses divided by "
    "num_items_in_batch.", same=SAME_WEIGHTS,
    correct="a Trainer step over micro-batches of 16, 16 and 8 gave the weights of one "
    "SGD step on all 40 examples at once (16 and 8: on all 24), and logged their mean "
    "loss: every example weighed alike.")  # tests/test_practice_02.py checks this


@core.checker(UNEVEN)
def check_step_mean_loss(step_mean_loss):
    """``step_mean_loss(outputs, labels, num_items_in_batch)``"""
