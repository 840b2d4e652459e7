"""Checks for notebooks/practice/02_trainer_and_accelerator_practice.ipynb (lesson 02).

Each check runs the learner's answer for real (a Trainer step, an Accelerate loop) on
the tiny DistilBERT, and compares what it did with what the intended answer does: the
examples each optimizer step learned from, the layers recomputed in backward, the losses
Trainer logged, the weights after the steps. Where one configuration could be fooled by
a number written into the answer, a second one with other numbers follows. A near miss
gets a hint that names what it actually did, found by running (or probing) the typical
mistakes the same way. The checks run on one CPU thread, and what does not depend on the
answer is measured once.
"""
import collections
import contextlib
import functools
import inspect
import math
import tempfile
from unittest import mock

import torch

from helpers.models import flat_parameters
from helpers.practice.verdicts import (
    Wrong,
    call_learner,
    checker,
    describe_error,
    explaining_warnings,
    on_one_thread,
    require_callable,
    whole_number,
)
from helpers.random_state import global_random_state_kept
from helpers.trainer_losses import first_logged_losses
from helpers.training import MICRO_BATCH_SIZE, TRAINER_ACCUMULATION

# The checks' Trainer and Accelerator use the GPU when there is one, as the lessons do:
# a Trainer with use_cpu=True after the learner's own GPU Accelerator would be refused
# by Accelerate.
ON_CPU = not torch.cuda.is_available()
# weights compared on the CPU, after training on either device
TOLERANCE = 1e-5 if ON_CPU else 1e-4
# a logged loss against its prediction: float32 sums in Trainer, float64 in the
# learner's code
LOSS_RTOL = 1e-4


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


def trainer_run(
    model, examples, micro_batch_size, accumulation, compute_loss_func=None, **arguments
):
    """Train ``model`` with Trainer for one optimizer step over ``examples``, taken in
    order; return the Trainer.

    Trainer seeds the global generators: the learner's random numbers are put back
    afterwards. Its output folder is a temporary one, removed afterwards (nothing is
    saved: save_strategy="no").
    """
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    with (tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as output_dir,
          global_random_state_kept()):
        args = TrainingArguments(output_dir=output_dir, max_steps=1, logging_steps=1,
                                 per_device_train_batch_size=micro_batch_size,
                                 gradient_accumulation_steps=accumulation,
                                 train_sampling_strategy="sequential",
                                 save_strategy="no", report_to="none",
                                 disable_tqdm=True, use_cpu=ON_CPU, **arguments)
        trainer = Trainer(model=model, args=args, train_dataset=examples,
                          compute_loss_func=compute_loss_func,
                          data_collator=DataCollatorWithPadding(course_tokenizer()))
        # without a progress bar, Trainer would print every log
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return trainer


def logged_losses(trainer):
    """The training losses ``trainer`` logged, one per optimizer step
    (logging_steps=1)."""
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def counted(count, word):
    """``1 layer``, ``2 layers``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def listed(items):
    """``a``, ``a and b``, ``a, b and c``."""
    items = [str(item) for item in items]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


# --- 2.1
# --------------------------------------------------------------------------------------

# 2.1: the examples that fit in one forward + backward on the exercise's GPU
SMALL_GPU_MICRO_BATCH = 8
# 64: the slide's examples per optimizer step
EFFECTIVE_BATCH = MICRO_BATCH_SIZE * TRAINER_ACCUMULATION
# 2.1 trains one step of the learner's settings only up to this many examples
LARGEST_STEP_RUN = 512

ARGUMENT_HINTS = [
    ("evaluation_strategy",
     "Transformers renamed evaluation_strategy to eval_strategy."),
    ("no_cuda", "Transformers renamed no_cuda to use_cpu."),
    ("tokenizer",
     "TrainingArguments takes no tokenizer; Trainer takes it as processing_class."),
    ("unexpected keyword", "check the argument's name in TrainingArguments' "
     "documentation (help(TrainingArguments))."),
]
# deprecated name -> today's (Transformers 5)
TODAYS_NAMES = {"gradient_checkpointing": "activation_checkpointing",
                "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}
# Trainer takes these two out of activation_checkpointing_kwargs; every other key goes
# to torch's checkpoint()
TRAINERS_OWN_CHECKPOINTING_KEYS = ("every_n_layers", "offload")


def value_of(setting):
    """A TrainingArguments setting as plain text or number."""
    # enums such as IntervalStrategy.EPOCH -> "epoch"
    return getattr(setting, "value", setting)


@contextlib.contextmanager
def deprecated_names_recorded():
    """Record the deprecated checkpointing names each TrainingArguments built in the
    block was given.

    Yields {id(arguments): {deprecated names given}}. TrainingArguments.__post_init__
    copies a deprecated name into today's and then makes the old one mirror the new, so
    finished arguments no longer tell which name was written; its FutureWarning does,
    unless the learner's code silenced it. So the check looks before __post_init__ runs
    (and at set_training's gradient_checkpointing), and puts both methods back
    afterwards. An old name equal to the new one is a mirror (a copy made with
    dataclasses.replace), not the learner's.
    """
    from transformers import TrainingArguments

    given = {}
    post_init, set_training = (TrainingArguments.__post_init__,
                               TrainingArguments.set_training)

    @functools.wraps(post_init)
    def recording_post_init(self, *args, **kwargs):
        given[id(self)] = {old for old, new in TODAYS_NAMES.items()
                           if getattr(self, old, None) is not None
                           and getattr(self, old) != getattr(self, new, None)}
        return post_init(self, *args, **kwargs)

    @functools.wraps(set_training)
    def recording_set_training(self, *args, **kwargs):
        try:
            bound = inspect.signature(set_training).bind(self, *args, **kwargs)
        except TypeError:
            pass  # set_training itself says what is wrong with its arguments
        else:
            if bound.arguments.get("gradient_checkpointing") is not None:
                given.setdefault(id(self), set()).add("gradient_checkpointing")
        return set_training(self, *args, **kwargs)

    with (mock.patch.object(TrainingArguments, "__post_init__", recording_post_init),
          mock.patch.object(TrainingArguments, "set_training", recording_set_training)):
        yield given


def measure_one_step(
    micro_batch_size, accumulation, checkpointing, checkpointing_kwargs
):
    """Train one optimizer step with these batch and checkpointing settings; count what
    happened.

    Returns (examples in each forward pass, forward passes of each layer's first module
    per micro-batch). A layer that is checkpointed runs its forward again in backward: 2
    per micro-batch instead of 1.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    model.accepts_loss_kwargs = False
    rows = []  # examples of every training forward pass of the model
    model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])),
        with_kwargs=True,
    )
    layers = [module for module in model.modules()
              if isinstance(module, GradientCheckpointingLayer)]
    # layer index -> forward passes of its first module
    layer_runs = collections.Counter()
    for index, layer in enumerate(layers):
        # the layer's own hooks stay outside its checkpoint; its first module's run
        # inside, recompute included
        next(layer.children()).register_forward_pre_hook(
            lambda module, args, index=index: layer_runs.update([index]))
    trainer_run(model, training_examples(micro_batch_size * accumulation),
                micro_batch_size, accumulation, activation_checkpointing=checkpointing,
                activation_checkpointing_kwargs=checkpointing_kwargs)
    return rows, [layer_runs[index] / max(len(rows), 1) for index in range(len(layers))]


