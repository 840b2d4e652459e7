"""Checks for notebooks/practice/02_trainer_and_accelerator_practice.ipynb (lesson 02)."""
import math
import tempfile

import torch

from helpers.models import flat_parameters
from helpers.practice.verdicts import (Wrong, call_learner, checker, explaining_warnings, require_callable,
                                      require_done, whole_number)
from helpers.training import LEARNING_RATE, MICRO_BATCH_SIZE, TRAINER_ACCUMULATION, first_logged_losses

# The checks' Trainer and Accelerator use the GPU when there is one, as the lessons do: a Trainer with
# use_cpu=True after the learner's own GPU Accelerator would be refused by Accelerate.
ON_CPU = not torch.cuda.is_available()
TOLERANCE = 1e-5 if ON_CPU else 1e-4  # weights compared on the CPU, after training on either device

ARGUMENT_HINTS = [
    ("evaluation_strategy", "Transformers renamed evaluation_strategy to eval_strategy."),
    ("no_cuda", "Transformers renamed no_cuda to use_cpu."),
    ("tokenizer", "TrainingArguments takes no tokenizer; Trainer takes it as processing_class."),
    ("unexpected keyword", "check the argument's name in TrainingArguments' documentation (help(TrainingArguments))."),
]


def value_of(setting):
    """A TrainingArguments setting as plain text or number."""
    return getattr(setting, "value", setting)  # enums such as IntervalStrategy.EPOCH -> "epoch"


def checkpointing_on(args):
    """Whether these TrainingArguments switch activation checkpointing on, under today's name or the old one."""
    return bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False))


@checker("2.1")
def check_training_arguments(make_training_args):
    """``make_training_args(output_dir)``: evaluation every epoch, lesson 2's batches, checkpointing on."""
    from transformers import TrainingArguments

    require_callable(make_training_args, "make_training_args")
    with explaining_warnings("`gradient_checkpointing` is deprecated") as deprecation_warnings:
        args = call_learner(make_training_args, tempfile.mkdtemp(), name="make_training_args", hints=ARGUMENT_HINTS)
    if not isinstance(args, TrainingArguments):
        raise Wrong(f"make_training_args should return TrainingArguments(...), but returned {type(args).__name__}.")
    problems = []
    if value_of(args.eval_strategy) != "epoch":
        problems.append(f'evaluation runs "{value_of(args.eval_strategy)}", not every epoch (eval_strategy="epoch")')
    if args.per_device_train_batch_size != MICRO_BATCH_SIZE:
        problems.append(f"the micro-batch has {args.per_device_train_batch_size} examples, not {MICRO_BATCH_SIZE} "
                        "(per_device_train_batch_size)")
    if args.gradient_accumulation_steps != TRAINER_ACCUMULATION:
        problems.append(f"{args.gradient_accumulation_steps} micro-batches are accumulated, not {TRAINER_ACCUMULATION} "
                        "(gradient_accumulation_steps)")
    if not checkpointing_on(args):
        problems.append("checkpointing is off (activation_checkpointing=True)")
    if problems:
        raise Wrong("; ".join(problems) + ".")
    note = ""
    if deprecation_warnings:
        note = " Note: gradient_checkpointing is the deprecated name (it warns, and Transformers v6 removes it); prefer activation_checkpointing."
    return (f"evaluation every epoch, micro-batches of {MICRO_BATCH_SIZE}, {TRAINER_ACCUMULATION} of them accumulated "
            f"per optimizer step, activation checkpointing on.{note}")


def examples_seen_in_one_optimizer_step(micro_batch_size, accumulation):
    """Train 1 optimizer step with these batch settings and count the examples the model saw (measured)."""
    from helpers.data import load_tokenized
    from helpers.models import build_model

    tokenized, tokenizer = load_tokenized()
    model = build_model("tiny", seed=0)
    model.accepts_loss_kwargs = False
    seen = []  # rows of every training forward pass
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(len(kwargs["input_ids"])), with_kwargs=True)
    first_logged_losses(model, tokenized["train"].select(range(256)), tokenizer, steps=1,
                        micro_batch_size=micro_batch_size, accumulation=accumulation, use_cpu=ON_CPU)
    return sum(seen)


def optimizer_steps_per_epoch(n_examples, micro_batch_size, accumulation):
    """Trainer's count: micro-batches per epoch over the accumulation steps, a last partial step included."""
    return math.ceil(math.ceil(n_examples / micro_batch_size) / accumulation)


