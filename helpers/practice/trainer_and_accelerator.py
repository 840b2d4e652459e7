"""Checks for notebooks/practice/02_trainer_and_accelerator_practice.ipynb (lesson 02).

Each check runs the learner's answer for real (a Trainer step, an Accelerate loop) on the tiny DistilBERT,
and compares what it did with what the intended answer does: the examples each optimizer step learned from,
the layers recomputed in backward, the losses Trainer logged, the weights after the steps. A near miss gets
a hint that names what it actually did, found by running (or probing) the typical mistakes the same way.
"""
import collections
import functools
import math
import tempfile

import torch

from helpers.models import flat_parameters
from helpers.practice.verdicts import (Wrong, call_learner, checker, explaining_warnings, require_callable,
                                      whole_number)
from helpers.training import MICRO_BATCH_SIZE, TRAINER_ACCUMULATION, first_logged_losses, global_random_state_kept

# The checks' Trainer and Accelerator use the GPU when there is one, as the lessons do: a Trainer with
# use_cpu=True after the learner's own GPU Accelerator would be refused by Accelerate.
ON_CPU = not torch.cuda.is_available()
TOLERANCE = 1e-5 if ON_CPU else 1e-4  # weights compared on the CPU, after training on either device
LOSS_RTOL = 1e-4  # a logged loss against its prediction: float32 sums in Trainer, float64 in the learner's code


@functools.lru_cache(maxsize=1)
def tokenized_and_tokenizer():
    """(the tokenized data set, its tokenizer), loaded once for all the checks."""
    from helpers.data import load_tokenized

    return load_tokenized()


def course_tokenizer():
    """The course's tokenizer (loaded once)."""
    return tokenized_and_tokenizer()[1]


def training_examples(n):
    """The first ``n`` examples of the tokenized training split."""
    return tokenized_and_tokenizer()[0]["train"].select(range(n))


def trainer_step_run(model, examples, micro_batch_size, accumulation, compute_loss_func=None, **arguments):
    """Train ``model`` with Trainer for one optimizer step over ``examples``, taken in order; return the Trainer.

    Trainer seeds the global generators: the learner's random numbers are put back afterwards.
    """
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=1, logging_steps=1,
                             per_device_train_batch_size=micro_batch_size, gradient_accumulation_steps=accumulation,
                             train_sampling_strategy="sequential", save_strategy="no", report_to="none",
                             disable_tqdm=True, use_cpu=ON_CPU, **arguments)
    with global_random_state_kept():
        trainer = Trainer(model=model, args=args, train_dataset=examples, compute_loss_func=compute_loss_func,
                          data_collator=DataCollatorWithPadding(course_tokenizer()))
        trainer.remove_callback(PrinterCallback)  # without a progress bar, Trainer would print every log
        trainer.train()
    return trainer


# --- 2.1 -----------------------------------------------------------------------------------------------------

SMALL_GPU_MICRO_BATCH = 8  # 2.1: the examples that fit in one forward + backward on the exercise's GPU
EFFECTIVE_BATCH = MICRO_BATCH_SIZE * TRAINER_ACCUMULATION  # 64: the slide's examples per optimizer step
LARGEST_STEP_RUN = 512  # 2.1 trains one step of the learner's settings only up to this many examples