def batch_settings(args):
    """(per_device_train_batch_size, gradient_accumulation_steps), or Wrong if one
    cannot make a step."""
    settings = []
    for name, counts in (
        ("per_device_train_batch_size", "examples in each forward pass"),
        ("gradient_accumulation_steps",
         "micro-batches each optimizer step accumulates"),
    ):
        value = whole_number(getattr(args, name), name)
        if value < 1:
            raise Wrong(f"{name} is {value}, but it counts the {counts}: a whole "
                        "number of at least 1.")
        settings.append(value)
    return settings


def checkpointing_settings(args):
    """(the checkpointing kwargs the check's step can run, the problems they already
    show), or Wrong."""
    kwargs = args.activation_checkpointing_kwargs
    if kwargs is None or not args.activation_checkpointing:
        return None, []  # Trainer reads the kwargs only when checkpointing is on
    if not isinstance(kwargs, dict):
        raise Wrong(f"activation_checkpointing_kwargs is {kwargs!r:.60}, not a dict. "
                    "Hint: leave it out: the exercise "
                    "needs none of its keys.")
    every_n_layers = kwargs.get("every_n_layers", 1)
    if (isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int)
        or every_n_layers < 1):
        raise Wrong("activation_checkpointing_kwargs's every_n_layers is "
                    f"{every_n_layers!r}: it checkpoints every "
                    "n-th layer, so it is a whole number of at least 1. Hint: leave "
                    "it out to checkpoint every layer.")
    problems = []
    if kwargs.get("offload"):
        problems.append("activation_checkpointing_kwargs's offload=True also moves "
                        "the activations kept for the "
                        "recompute into pinned CPU memory, which the exercise does "
                        "not ask for: it slows every step, "
                        "and needs a GPU (on a machine without one, Trainer's step "
                        "fails). Leave offload out")
    return {
        key: value for key, value in kwargs.items() if key != "offload"
    } or None, problems


def measured_step(micro_batch_size, accumulation, checkpointing, checkpointing_kwargs):
    """``measure_one_step`` on the learner's settings; an error that their checkpointing
    kwargs caused is Wrong."""
    try:
        return measure_one_step(
            micro_batch_size, accumulation, checkpointing, checkpointing_kwargs
        )
    except Exception as error:
        others = sorted(
            set(checkpointing_kwargs or ()) - set(TRAINERS_OWN_CHECKPOINTING_KEYS)
        )
        if not others:
            raise  # only settings the check validated: the failure is the check's own
        raise Wrong(
            "a Trainer step with your settings raised "
            f"{describe_error(error)}. Hint: Trainer takes "
            "every_n_layers and offload out of "
            "activation_checkpointing_kwargs and passes every other key "
            f"({', '.join(others)}) to "
            "torch.utils.checkpoint.checkpoint; the exercise "
            "needs none of them: leave activation_checkpointing_kwargs out."
        ) from None


def micro_batch_problem(rows):
    """What is wrong with the examples of each forward pass (the micro-batches), or
    None."""
    if all(n == SMALL_GPU_MICRO_BATCH for n in rows):
        return None
    largest, smallest = max(rows), min(rows)
    if largest > SMALL_GPU_MICRO_BATCH:
        problem = (f"each forward pass took {largest} examples at once, but "
                   "the GPU fits only "
                   f"{SMALL_GPU_MICRO_BATCH} (per_device_train_batch_size)")
        if len(rows) == 1 and rows[0] == EFFECTIVE_BATCH:
            problem += (f"; one micro-batch of {EFFECTIVE_BATCH} is exactly what does "
                        "not fit: accumulate smaller "
                        "ones instead")
        return problem
    return (f"each forward pass took only {smallest} examples, though the GPU fits "
            f"{SMALL_GPU_MICRO_BATCH}: micro-"
            "batches smaller than what fits only add forward passes, "
            f"{len(rows)} per step here "
            "(per_device_train_batch_size)")