@checker("2.2")
def check_batch_arithmetic(examples_per_optimizer_step, optimizer_steps_per_epoch_answer):
    """The effective batch size and the optimizer steps of one epoch, for lesson 2's micro-batches and accumulation."""
    from helpers.data import load_paraphrase_dataset

    require_done([examples_per_optimizer_step, optimizer_steps_per_epoch_answer], "both answers", "a whole number")
    effective = whole_number(examples_per_optimizer_step, "examples_per_optimizer_step")
    steps = whole_number(optimizer_steps_per_epoch_answer, "optimizer_steps_per_epoch")
    n_examples = load_paraphrase_dataset()["train"].num_rows  # 4000
    measured = examples_seen_in_one_optimizer_step(MICRO_BATCH_SIZE, TRAINER_ACCUMULATION)
    expected_steps = optimizer_steps_per_epoch(n_examples, MICRO_BATCH_SIZE, TRAINER_ACCUMULATION)
    if effective != measured:
        hint = {MICRO_BATCH_SIZE: "that is one micro-batch; one optimizer step accumulates the gradients of "
                                  f"{TRAINER_ACCUMULATION} of them.",
                TRAINER_ACCUMULATION: "that is the number of micro-batches; how many examples does each hold?"}.get(
            effective, "count the micro-batches per optimizer step and the examples in each.")
        raise Wrong(f"one optimizer step used {measured} examples (counted in a real Trainer step), not {effective}. "
                    f"Hint: {hint}")
    if steps != expected_steps:
        micro_batches = math.ceil(n_examples / MICRO_BATCH_SIZE)
        if steps == micro_batches:
            hint = f"that is the number of micro-batches; the optimizer steps once every {TRAINER_ACCUMULATION} of them."
        elif steps == micro_batches // TRAINER_ACCUMULATION:
            hint = (f"{micro_batches} micro-batches do not divide by {TRAINER_ACCUMULATION}: Trainer takes one more, "
                    "smaller step with the micro-batches left over at the end of the epoch.")
        else:
            hint = (f"{n_examples} examples make {micro_batches} micro-batches of {MICRO_BATCH_SIZE}; the optimizer "
                    f"steps every {TRAINER_ACCUMULATION} of them.")
        raise Wrong(f"the effective batch is right, but one epoch of {n_examples} examples takes {expected_steps} "
                    f"optimizer steps, not {steps}. Hint: {hint}")
    return (f"each optimizer step sees {measured} examples ({MICRO_BATCH_SIZE} x {TRAINER_ACCUMULATION}, counted in a "
            f"real Trainer step), and an epoch of "
            f"{n_examples} examples is {expected_steps} optimizer steps. On 2 processes each would see its own "
            f"micro-batches: {2 * measured} examples per step.")


def logged_and_true_loss(prepare_for_trainer):
    """(Trainer's first logged loss, the true mean loss per micro-batch) for one step of lesson 2's batches.

    The model goes through the learner's ``prepare_for_trainer`` before Trainer trains it.
    """
    from helpers.data import load_tokenized, make_dataloader
    from helpers.models import build_model

    tokenized, tokenizer = load_tokenized()
    examples = tokenized["train"].select(range(MICRO_BATCH_SIZE * TRAINER_ACCUMULATION))  # one optimizer step
    model = build_model("tiny", seed=0)
    with torch.no_grad():  # the true loss: the mean of the micro-batches' mean losses, before any step
        losses = [model(**batch).loss.item() for batch in make_dataloader(examples, tokenizer, MICRO_BATCH_SIZE)]
    returned = call_learner(prepare_for_trainer, model, name="prepare_for_trainer")
    model = returned if isinstance(returned, torch.nn.Module) else model
    logged = call_learner(first_logged_losses, model, examples, tokenizer, steps=1, micro_batch_size=MICRO_BATCH_SIZE,
                          accumulation=TRAINER_ACCUMULATION, learning_rate=LEARNING_RATE, use_cpu=ON_CPU,
                          name="Trainer's training of the model prepare_for_trainer prepared")
    return logged[0], sum(losses) / len(losses)


@checker("2.3")
def check_logged_loss_fix(prepare_for_trainer):
    """``prepare_for_trainer(model)``: make Trainer log (and train on) the mean loss under accumulation."""
    require_callable(prepare_for_trainer, "prepare_for_trainer")
    logged, true_mean = logged_and_true_loss(prepare_for_trainer)
    ratio = logged / true_mean
    if abs(ratio - 1) < 0.01:
        return f"Trainer logged {logged:.3f}, the true mean loss is {true_mean:.3f} (about ln 2 = {math.log(2):.3f})."
    if abs(ratio - TRAINER_ACCUMULATION) < 0.05:
        raise Wrong(f"Trainer still logged {logged:.3f}, {TRAINER_ACCUMULATION} x the true mean loss {true_mean:.3f}: "
                    f"it adds up the {TRAINER_ACCUMULATION} micro-batches' losses because it believes the model "
                    "normalises them itself. Hint: Trainer reads an attribute of the model (not of its config) to "
                    "decide; see lesson 2.")
    raise Wrong(f"Trainer logged {logged:.3f}, but the true mean loss is {true_mean:.3f} (ratio {ratio:.2f}). Hint: "
                "change only what Trainer believes about the model's loss; do not rescale the loss yourself.")