ARGUMENT_HINTS = [
    ("evaluation_strategy", "Transformers renamed evaluation_strategy to eval_strategy."),
    ("no_cuda", "Transformers renamed no_cuda to use_cpu."),
    ("tokenizer", "TrainingArguments takes no tokenizer; Trainer takes it as processing_class."),
    ("unexpected keyword", "check the argument's name in TrainingArguments' documentation (help(TrainingArguments))."),
]
TODAYS_NAMES = {"gradient_checkpointing": "activation_checkpointing",  # deprecated name -> today's (Transformers 5)
                "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}


def value_of(setting):
    """A TrainingArguments setting as plain text or number."""
    return getattr(setting, "value", setting)  # enums such as IntervalStrategy.EPOCH -> "epoch"


def measure_one_step(args):
    """Train one optimizer step with the batch and checkpointing settings of ``args``; count what happened.

    Returns (examples in each forward pass, forward passes of each layer's first module per micro-batch).
    A layer that is checkpointed runs its forward again in backward: 2 per micro-batch instead of 1.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    model.accepts_loss_kwargs = False
    rows = []  # examples of every training forward pass of the model
    model.register_forward_pre_hook(lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])),
                                    with_kwargs=True)
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    layer_runs = collections.Counter()  # layer index -> forward passes of its first module
    for index, layer in enumerate(layers):
        # the layer's own hooks stay outside its checkpoint; its first module's run inside, recompute included
        next(layer.children()).register_forward_pre_hook(
            lambda module, args, index=index: layer_runs.update([index]))
    micro_batch_size, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    trainer_step_run(model, training_examples(micro_batch_size * accumulation), micro_batch_size, accumulation,
                     activation_checkpointing=args.activation_checkpointing,
                     activation_checkpointing_kwargs=args.activation_checkpointing_kwargs)
    return rows, [layer_runs[index] / max(len(rows), 1) for index in range(len(layers))]


@checker("2.1")
def check_training_arguments(make_training_args):
    """``make_training_args(output_dir)``: 64 examples a step in micro-batches of 8, checkpointed, eval per epoch."""
    from transformers import TrainingArguments

    require_callable(make_training_args, "make_training_args")
    with explaining_warnings(*(f"`{old}` is deprecated" for old in TODAYS_NAMES)) as deprecation_warnings:
        args = call_learner(make_training_args, tempfile.mkdtemp(), name="make_training_args", hints=ARGUMENT_HINTS)
    if not isinstance(args, TrainingArguments):
        raise Wrong(f"make_training_args should return TrainingArguments(...), but returned {type(args).__name__}.")
    problems = []
    if value_of(args.eval_strategy) != "epoch":
        problems.append(f'eval_strategy is "{value_of(args.eval_strategy)}": evaluation should run every epoch '
                        '(eval_strategy="epoch")')
    micro_batch_size = whole_number(args.per_device_train_batch_size, "per_device_train_batch_size")
    accumulation = whole_number(args.gradient_accumulation_steps, "gradient_accumulation_steps")
    if micro_batch_size * accumulation > LARGEST_STEP_RUN:  # too many to train here, and wrong anyway
        problems.append(f"one optimizer step would learn from {micro_batch_size} x {accumulation} = "
                        f"{micro_batch_size * accumulation} examples, not {EFFECTIVE_BATCH}")
        raise Wrong("; ".join(problems) + ".")
    rows, forwards_per_micro_batch = measure_one_step(args)
    if any(n != SMALL_GPU_MICRO_BATCH for n in rows):
        problem = (f"each forward pass took {rows[0]} examples at once, but the GPU fits only "
                   f"{SMALL_GPU_MICRO_BATCH} (per_device_train_batch_size)")
        if len(rows) == 1 and rows[0] == EFFECTIVE_BATCH:
            problem += (f"; one micro-batch of {EFFECTIVE_BATCH} is exactly what does not fit: accumulate smaller "
                        "ones instead")
        problems.append(problem)
    if sum(rows) != EFFECTIVE_BATCH:
        problems.append(f"one optimizer step learned from {sum(rows)} examples ({len(rows)} micro-batches of "
                        f"{rows[0]}, counted in a real Trainer step), not {EFFECTIVE_BATCH} "
                        "(gradient_accumulation_steps sets how many micro-batches one step accumulates)")
    recomputed = sum(1 for n in forwards_per_micro_batch if n == 2)
    layers = len(forwards_per_micro_batch)
    if recomputed == 0:
        problems.append("no layer was recomputed in backward: activation checkpointing is off "
                        "(activation_checkpointing=True)")
    elif recomputed < layers:
        problems.append(f"only {recomputed} of the model's {layers} layers "
                        f"{'was' if recomputed == 1 else 'were'} recomputed in backward: "
                        "activation_checkpointing_kwargs's every_n_layers leaves the others out, "
                        "and the exercise asks for every layer (leave every_n_layers out)")
    for old, new in TODAYS_NAMES.items():
        if any(f"`{old}` is deprecated" in str(warning.message) for warning in deprecation_warnings):
            problems.append(f"{old} is the deprecated name (it warns, and Transformers v6 removes it): the exercise "
                            f"asks for today's name, {new}")
    if problems:
        raise Wrong("; ".join(problems) + ".")
    return (f"one optimizer step learned from {EFFECTIVE_BATCH} examples in {len(rows)} micro-batches of "
            f"{SMALL_GPU_MICRO_BATCH} (counted in a real Trainer step), each of the {layers} layers ran its "
            "forward pass twice per micro-batch (checkpointed: recomputed in backward), and evaluation runs "
            f"every epoch: the slide's {EFFECTIVE_BATCH} examples per step, {SMALL_GPU_MICRO_BATCH} at a time.")


# --- 2.2 -----------------------------------------------------------------------------------------------------

PREDICTION_MICRO_BATCHES = 10  # 2.2: one epoch of 10 micro-batches of 16 ...
PREDICTION_ACCUMULATION = 4  # ... accumulated 4 by 4: optimizer steps of 4, 4 and 2 micro-batches


def micro_batch_losses_and_logs():
    """(each micro-batch's loss, Trainer's logged losses for accepts_loss_kwargs True and False), at learning rate 0.

    At learning rate 0 the weights never change, so each micro-batch's loss is known before Trainer runs.
    """
    from helpers.data import make_dataloader
    from helpers.models import build_model

    examples = training_examples(PREDICTION_MICRO_BATCHES * MICRO_BATCH_SIZE)
    with torch.no_grad():
        model = build_model("tiny", seed=0)
        micro_batches = make_dataloader(examples, course_tokenizer(), MICRO_BATCH_SIZE)
        losses = [model(**batch).loss.item() for batch in micro_batches]
    logged = {}
    for accepts_loss_kwargs in (True, False):
        model = build_model("tiny", seed=0)
        model.accepts_loss_kwargs = accepts_loss_kwargs
        steps = math.ceil(PREDICTION_MICRO_BATCHES / PREDICTION_ACCUMULATION)  # one epoch
        logged[accepts_loss_kwargs] = first_logged_losses(
            model, examples, course_tokenizer(), steps=steps, micro_batch_size=MICRO_BATCH_SIZE,
            accumulation=PREDICTION_ACCUMULATION, learning_rate=0.0, train_sampling_strategy="sequential",
            use_cpu=ON_CPU)
    return losses, logged


def step_groups(losses, accumulation):
    """The micro-batch losses of each optimizer step: ``accumulation`` at a time, the last group shorter."""
    return [losses[i:i + accumulation] for i in range(0, len(losses), accumulation)]


def numbers(prediction, name):
    """The prediction as a list of floats, or Wrong saying what it should be."""
    try:
        return [float(value) for value in prediction]
    except (TypeError, ValueError):
        raise Wrong(f"{name} should return a list of numbers, one per optimizer step, but returned "
                    f"{type(prediction).__name__} {prediction!r:.80}.") from None


def same_numbers(first, second):
    return len(first) == len(second) and all(math.isclose(a, b, rel_tol=LOSS_RTOL) for a, b in zip(first, second))


def prediction_mistake(predicted, losses, accepts_loss_kwargs):
    """The hint for a wrong prediction: which typical mistake it matches."""
    groups = step_groups(losses, PREDICTION_ACCUMULATION)
    steps, left_over = len(groups), len(groups[-1])
    model = f"a model whose accepts_loss_kwargs is {accepts_loss_kwargs}"
    if len(predicted) == len(losses):
        return ("that is one number per micro-batch, but Trainer logs once per optimizer step (logging_steps=1), "
                f"and {len(losses)} micro-batches accumulated {PREDICTION_ACCUMULATION} by {PREDICTION_ACCUMULATION} "
                f"make {steps} steps.")
    if len(predicted) == len(losses) // PREDICTION_ACCUMULATION:
        return (f"the {left_over} micro-batches left over at the end of the epoch make one more, smaller optimizer "
                f"step, and Trainer logs it too: {steps} numbers.")
    if len(predicted) != steps:
        return f"Trainer logs one number per optimizer step: {steps} of them here."
    sums = [sum(group) for group in groups]
    means = [sum(group) / len(group) for group in groups]
    if accepts_loss_kwargs:
        if same_numbers(predicted, means):
            return (f"for {model}, Trainer believes the model already divides its loss by num_items_in_batch, so "
                    "it divides by nothing and logs the sum of each step's micro-batch losses. DistilBERT's loss "
                    "ignores num_items_in_batch: this is the sum lesson 2 found.")
        if same_numbers(predicted, [mean * PREDICTION_ACCUMULATION for mean in means]):
            return (f"the last optimizer step had only {left_over} micro-batches: Trainer adds their {left_over} "
                    f"losses, which is {left_over} times their mean, not {PREDICTION_ACCUMULATION} times.")
        return f"for {model}, Trainer adds up the losses of each step's micro-batches, without dividing."
    if same_numbers(predicted, sums):
        return (f"for {model} (lesson 2's fix), Trainer divides each micro-batch's loss by the number of "
                "micro-batches in the step before adding them up: it logs their mean.")
    if same_numbers(predicted, [total / PREDICTION_ACCUMULATION for total in sums]):
        return (f"the last optimizer step had only {left_over} micro-batches, and Trainer divided their losses by "
                f"{left_over}, the micro-batches it actually accumulated, not by gradient_accumulation_steps="
                f"{PREDICTION_ACCUMULATION}: it logs their mean.")
    return f"for {model}, Trainer logs the mean loss of each step's micro-batches."


@checker("2.2")
def check_logged_loss_prediction(predict_logged_losses):
    """``predict_logged_losses(micro_batch_losses, accumulation, accepts_loss_kwargs)``: what Trainer logs per step."""
    require_callable(predict_logged_losses, "predict_logged_losses")
    losses, logged = micro_batch_losses_and_logs()
    for accepts_loss_kwargs in (True, False):
        predicted = numbers(call_learner(predict_logged_losses, list(losses), PREDICTION_ACCUMULATION,
                                         accepts_loss_kwargs, name="predict_logged_losses"), "predict_logged_losses")
        if not same_numbers(predicted, logged[accepts_loss_kwargs]):
            shown = ", ".join(f"{value:.4f}" for value in logged[accepts_loss_kwargs])
            raise Wrong(f"with accepts_loss_kwargs={accepts_loss_kwargs}, Trainer logged [{shown}], and you "
                        f"predicted [{', '.join(f'{value:.4f}' for value in predicted)}]. Hint: "
                        + prediction_mistake(predicted, losses, accepts_loss_kwargs))
    sizes = [len(group) for group in step_groups(losses, PREDICTION_ACCUMULATION)]
    return (f"you predicted all {2 * len(sizes)} logged losses (checked against 2 real Trainer runs): "
            f"{len(losses)} micro-batches make {len(sizes)} optimizer steps of {', '.join(map(str, sizes))} "
            "micro-batches; as is, Trainer logs each step's sum, and with the fix their mean, the last step "
            f"divided by {sizes[-1]}.")


# --- 2.3 -----------------------------------------------------------------------------------------------------

LOOP_ACCUMULATION = 2  # 2.3: Accelerator(gradient_accumulation_steps=2) ...
LOOP_MICRO_BATCH = 8  # ... over 4 micro-batches of 8: 2 optimizer steps of 16 examples
LOOP_LEARNING_RATE = 0.5  # plain SGD: a step's size is learning rate x gradient, so a wrong scale shows


def loop_data():
    """32 training examples as 4 micro-batches of 8, and the same examples as 2 batches of 16."""
    from helpers.data import make_dataloader

    examples = training_examples(4 * LOOP_MICRO_BATCH)
    return (make_dataloader(examples, course_tokenizer(), batch_size=LOOP_MICRO_BATCH),
            make_dataloader(examples, course_tokenizer(), batch_size=LOOP_MICRO_BATCH * LOOP_ACCUMULATION))


def loop_run(loop):
    """Run ``loop(accelerator, model, optimizer, dataloader)`` on 4 prepared micro-batches of 8.

    Returns (weights afterwards, optimizer steps taken, what the loop returned).
    """
    from accelerate import Accelerator

    from helpers.models import build_model

    micro_batches, _ = loop_data()
    model = build_model("tiny", seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LOOP_LEARNING_RATE)
    steps = []
    optimizer.register_step_post_hook(lambda *args: steps.append(1))  # counts the real optimizer steps
    with global_random_state_kept():
        accelerator = Accelerator(gradient_accumulation_steps=LOOP_ACCUMULATION)
        # Accelerate keeps one gradient state per process: start as a fresh process does, whatever ran before
        accelerator.sync_gradients = True
        model, optimizer, micro_batches = accelerator.prepare(model, optimizer, micro_batches)
        returned = loop(accelerator, model, optimizer, micro_batches)
    return flat_parameters(accelerator.unwrap_model(model)).cpu(), len(steps), returned


def reference_run():
    """Two plain SGD steps on batches of 16: (weights, each batch's loss before its step)."""
    from helpers.models import build_model

    _, batches = loop_data()
    model = build_model("tiny", seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LOOP_LEARNING_RATE)
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return flat_parameters(model), losses


def accumulation_by_hand(plain_backward=True, zero_grad_every_micro_batch=True, step_every_micro_batch=False,
                         never_zero_grad=False):
    """The exercise's loop, with the given bugs (the defaults: the loop as given), to name what an answer did."""
    def loop(accelerator, model, optimizer, dataloader):
        step_losses, losses = [], []
        for step, batch in enumerate(dataloader):
            loss = model(**batch).loss
            loss.backward() if plain_backward else accelerator.backward(loss)
            losses.append(loss.item())
            if step_every_micro_batch or (step + 1) % accelerator.gradient_accumulation_steps == 0:
                optimizer.step()
                step_losses.append(sum(losses) / len(losses))
                losses = []
                if not (zero_grad_every_micro_batch or never_zero_grad):
                    optimizer.zero_grad()
            if zero_grad_every_micro_batch:
                optimizer.zero_grad()
        return step_losses
    return loop


LOOP_MISTAKES = {  # (the bugs left, what they did): tried in this order on an answer with 2 optimizer steps
    "as_given": (dict(),
                 "these are the weights of the loop as given: both bugs are still there. optimizer.step() saw only "
                 "the last micro-batch's gradient (zero_grad() after every micro-batch erased the one before), and "
                 "at full size (loss.backward() does not divide by the accumulation steps)."),
    "zero_grad_every_micro_batch": (dict(plain_backward=False),
                                    "optimizer.step() saw only the last micro-batch's gradient: zero_grad() after "
                                    "every micro-batch erased the one before. Hint: reset the gradients only once an "
                                    "optimizer step has used them."),
    "plain_backward": (dict(zero_grad_every_micro_batch=False),
                       "the 2 micro-batches' gradients were added, not averaged, so each step went twice too far. "
                       "Hint: loss.backward() does not divide by the accumulation steps; accelerator.backward(loss) "
                       "does."),
    "never_zero_grad": (dict(plain_backward=False, zero_grad_every_micro_batch=False, never_zero_grad=True),
                        "the gradients were never reset, so the second step also added the first step's gradients. "
                        "Hint: call optimizer.zero_grad() after each optimizer step."),
}


def returned_losses_mistake(returned, expected):
    """The hint for a loop whose weights are right but whose returned losses are not."""
    if returned is None:
        return ("it returned None: keep the loop's step_losses, one mean loss per optimizer step, and return them.")
    try:
        values = [float(value) for value in returned]
    except (TypeError, ValueError):
        return f"it returned {type(returned).__name__}, not a list of numbers (step_losses)."
    if len(values) == 2 * len(expected):
        return ("it returned one loss per micro-batch: return one per optimizer step, the mean of its "
                f"{LOOP_ACCUMULATION} micro-batches' losses.")
    if len(values) != len(expected):
        return f"it returned {len(values)} losses for {len(expected)} optimizer steps."
    for factor, cause in ((LOOP_ACCUMULATION, "the sum of the micro-batches' losses, not their mean"),
                          (1 / LOOP_ACCUMULATION, "the losses after dividing them by the accumulation steps: "
                                                  "record loss.item() before, as the loop given did")):
        if all(math.isclose(v, factor * e, rel_tol=1e-3) for v, e in zip(values, expected)):
            return f"it returned {cause}."
    return "its losses are not the mean losses of the micro-batches of each optimizer step."


@checker("2.3")
def check_fixed_loop(fixed_loop):
    """``fixed_loop(accelerator, model, optimizer, dataloader)``: the given loop, its bugs fixed."""
    require_callable(fixed_loop, "fixed_loop")
    expected_weights, expected_losses = reference_run()
    weights, steps, returned = call_learner(loop_run, fixed_loop, name="fixed_loop")
    if steps != 2:
        hint = {0: "the optimizer never stepped: keep optimizer.step() in the loop.",
                4: "the optimizer stepped after every micro-batch: step only once every 2 micro-batches "
                   "(the loop as given counted them; `with accelerator.accumulate(model):` counts them for you)."}
        raise Wrong(f"the optimizer stepped {steps} times for 4 micro-batches, not 2. Hint: "
                    + hint.get(steps, "one optimizer step every 2 micro-batches."))
    if not torch.allclose(weights, expected_weights, atol=TOLERANCE):
        for mistakes, explanation in LOOP_MISTAKES.values():
            mistaken_weights, _, _ = loop_run(accumulation_by_hand(**mistakes))
            if torch.allclose(weights, mistaken_weights, atol=TOLERANCE):
                raise Wrong(f"2 optimizer steps, but {explanation}")
        raise Wrong("2 optimizer steps, but the weights differ from 2 plain SGD steps on batches of 16. Hint: each "
                    "step must use the mean gradient of its 2 micro-batches, and nothing else.")
    if not (returned is not None and hasattr(returned, "__len__") and len(returned) == len(expected_losses)
            and all(math.isclose(float(v), e, rel_tol=TOLERANCE) for v, e in zip(returned, expected_losses))):
        raise Wrong("the weights are right now, but " + returned_losses_mistake(returned, expected_losses))
    return ("4 micro-batches of 8 gave 2 optimizer steps, the weights of 2 plain SGD steps on batches of 16, and "
            "the mean loss of each step.")


def compare_with_bigger_batches(loop):
    """Run ``loop`` as check 2.3 does and print what it did beside 2 plain SGD steps on batches of 16."""
    expected_weights, _ = reference_run()
    weights, steps, returned = loop_run(loop)
    print(f"optimizer steps: {steps} (2 plain steps on batches of 16: 2)")
    print("weights equal to those of 2 plain SGD steps on batches of 16:",
          torch.allclose(weights, expected_weights, atol=TOLERANCE))
    print("losses returned:", len(returned) if hasattr(returned, "__len__") else returned)


# --- 2.4 -----------------------------------------------------------------------------------------------------

UNEVEN_EXAMPLES = 40  # 2.4: 40 examples in micro-batches of 16, accumulated 3 at a time: 16 + 16 + 8 ...
UNEVEN_ACCUMULATION = 3  # ... so one optimizer step, whose last micro-batch holds half as many examples
UNEVEN_LEARNING_RATE = 0.5  # plain SGD, no clipping: a wrong weighting of the examples shows in the weights
UNEVEN_ARGUMENTS = dict(learning_rate=UNEVEN_LEARNING_RATE, optim="sgd", lr_scheduler_type="constant",
                        max_grad_norm=0.0)  # max_grad_norm=0: no clipping, which would hide a wrong scale

LOSS_FUNCTION_HINTS = [
    ("NoneType", "Trainer takes the labels out of the batch before the forward pass, so outputs.loss is None: "
                 "compute the cross-entropy from outputs.logits and labels."),
    ("num_items_in_batch", "Trainer calls it as compute_loss_func(outputs, labels, num_items_in_batch=...)."),
    ("attribute 'backward'", "return the loss as a tensor, not a number: Trainer calls backward on it."),
    ("does not require grad", "return the loss as a tensor computed from outputs.logits, with its graph "
                              "(no .item(), no .detach())."),
]


def uneven_run(compute_loss_func):
    """One Trainer step over 16 + 16 + 8 examples with ``compute_loss_func``: (weights, the logged loss)."""
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    trainer = trainer_step_run(model, training_examples(UNEVEN_EXAMPLES), MICRO_BATCH_SIZE, UNEVEN_ACCUMULATION,
                               compute_loss_func=compute_loss_func, **UNEVEN_ARGUMENTS)
    logged = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    return flat_parameters(model).cpu(), logged


def uneven_reference():
    """One plain SGD step on all 40 examples at once: (weights, their mean loss)."""
    from helpers.data import make_dataloader
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=UNEVEN_LEARNING_RATE)
    batch = next(iter(make_dataloader(training_examples(UNEVEN_EXAMPLES), course_tokenizer(), UNEVEN_EXAMPLES)))
    loss = model(**batch).loss  # the mean over the 40 examples
    loss.backward()
    optimizer.step()
    return flat_parameters(model), loss.item()


def uneven_mistake(loss_function):
    """The hint for a wrong loss function, found by calling it on the step's 3 micro-batches (16, 16 and 8)."""
    import torch.nn.functional as F

    from helpers.data import make_dataloader
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    micro_batches = make_dataloader(training_examples(UNEVEN_EXAMPLES), course_tokenizer(), MICRO_BATCH_SIZE)
    num_items_in_batch = torch.tensor(UNEVEN_EXAMPLES)
    answers, sums, counts = [], [], []
    with torch.no_grad():
        for batch in micro_batches:
            labels = batch.pop("labels")
            outputs = model(**batch)
            answer = call_learner(loss_function, outputs, labels, num_items_in_batch=num_items_in_batch,
                                  name="step_mean_loss", hints=LOSS_FUNCTION_HINTS)
            answers.append(float(answer))
            sums.append(F.cross_entropy(outputs.logits, labels, reduction="sum").item())
            counts.append(len(labels))
    means = [total / count for total, count in zip(sums, counts)]
    full_step = MICRO_BATCH_SIZE * UNEVEN_ACCUMULATION
    candidates = [
        (means, f"your loss is each micro-batch's own mean. With a compute_loss_func, Trainer does not divide by "
                f"the accumulation steps (it trusts the function to use num_items_in_batch), so the "
                f"{UNEVEN_ACCUMULATION} means were added: the step went about {UNEVEN_ACCUMULATION} times too far."),
        ([mean / UNEVEN_ACCUMULATION for mean in means],
         f"you averaged the {UNEVEN_ACCUMULATION} micro-batch means, but the last micro-batch has {counts[-1]} "
         f"examples, not {counts[0]}: each of its examples weighed twice as much as the others. Weigh every example "
         "alike: sum the losses of the micro-batch's examples and divide by num_items_in_batch."),
        (sums, f"you returned the sum of the micro-batch's losses: over the step, {UNEVEN_EXAMPLES} times the mean. "
               "Divide it by num_items_in_batch, the examples of the whole optimizer step."),
        ([total / full_step for total in sums],
         f"you divided by {full_step} = micro-batch size x accumulation steps, but this step has only "
         f"{UNEVEN_EXAMPLES} examples (the last micro-batch is short): num_items_in_batch counts them."),
        ([mean / UNEVEN_EXAMPLES for mean in means],
         "you divided the micro-batch's mean, already divided by its own examples, by num_items_in_batch again: "
         "divide the sum of its examples' losses instead."),
    ]
    for expected, hint in candidates:
        if all(math.isclose(a, e, rel_tol=1e-3) for a, e in zip(answers, expected)):
            return hint
    return ("the step should learn from the mean loss of all its examples: each micro-batch's share is the sum of "
            "its examples' losses divided by num_items_in_batch.")


@checker("2.4")
def check_step_mean_loss(step_mean_loss):
    """``step_mean_loss(outputs, labels, num_items_in_batch)``: Trainer's compute_loss_func for uneven micro-batches."""
    require_callable(step_mean_loss, "step_mean_loss")
    expected_weights, expected_loss = uneven_reference()
    weights, logged = call_learner(uneven_run, step_mean_loss, name="Trainer's step with your step_mean_loss",
                                   hints=LOSS_FUNCTION_HINTS)
    if not torch.allclose(weights, expected_weights, atol=TOLERANCE):
        raise Wrong("after one Trainer step over micro-batches of 16, 16 and 8, the weights differ from one SGD step "
                    f"on all {UNEVEN_EXAMPLES} examples at once. Hint: " + uneven_mistake(step_mean_loss))
    if not math.isclose(logged, expected_loss, rel_tol=LOSS_RTOL):
        raise Wrong(f"the weights are right, but Trainer logged {logged:.4f} instead of the mean loss "
                    f"{expected_loss:.4f}. Hint: return the loss you train on, as a tensor.")
    return (f"one Trainer step over micro-batches of 16, 16 and 8 gave the weights of one SGD step on all "
            f"{UNEVEN_EXAMPLES} examples at once, and Trainer logged their mean loss: every example weighed alike.")