@checker("2.1")
@on_one_thread
def check_training_arguments(make_training_args):
    """``make_training_args(output_dir)``: 64 examples a step in micro-batches of 8,
    checkpointed, eval per epoch."""
    from transformers import TrainingArguments

    require_callable(make_training_args, "make_training_args")
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as output_dir:
        with (
            explaining_warnings(
                *(f"`{old}` is deprecated" for old in TODAYS_NAMES)
            ) as deprecation_warnings,
            deprecated_names_recorded() as deprecated_names,
        ):
            args = call_learner(make_training_args, output_dir,
                                name="make_training_args", hints=ARGUMENT_HINTS)
    if not isinstance(args, TrainingArguments):
        raise Wrong("make_training_args should return TrainingArguments(...), but "
                    f"returned {type(args).__name__}.")
    deprecated = deprecated_names.get(id(args), set()) | {
        old
        for old in TODAYS_NAMES
        if any(f"`{old}` is deprecated" in str(w.message) for w in deprecation_warnings)
    }
    problems = []
    if value_of(args.eval_strategy) != "epoch":
        problems.append(f'eval_strategy is "{value_of(args.eval_strategy)}": '
                        'evaluation should run every epoch '
                        '(eval_strategy="epoch")')
    micro_batch_size, accumulation = batch_settings(args)
    # too many to train here, and wrong anyway
    if micro_batch_size * accumulation > LARGEST_STEP_RUN:
        problems.append(f"one optimizer step would learn from {micro_batch_size} x "
                        f"{accumulation} = "
                        f"{micro_batch_size * accumulation} examples, not "
                        f"{EFFECTIVE_BATCH}")
        raise Wrong("; ".join(problems) + ".")
    checkpointing_kwargs, kwargs_problems = checkpointing_settings(args)
    rows, forwards_per_micro_batch = measured_step(micro_batch_size, accumulation,
                                                   bool(args.activation_checkpointing),
                                                   checkpointing_kwargs)
    if (problem := micro_batch_problem(rows)) is not None:
        problems.append(problem)
    if sum(rows) != EFFECTIVE_BATCH:
        problems.append(f"one optimizer step learned from {sum(rows)} examples "
                        f"({len(rows)} micro-batches of "
                        f"{rows[0]}, counted in a real Trainer step), not "
                        f"{EFFECTIVE_BATCH} "
                        "(gradient_accumulation_steps sets how many micro-batches one "
                        "step accumulates)")
    recomputed = sum(1 for n in forwards_per_micro_batch if n == 2)
    layers = len(forwards_per_micro_batch)
    if recomputed == 0:
        problem = ("no layer was recomputed in backward: activation checkpointing is "
                   "off (activation_checkpointing=True)")
        if args.gradient_checkpointing and not args.activation_checkpointing:
            problem += (". Your arguments' gradient_checkpointing is True, but "
                        "Trainer reads activation_checkpointing "
                        "alone, and TrainingArguments copies the old name into the "
                        "new one only while it is built")
        problems.append(problem)
    elif recomputed < layers:
        problems.append(f"only {recomputed} of the model's {layers} layers "
                        f"{'was' if recomputed == 1 else 'were'} "
                        "recomputed in backward: "
                        "activation_checkpointing_kwargs's every_n_layers leaves "
                        "the others out, "
                        "and the exercise asks for every layer (leave "
                        "every_n_layers out)")
    problems += kwargs_problems
    for old, new in TODAYS_NAMES.items():
        if old in deprecated:
            problems.append(f"{old} is the deprecated name (Transformers v6 removes "
                            "it): the exercise asks for "
                            f"today's name, {new}")
    if problems:
        raise Wrong("; ".join(problems) + ".")
    return (f"one optimizer step learned from {EFFECTIVE_BATCH} examples in "
            f"{len(rows)} micro-batches of "
            f"{SMALL_GPU_MICRO_BATCH} (counted in a real Trainer step), each of the "
            f"{layers} layers ran its "
            "forward pass twice per micro-batch (checkpointed: recomputed in "
            "backward), and evaluation runs "
            f"every epoch: the slide's {EFFECTIVE_BATCH} examples per step, "
            f"{SMALL_GPU_MICRO_BATCH} at a time.")


# --- 2.2
# --------------------------------------------------------------------------------------

PREDICTION_MICRO_BATCHES = 10  # 2.2: one epoch of 10 micro-batches of 16 ...
# ... accumulated 4 by 4: optimizer steps of 4, 4 and 2 micro-batches
PREDICTION_ACCUMULATION = 4
# ... and again accumulated 3 by 3 (steps of 3, 3, 3 and 1): a prediction must use its
# `accumulation` argument
PREDICTION_ACCUMULATIONS = (PREDICTION_ACCUMULATION, 3)


@functools.lru_cache(maxsize=1)
def micro_batch_losses_and_logs():
    """(each micro-batch's loss, {(accumulation, accepts_loss_kwargs): the losses
    Trainer logged}), at learning rate 0.

    At learning rate 0 the weights never change, so each micro-batch's loss is known
    before Trainer runs. Measured once: the check reads them, and nothing the learner
    does changes them.
    """
    from helpers.data import make_dataloader
    from helpers.models import build_model

    examples = training_examples(PREDICTION_MICRO_BATCHES * MICRO_BATCH_SIZE)
    with torch.no_grad():
        model = build_model("tiny", seed=0)
        micro_batches = make_dataloader(examples, course_tokenizer(), MICRO_BATCH_SIZE)
        losses = [model(**batch).loss.item() for batch in micro_batches]
    logged = {}
    for accumulation in PREDICTION_ACCUMULATIONS:
        for accepts_loss_kwargs in (True, False):
            model = build_model("tiny", seed=0)
            model.accepts_loss_kwargs = accepts_loss_kwargs
            steps = math.ceil(PREDICTION_MICRO_BATCHES / accumulation)  # one epoch
            # lesson 2's own Trainer run
            logged[accumulation, accepts_loss_kwargs] = first_logged_losses(
                model,
                examples,
                course_tokenizer(),
                steps=steps,
                micro_batch_size=MICRO_BATCH_SIZE,
                accumulation=accumulation,
                learning_rate=0.0,
                train_sampling_strategy="sequential",
                use_cpu=ON_CPU,
            )
    return losses, logged


def step_groups(losses, accumulation):
    """The micro-batch losses of each optimizer step: ``accumulation`` at a time, the
    last group shorter."""
    return [losses[i:i + accumulation] for i in range(0, len(losses), accumulation)]