def tiny_micro_batches():
    """32 training examples as 4 micro-batches of 8, and the same examples as 2 batches of 16."""
    from helpers.data import load_tokenized, make_dataloader

    tokenized, tokenizer = load_tokenized()
    examples = tokenized["train"].select(range(32))
    return (make_dataloader(examples, tokenizer, batch_size=8),   # 4 micro-batches of 8
            make_dataloader(examples, tokenizer, batch_size=16))  # the same examples as 2 batches of 16


def accumulation_run(loop, gradient_accumulation_steps=2):
    """Run ``loop(accelerator, model, optimizer, dataloader)`` on 4 micro-batches; return (weights, optimizer steps)."""
    from accelerate import Accelerator

    from helpers.models import build_model

    micro_batches, _ = tiny_micro_batches()
    model = build_model("tiny", seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    steps = []
    optimizer.register_step_post_hook(lambda *args: steps.append(1))  # counts the real optimizer steps
    accelerator = Accelerator(gradient_accumulation_steps=gradient_accumulation_steps)
    model, optimizer, micro_batches = accelerator.prepare(model, optimizer, micro_batches)
    loop(accelerator, model, optimizer, micro_batches)
    model = accelerator.unwrap_model(model)
    return flat_parameters(model).cpu(), len(steps)


def reference_weights():
    """Two plain SGD steps on batches of 16: what 4 micro-batches of 8, accumulated 2 by 2, must give."""
    from helpers.models import build_model

    _, big_batches = tiny_micro_batches()
    model = build_model("tiny", seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch in big_batches:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat_parameters(model)


def mistaken_loop(plain_backward=False, no_accumulate=False, no_zero_grad=False):
    """Lesson 2's Accelerate loop with one typical mistake, to name the mistake a learner made."""
    def loop(accelerator, model, optimizer, dataloader):
        import contextlib

        for batch in dataloader:
            with (contextlib.nullcontext() if no_accumulate else accelerator.accumulate(model)):
                loss = model(**batch).loss
                loss.backward() if plain_backward else accelerator.backward(loss)
                optimizer.step()
                if not no_zero_grad:
                    optimizer.zero_grad()
    return loop


LOOP_MISTAKES = {
    "plain_backward": "It behaves as if it called loss.backward(), which adds up the micro-batches' gradients without dividing by the accumulation "
                      "steps, so each step is twice too big. Hint: accelerator.backward(loss) divides for you.",
    "no_accumulate": "Without `with accelerator.accumulate(model):` around the step, the optimizer steps after every "
                     "micro-batch. Hint: put forward, backward, step and zero_grad inside that block.",
    "no_zero_grad": "The gradients are never reset, so every step also adds all the earlier ones. Hint: call "
                    "optimizer.zero_grad() after optimizer.step(), inside the accumulate block.",
}


@checker("2.4")
def check_accumulation_loop(train_with_accumulation):
    """``train_with_accumulation(accelerator, model, optimizer, dataloader)``: one pass, accumulating as the Accelerator says."""
    require_callable(train_with_accumulation, "train_with_accumulation")
    expected = reference_weights()
    weights, steps = call_learner(lambda: accumulation_run(train_with_accumulation), name="train_with_accumulation")
    if steps == 2 and torch.allclose(weights, expected, atol=TOLERANCE):
        return ("4 micro-batches of 8 gave 2 optimizer steps and the same weights as 2 steps on batches of 16: "
                "accumulation is a bigger batch.")
    for mistake, explanation in LOOP_MISTAKES.items():
        mistaken_weights, _ = accumulation_run(mistaken_loop(**{mistake: True}))
        if torch.allclose(weights, mistaken_weights, atol=TOLERANCE):
            raise Wrong(f"the optimizer stepped {steps} times for 4 micro-batches. {explanation}")
    if steps == 0:
        raise Wrong("the optimizer never stepped. Hint: loop over the dataloader and call optimizer.step().")
    raise Wrong(f"the optimizer stepped {steps} times for 4 micro-batches (expected 2), and the weights differ from "
                "2 steps on batches of 16. Hint: follow lesson 2's Accelerate loop line by line.")