def trainers_rule(groups, accepts_loss_kwargs):
    """What Trainer logs for these groups of micro-batch losses: each group's sum (True)
    or mean (False)."""
    return [sum(group) if accepts_loss_kwargs else sum(group) / len(group)
            for group in groups]


def numbers(prediction, name):
    """The prediction as a list of floats, or Wrong saying what it should be."""
    try:
        return [float(value.detach() if isinstance(value, torch.Tensor) else value)
                for value in prediction]
    except (TypeError, ValueError, RuntimeError):
        raise Wrong(f"{name} should return a list of numbers, one per optimizer "
                    "step, but returned "
                    f"{type(prediction).__name__} {prediction!r:.80}.") from None


def same_numbers(first, second, rel_tol=LOSS_RTOL):
    return len(first) == len(second) and all(
        math.isclose(a, b, rel_tol=rel_tol) for a, b in zip(first, second)
    )


def micro_batch_ranges(count, accumulation):
    """``1-4, 5-8 and 9-10``: the micro-batches (counted from 1) of each optimizer
    step."""
    ranges = []
    for first in range(1, count + 1, accumulation):
        last = min(first + accumulation - 1, count)
        ranges.append(f"{first}-{last}" if last > first else f"{first}")
    return listed(ranges)


def grouping_mistake(predicted, losses, accumulation, accepts_loss_kwargs):
    """The hint for Trainer's rule applied to the wrong micro-batches, or None."""
    left_over = len(step_groups(losses, accumulation)[-1])
    for other in range(1, len(losses) + 1):
        if other != accumulation and same_numbers(
            predicted, trainers_rule(step_groups(losses, other), accepts_loss_kwargs)
        ):
            return (
                f"you grouped the micro-batches {other} at a time, but this run "
                f"accumulates {accumulation} "
                "(the argument accumulation): group them by it, whatever its value."
            )
    from_the_end = [group[::-1] for group in step_groups(losses[::-1], accumulation)][
        ::-1
    ]
    if same_numbers(predicted, trainers_rule(from_the_end, accepts_loss_kwargs)):
        return ("you put the short step first. Trainer takes the micro-batches in "
                f"order, {accumulation} per "
                f"optimizer step from the first, so the {left_over} left over "
                "make the last step.")
    for cut, which in ((slice(1, None), "first"), (slice(None, -1), "last")):
        if same_numbers(
            predicted,
            trainers_rule(step_groups(losses[cut], accumulation), accepts_loss_kwargs),
        ):
            return (f"you left out the {which} micro-batch: every one of the "
                    f"{len(losses)} micro-batches is in "
                    f"a step ({micro_batch_ranges(len(losses), accumulation)}).")
    return None


def rounding_mistake(predicted, expected):
    """The hint for a right prediction rounded or computed too coarsely, or None."""
    for decimals in range(7):
        if all(math.isclose(p, round(e, decimals), rel_tol=1e-9, abs_tol=1e-12)
               for p, e in zip(predicted, expected)):
            return ("your numbers are Trainer's, rounded to "
                    f"{counted(decimals, 'decimal')}: return them unrounded "
                    "(the check compares them to within 0.01 %).")
    if same_numbers(predicted, expected, rel_tol=2e-3):
        return ("your numbers are within 0.2 % of Trainer's, but not within 0.01 %: "
                "did you round them, or compute "
                "them in low precision? Return them unrounded.")
    return None


def prediction_mistake(predicted, losses, accumulation, accepts_loss_kwargs):
    """The hint for a wrong prediction: which typical mistake it matches."""
    groups = step_groups(losses, accumulation)
    steps, left_over = len(groups), len(groups[-1])
    model = f"a model whose accepts_loss_kwargs is {accepts_loss_kwargs}"
    expected = trainers_rule(groups, accepts_loss_kwargs)
    if len(predicted) == len(losses):
        return ("that is one number per micro-batch, but Trainer logs once per "
                "optimizer step (logging_steps=1), "
                f"and {len(losses)} micro-batches accumulated {accumulation} by "
                f"{accumulation} make {steps} steps.")
    if (
        hint := grouping_mistake(predicted, losses, accumulation, accepts_loss_kwargs)
    ) is not None:
        return hint
    if left_over < accumulation and len(predicted) == len(losses) // accumulation:
        return (f"the {left_over} micro-batches left over at the end of the epoch "
                "make one more, smaller optimizer "
                f"step, and Trainer logs it too: {steps} numbers.")
    if len(predicted) != steps:
        return f"Trainer logs one number per optimizer step: {steps} of them here."
    if (hint := rounding_mistake(predicted, expected)) is not None:
        return hint
    sums = [sum(group) for group in groups]
    means = [sum(group) / len(group) for group in groups]
    if accepts_loss_kwargs:
        if same_numbers(predicted, means):
            return (f"for {model}, Trainer believes the model already divides its "
                    "loss by num_items_in_batch, so "
                    "it divides by nothing and logs the sum of each step's "
                    "micro-batch losses. DistilBERT's loss "
                    "ignores num_items_in_batch: this is the sum lesson 2 found.")
        if left_over < accumulation and same_numbers(
            predicted, [mean * accumulation for mean in means]
        ):
            return (f"the last optimizer step had only {left_over} micro-batches: "
                    f"Trainer adds their {left_over} "
                    f"losses, which is {left_over} times their mean, not "
                    f"{accumulation} times.")
        return (f"for {model}, Trainer logs after each optimizer step the sum of that "
                "step's micro-batch losses "
                "(it divides by nothing): micro-batches "
                f"{micro_batch_ranges(len(losses), accumulation)}.")
    if same_numbers(predicted, sums):
        return (f"for {model} (lesson 2's fix), Trainer divides each micro-batch's "
                "loss by the number of "
                "micro-batches in the step before adding them up: it logs their mean.")
    if left_over < accumulation and same_numbers(
        predicted, [total / accumulation for total in sums]
    ):
        return (f"the last optimizer step had only {left_over} micro-batches, and "
                "Trainer divided their losses by "
                f"{left_over}, the micro-batches it actually accumulated, not by "
                "gradient_accumulation_steps="
                f"{accumulation}: it logs their mean.")
    return (f"for {model}, Trainer logs after each optimizer step the mean of that "
            "step's micro-batch losses: "
            f"micro-batches {micro_batch_ranges(len(losses), accumulation)}.")


@checker("2.2")
@on_one_thread
def check_logged_loss_prediction(predict_logged_losses):
    """``predict_logged_losses(micro_batch_losses, accumulation, accepts_loss_kwargs)``:
    what Trainer logs per step."""
    require_callable(predict_logged_losses, "predict_logged_losses")
    losses, logged = micro_batch_losses_and_logs()
    for accumulation in PREDICTION_ACCUMULATIONS:
        for accepts_loss_kwargs in (True, False):
            predicted = numbers(
                call_learner(predict_logged_losses, list(losses), accumulation,
                             accepts_loss_kwargs, name="predict_logged_losses"),
                "predict_logged_losses",
            )
            truth = logged[accumulation, accepts_loss_kwargs]
            if not same_numbers(predicted, truth):
                run = ("" if accumulation == PREDICTION_ACCUMULATION else
                       " (the check's second run, to see that your function uses its "
                       "argument accumulation)")
                raise Wrong(
                    f"with gradient_accumulation_steps={accumulation}{run} "
                    "and accepts_loss_kwargs="
                    f"{accepts_loss_kwargs}, Trainer logged "
                    f"[{', '.join(f'{v:.4f}' for v in truth)}], and "
                    "you predicted "
                    f"[{', '.join(f'{v:.4f}' for v in predicted)}]. Hint: "
                    + prediction_mistake(
                        predicted, losses, accumulation, accepts_loss_kwargs
                    )
                )
    sizes = [len(group) for group in step_groups(losses, PREDICTION_ACCUMULATION)]
    runs = 2 * len(PREDICTION_ACCUMULATIONS)
    predicted_count = sum(len(values) for values in logged.values())
    return (f"you predicted all {predicted_count} logged losses (checked against "
            f"{runs} real Trainer runs, " "gradient_accumulation_steps="
            f"{' and '.join(map(str, PREDICTION_ACCUMULATIONS))}): {len(losses)} "
            f"micro-batches accumulated {PREDICTION_ACCUMULATION} by "
            f"{PREDICTION_ACCUMULATION} make "
            f"{len(sizes)} optimizer steps of {', '.join(map(str, sizes))} "
            "micro-batches; as is, Trainer logs each "
            "step's sum, and with the fix their mean, the last step divided "
            f"by {sizes[-1]}.")


# --- 2.3
# --------------------------------------------------------------------------------------

LOOP_ACCUMULATION = 2  # 2.3: Accelerator(gradient_accumulation_steps=2) ...
LOOP_MICRO_BATCH = 8  # ... over 4 micro-batches of 8: 2 optimizer steps of 16 examples
# plain SGD: a step's size is learning rate x gradient, so a wrong scale shows
LOOP_LEARNING_RATE = 0.5

LoopRun = collections.namedtuple("LoopRun", "weights steps returned learning_rates")


def loop_data():
    """32 training examples as 4 micro-batches of 8, and the same examples as 2 batches
    of 16."""
    from helpers.data import make_dataloader

    examples = training_examples(4 * LOOP_MICRO_BATCH)
    return (
        make_dataloader(examples, course_tokenizer(), batch_size=LOOP_MICRO_BATCH),
        make_dataloader(examples, course_tokenizer(),
                        batch_size=LOOP_MICRO_BATCH * LOOP_ACCUMULATION),
    )


def loop_run(loop):
    """Run ``loop(accelerator, model, optimizer, dataloader)`` on 4 prepared
    micro-batches of 8.

    Returns a LoopRun: the weights afterwards, the optimizer steps taken, what the loop
    returned, and the learning rate of each step.
    """
    from accelerate import Accelerator

    from helpers.models import build_model

    micro_batches, _ = loop_data()
    model = build_model("tiny", seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LOOP_LEARNING_RATE)
    # one per real optimizer step: Accelerate skips the calls that only accumulate
    learning_rates = []
    optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: learning_rates.append(
            optimizer.param_groups[0]["lr"]
        )
    )
    with global_random_state_kept():
        accelerator = Accelerator(gradient_accumulation_steps=LOOP_ACCUMULATION)
        # Accelerate keeps one gradient state per process: start as a fresh process
        # does, whatever ran before
        accelerator.sync_gradients = True
        model, optimizer, micro_batches = accelerator.prepare(
            model, optimizer, micro_batches
        )
        returned = loop(accelerator, model, optimizer, micro_batches)
    return LoopRun(flat_parameters(accelerator.unwrap_model(model)).cpu(),
                   len(learning_rates), returned, learning_rates)


@functools.lru_cache(maxsize=1)
def reference_run():
    """Two plain SGD steps on batches of 16: (weights, each batch's loss before its
    step). Computed once."""
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
    return flat_parameters(model).cpu(), losses


def accumulation_by_hand(plain_backward=True, zero_grad_every_micro_batch=True,
                         step_every_micro_batch=False, never_zero_grad=False,
                         divide_the_loss=False):
    """The exercise's loop, with the given bugs (the defaults: the loop as given), to
    name what an answer did."""
    def loop(accelerator, model, optimizer, dataloader):
        step_losses, losses = [], []
        for step, batch in enumerate(dataloader):
            loss = model(**batch).loss
            divided = (loss / accelerator.gradient_accumulation_steps if divide_the_loss
                       else loss)
            divided.backward() if plain_backward else accelerator.backward(divided)
            losses.append(loss.item())
            if (step_every_micro_batch
                or (step + 1) % accelerator.gradient_accumulation_steps == 0):
                optimizer.step()
                step_losses.append(sum(losses) / len(losses))
                losses = []
                if not (zero_grad_every_micro_batch or never_zero_grad):
                    optimizer.zero_grad()
            if zero_grad_every_micro_batch:
                optimizer.zero_grad()
        return step_losses
    return loop


# (the bugs left, what they did): tried in this order on an answer with 2 optimizer
# steps
LOOP_MISTAKES = {
    "as_given": (dict(),
                 "these are the weights of the loop as given: both bugs are still "
                 "there. optimizer.step() saw only "
                 "the last micro-batch's gradient (zero_grad() after every "
                 "micro-batch erased the one before), and "
                 "at full size (loss.backward() does not divide by the "
                 "accumulation steps)."),
    "zero_grad_every_micro_batch": (dict(plain_backward=False),
                                    "optimizer.step() saw only the last micro-batch's "
                                    "gradient: zero_grad() after "
                                    "every micro-batch erased the one before. Hint: "
                                    "reset the gradients only once an "
                                    "optimizer step has used them."),
    "plain_backward": (dict(zero_grad_every_micro_batch=False),
                       "the 2 micro-batches' gradients were added, not averaged, so "
                       "each step went twice too far. "
                       "Hint: loss.backward() does not divide by the accumulation "
                       "steps; accelerator.backward(loss) " "does."),
    "divided_twice": (
        dict(plain_backward=False, zero_grad_every_micro_batch=False,
             divide_the_loss=True),
        "each micro-batch's gradient was divided by 2 twice, so each "
        "step went half as far. Hint: "
        "accelerator.backward(loss) already divides the loss by the "
        "accumulation steps; divide it "
        "yourself only before a plain loss.backward().",
    ),
    "never_zero_grad": (
        dict(plain_backward=False, zero_grad_every_micro_batch=False,
             never_zero_grad=True),
        "the gradients were never reset, so the second step also "
        "added the first step's gradients. "
        "Hint: call optimizer.zero_grad() after each optimizer step.",
    ),
}


@functools.lru_cache(maxsize=None)
def mistaken_weights(mistake):
    """The weights after the loop with one of LOOP_MISTAKES (computed once each)."""
    bugs, _ = LOOP_MISTAKES[mistake]
    return loop_run(accumulation_by_hand(**bugs)).weights


def returned_numbers(returned):
    """What a loop returned, as a list of floats (read once: it may be an iterator), or
    None if it is not that."""
    try:
        return [float(value.detach() if isinstance(value, torch.Tensor) else value)
                for value in returned]
    except (TypeError, ValueError, RuntimeError):
        return None


def returned_losses_mistake(returned, values, expected):
    """The hint for a loop whose weights are right but whose returned losses
    (``values``) are not."""
    if returned is None:
        return ("it returned None: keep the loop's step_losses, one mean loss per "
                "optimizer step, and return them.")
    if values is None:
        return (f"it returned {type(returned).__name__} {returned!r:.60}, not a list "
                "of numbers (step_losses).")
    if len(values) == 2 * len(expected):
        return ("it returned one loss per micro-batch: return one per optimizer step, "
                "the mean of its "
                f"{LOOP_ACCUMULATION} micro-batches' losses.")
    if len(values) != len(expected):
        return f"it returned {len(values)} losses for {len(expected)} optimizer steps."
    for factor, cause in ((LOOP_ACCUMULATION, "the sum of the micro-batches' "
                                              "losses, not their mean"),
                          (1 / LOOP_ACCUMULATION, "the losses after dividing them by "
                                                  "the accumulation steps: "
                                                  "record loss.item() before, as "
                                                  "the loop given did")):
        if all(
            math.isclose(v, factor * e, rel_tol=1e-3) for v, e in zip(values, expected)
        ):
            return f"it returned {cause}."
    return ("its losses are not the mean losses of the micro-batches of each "
            "optimizer step.")


@checker("2.3")
@on_one_thread
def check_fixed_accumulation_loop(fixed_loop):
    """``fixed_loop(accelerator, model, optimizer, dataloader)``: exercise 2.3's
    gradient-accumulation loop, its bugs fixed."""
    require_callable(fixed_loop, "fixed_loop")
    expected_weights, expected_losses = reference_run()
    run = call_learner(loop_run, fixed_loop, name="fixed_loop")
    if run.steps == 0 and inspect.isgenerator(run.returned):
        raise Wrong(
            "fixed_loop is a generator function (it holds `yield`): calling "
            "it runs none of its body, so "
            "nothing trained. Hint: collect the losses in a list and return it."
        )
    if run.steps != 2:
        hint = {0: "the optimizer never stepped: keep optimizer.step() in the loop.",
                4: "the optimizer stepped after every micro-batch: step only once "
                   "every 2 micro-batches "
                   "(the loop as given counted them; `with "
                   "accelerator.accumulate(model):` counts them for you)."}
        raise Wrong(f"the optimizer stepped {run.steps} times for 4 "
                    "micro-batches, not 2. Hint: "
                    + hint.get(run.steps, "one optimizer step every 2 micro-batches."))
    changed = [rate for rate in run.learning_rates if rate != LOOP_LEARNING_RATE]
    if changed:
        raise Wrong(f"the optimizer stepped with learning rate {changed[0]:g}, not "
                    f"the {LOOP_LEARNING_RATE:g} it was "
                    "given. Hint: leave the learning rate alone and average the "
                    "gradients (accelerator.backward(loss) "
                    "divides the loss by the accumulation steps). A smaller learning "
                    "rate moves plain SGD's weights "
                    "as a smaller gradient does, but not with weight decay, nor with "
                    "AdamW, Trainer's default "
                    "optimizer, whose step follows the learning rate and hardly the "
                    "gradient's scale.")
    if not torch.allclose(run.weights, expected_weights, atol=TOLERANCE):
        for mistake, (_, explanation) in LOOP_MISTAKES.items():
            if torch.allclose(run.weights, mistaken_weights(mistake), atol=TOLERANCE):
                raise Wrong(f"2 optimizer steps, but {explanation}")
        raise Wrong("2 optimizer steps, but the weights differ from 2 plain SGD steps "
                    "on batches of 16. Hint: each "
                    "step must use the mean gradient of its 2 micro-batches, "
                    "and nothing else.")
    values = returned_numbers(run.returned) if run.returned is not None else None
    if not (
        values is not None
        and len(values) == len(expected_losses)
        and all(math.isclose(v, e, rel_tol=TOLERANCE)
                for v, e in zip(values, expected_losses))
    ):
        raise Wrong("the weights are right now, but "
                    + returned_losses_mistake(run.returned, values, expected_losses))
    return ("4 micro-batches of 8 gave 2 optimizer steps, the weights of 2 plain SGD "
            "steps on batches of 16, and "
            "the mean loss of each step.")


# The name practice 2's notebooks call. Practice 2 and 3 each check a fixed loop:
# check_fixed_accumulation_loop (2.3) and check_fixed_local_sgd_loop (3.3).
check_fixed_loop = check_fixed_accumulation_loop


@on_one_thread
def compare_with_bigger_batches(loop):
    """Run ``loop`` as check 2.3 does and print what it did beside 2 plain SGD steps on
    batches of 16."""
    expected_weights, _ = reference_run()
    run = loop_run(loop)
    print(f"optimizer steps: {run.steps} (2 plain steps on batches of 16: 2)")
    print("weights equal to those of 2 plain SGD steps on batches of 16:",
          torch.allclose(run.weights, expected_weights, atol=TOLERANCE))
    print("losses returned:",
          len(run.returned) if hasattr(run.returned, "__len__") else run.returned)


# --- 2.4
# --------------------------------------------------------------------------------------

# 2.4: one optimizer step over 40 examples in micro-batches of 16, accumulated 3 at a
# time: 16 + 16 + 8, the last micro-batch half as big. Then one over 24 (16 + 8,
# accumulated 2 at a time): an answer that wrote the first step's count, 40, into its
# code instead of reading num_items_in_batch fails there.
UNEVEN_STEPS = ((40, 3), (24, 2))  # (examples, gradient_accumulation_steps)
UNEVEN_EXAMPLES, UNEVEN_ACCUMULATION = UNEVEN_STEPS[0]
# plain SGD, no clipping: a wrong weighting of the examples shows in the weights
UNEVEN_LEARNING_RATE = 0.5
UNEVEN_ARGUMENTS = dict(
    learning_rate=UNEVEN_LEARNING_RATE,
    optim="sgd",
    lr_scheduler_type="constant",
    # max_grad_norm=0: no clipping, which would hide a wrong scale
    max_grad_norm=0.0,
)

LOSS_FUNCTION_HINTS = [
    ("NoneType", "a value in your function is None. Trainer takes the labels out of "
                 "the batch before the forward "
                 "pass, so outputs.loss is None: compute the cross-entropy from "
                 "outputs.logits and labels."),
    ("num_items_in_batch", "Trainer calls it as compute_loss_func(outputs, labels, "
                           "num_items_in_batch=...)."),
    ("attribute 'backward'", "return the loss as a tensor, not a number: Trainer "
                             "calls backward on it."),
    ("does not require grad", "return the loss as a tensor computed from "
                              "outputs.logits, with its graph "
                              "(no .item(), no .detach())."),
]


def micro_batch_sizes(examples):
    """[16, 16, 8] for 40 examples: the micro-batches Trainer makes of them, in
    order."""
    return [min(MICRO_BATCH_SIZE, examples - start)
            for start in range(0, examples, MICRO_BATCH_SIZE)]


def uneven_run(compute_loss_func, examples, accumulation):
    """One Trainer step over ``examples`` (uneven micro-batches) with
    ``compute_loss_func``: (weights, logged loss)."""
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    trainer = trainer_run(model, training_examples(examples), MICRO_BATCH_SIZE,
                          accumulation, compute_loss_func=compute_loss_func,
                          **UNEVEN_ARGUMENTS)
    return flat_parameters(model).cpu(), logged_losses(trainer)[0]


@functools.lru_cache(maxsize=None)
def uneven_reference(examples):
    """One plain SGD step on all ``examples`` at once: (weights, their mean loss).
    Computed once each."""
    from helpers.data import make_dataloader
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=UNEVEN_LEARNING_RATE)
    batch = next(
        iter(make_dataloader(training_examples(examples), course_tokenizer(), examples))
    )
    loss = model(**batch).loss  # the mean over all the examples
    loss.backward()
    optimizer.step()
    return flat_parameters(model).cpu(), loss.item()


def uneven_probe(loss_function):
    """Call the learner's loss function once as Trainer calls it; Wrong if Trainer could
    not train on its answer."""
    from helpers.data import make_dataloader
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    batch = dict(
        next(
            iter(
                make_dataloader(training_examples(UNEVEN_EXAMPLES), course_tokenizer(),
                                MICRO_BATCH_SIZE)
            )
        )
    )
    labels = batch.pop("labels")  # as Trainer does when there is a compute_loss_func
    with global_random_state_kept():
        outputs = model(**batch)
        answer = call_learner(loss_function, outputs, labels,
                              num_items_in_batch=torch.tensor(UNEVEN_EXAMPLES),
                              name="step_mean_loss", hints=LOSS_FUNCTION_HINTS)
    if answer is None:
        raise Wrong("step_mean_loss returned None: did you forget `return`? Trainer "
                    "trains on the loss it returns.")
    if not isinstance(answer, torch.Tensor):
        raise Wrong(f"step_mean_loss returned {type(answer).__name__} {answer!r:.40}, "
                    "not a tensor. Hint: Trainer "
                    "calls backward on what it returns: return the loss as a tensor "
                    "computed from outputs.logits "
                    "(no .item(), no float()).")
    if answer.numel() != 1:
        raise Wrong("step_mean_loss returned a tensor of shape "
                    f"{tuple(answer.shape)}, not one number. Hint: "
                    "Trainer calls backward on it, which needs one number per "
                    "micro-batch: add up the losses of "
                    "its examples.")
    if not answer.requires_grad:
        raise Wrong("step_mean_loss returned a tensor with no graph, so Trainer "
                    "cannot call backward on it. Hint: "
                    "compute it from outputs.logits, with no .detach() and outside "
                    "torch.no_grad().")


def uneven_mistake(loss_function, examples, accumulation):
    """The hint for a wrong loss function, found by calling it on the step's
    micro-batches (e.g. 16, 16 and 8)."""
    import torch.nn.functional as F

    from helpers.data import make_dataloader
    from helpers.models import build_model

    model = build_model("tiny", seed=0)
    micro_batches = make_dataloader(
        training_examples(examples), course_tokenizer(), MICRO_BATCH_SIZE
    )
    num_items_in_batch = torch.tensor(examples)
    answers, sums, counts = [], [], []
    with torch.no_grad(), global_random_state_kept():
        for batch in micro_batches:
            labels = batch.pop("labels")
            outputs = model(**batch)
            answer = call_learner(loss_function, outputs, labels,
                                  num_items_in_batch=num_items_in_batch,
                                  name="step_mean_loss", hints=LOSS_FUNCTION_HINTS)
            answers.append(float(answer))
            sums.append(F.cross_entropy(outputs.logits, labels, reduction="sum").item())
            counts.append(len(labels))
    means = [total / count for total, count in zip(sums, counts)]
    full_step = MICRO_BATCH_SIZE * accumulation
    heavier = (
        "twice" if counts[0] == 2 * counts[-1] else f"{counts[0] / counts[-1]:g} times"
    )
    candidates = [
        (means, "your loss is each micro-batch's own mean. With a compute_loss_func, "
                "Trainer does not divide by "
                "the accumulation steps (it trusts the function to use "
                "num_items_in_batch), so the "
                f"{accumulation} means were added: the step went about "
                f"{accumulation} times too far."),
        ([mean / accumulation for mean in means],
         f"you averaged the {accumulation} micro-batch means, but the last "
         f"micro-batch has {counts[-1]} "
         f"examples, not {counts[0]}: each of its examples weighed {heavier} as much "
         "as the others. Weigh every "
         "example alike: sum the losses of the micro-batch's examples and divide by "
         "num_items_in_batch."),
        (sums, "you returned the sum of the micro-batch's losses: over the step, "
               f"{examples} times the mean. "
               "Divide it by num_items_in_batch, the examples of the whole "
               "optimizer step."),
        ([total / full_step for total in sums],
         f"you divided by {full_step} = micro-batch size x accumulation steps, but "
         "this step has only "
         f"{examples} examples (the last micro-batch is short): "
         "num_items_in_batch counts them."),
        ([mean / examples for mean in means],
         "you divided the micro-batch's mean, already divided by its own examples, by "
         "num_items_in_batch again: "
         "divide the sum of its examples' losses instead."),
    ]
    for expected, hint in candidates:
        if all(math.isclose(a, e, rel_tol=1e-3) for a, e in zip(answers, expected)):
            return hint
    if all(answer != 0 for answer in answers):
        divisors = [total / answer for total, answer in zip(sums, answers)]
        if all(math.isclose(d, divisors[0], rel_tol=1e-3) for d in divisors):
            return ("you divided each micro-batch's summed loss by "
                    f"{divisors[0]:.4g}, but this step has {examples} "
                    "examples. Divide by num_items_in_batch, which Trainer "
                    "counts for each step.")
    return ("the step should learn from the mean loss of all its examples: each "
            "micro-batch's share is the sum of "
            "its examples' losses divided by num_items_in_batch.")


@checker("2.4")
@on_one_thread
def check_step_mean_loss(step_mean_loss):
    """``step_mean_loss(outputs, labels, num_items_in_batch)``: Trainer's
    compute_loss_func for uneven micro-batches."""
    require_callable(step_mean_loss, "step_mean_loss")
    uneven_probe(step_mean_loss)
    for number, (examples, accumulation) in enumerate(UNEVEN_STEPS):
        expected_weights, expected_loss = uneven_reference(examples)
        weights, logged = call_learner(uneven_run, step_mean_loss, examples,
                                       accumulation,
                                       name="Trainer's step with your step_mean_loss",
                                       hints=LOSS_FUNCTION_HINTS)
        step = (
            "one Trainer step over micro-batches of "
            f"{listed(micro_batch_sizes(examples))}"
            + ("" if number == 0 else " (the check's second step: "
               f"{examples} examples, " f"gradient_accumulation_steps={accumulation})")
        )
        if not torch.allclose(weights, expected_weights, atol=TOLERANCE):
            raise Wrong(
                f"after {step}, the weights differ from one SGD step on all "
                f"{examples} examples at once. "
                "Hint: " + uneven_mistake(step_mean_loss, examples, accumulation)
            )
        if not math.isclose(logged, expected_loss, rel_tol=LOSS_RTOL):
            raise Wrong(f"after {step}, the weights are right, but Trainer logged "
                        f"{logged:.4f} instead of the mean "
                        f"loss {expected_loss:.4f}. Hint: return the loss you train "
                        "on, as a tensor.")
    (first, _), (second, _) = UNEVEN_STEPS
    return (f"a Trainer step over micro-batches of {listed(micro_batch_sizes(first))} "
            "gave the weights of one SGD "
            f"step on all {first} examples at once, and one over "
            f"{listed(micro_batch_sizes(second))} those of one "
            f"on all {second}; Trainer logged their mean losses: every "
            "example weighed alike.")
