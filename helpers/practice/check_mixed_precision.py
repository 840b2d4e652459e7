"""Checks for notebooks/practice/05_mixed_precision_practice.ipynb (lesson 05).

Each check runs the learner's answer and the intended answer the same way and compares
what they did: the dtypes autocast really ran (counted), bytes per parameter after a
real optimizer step (weighed), the weights and the loss scale after a real float16 loop,
and the loss of a forward pass prepared by the learner's Trainer arguments and
Accelerator. The hints explain a mismatch from the same measurements.
"""
import functools
import math
import tempfile

import torch

from helpers.mixed_precision import DtypeCounter, dtype_name
from helpers.optimizer_state import optimizer_state_size
from helpers.practice.fixtures import (
    DEVICE,
    ON_CPU,
    fixed_batches,
    fresh_accelerate_state,
    tiny_model,
    training_examples,
)
from helpers.practice.verdicts import (
    Wrong,
    call_learner,
    checker,
    on_one_thread,
    require_callable,
    require_done,
)
from helpers.random_state import global_random_state_kept

# --- 5.1: which operations run in bfloat16
# ----------------------------------------------------------------

class SmallNet(torch.nn.Module):
    """Exercise 5.1's model: embedding -> Linear -> GELU -> LayerNorm -> Linear ->
    softmax, an MSE loss."""

    def __init__(self, vocabulary=50, width=16, hidden=64, classes=4):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocabulary, width)
        self.up = torch.nn.Linear(width, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.down = torch.nn.Linear(hidden, classes)

    def forward(self, tokens, targets):
        h = self.embedding(tokens)  # (batch, width)
        h = torch.nn.functional.gelu(self.up(h))  # (batch, hidden)
        h = self.norm(h)
        probabilities = self.down(h).softmax(dim=-1)  # (batch, classes)
        return torch.nn.functional.mse_loss(probabilities, targets)


OPERATIONS_5_1 = ["embedding", "addmm", "gelu", "native_layer_norm", "_softmax",
                  "mse_loss"]
# operation -> why it runs in the dtype it runs in, under CPU autocast to bfloat16
WHY_5_1 = {
    "embedding": "embedding is on no autocast list, and its weight is float32: "
                 "it stays float32",
    "addmm": "a Linear layer is exactly what autocast runs in bfloat16 (linear and "
             "addmm are on its "
             "lower-precision list)",
    "gelu": "gelu is on no autocast list: it runs in the dtype of its input, the "
            "bfloat16 output of a Linear",
    "native_layer_norm": "CPU autocast puts layer norm on no list, so it follows its "
                         "input: here gelu's bfloat16 "
                         "output. In DistilBERT it stayed float32 only because its "
                         "input was the float32 "
                         "residual sum",
    "_softmax": "softmax is on no CPU autocast list: it follows its input, the "
                "bfloat16 output of a Linear",
    "mse_loss": "losses are on the CPU's float32 list: autocast casts their inputs up "
                "to float32 first",
}


def measured_dtypes_5_1():
    """{operation: the dtype its output had} for one SmallNet forward under CPU bfloat16
    autocast."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SmallNet()
        tokens = torch.randint(0, 50, (8,))
        targets = torch.rand(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16), DtypeCounter() as counter:
        model(tokens, targets)
    return {op: dtype for (op, dtype) in counter.counts if op in OPERATIONS_5_1}


def _as_dtype_name(value):
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    return value


@checker("5.1")
@on_one_thread
def check_autocast_prediction(prediction):
    """``prediction``: {operation: "bfloat16" or "float32"} for SmallNet's forward under
    CPU autocast."""
    require_done(prediction, "prediction", '"bfloat16" or "float32" for each operation')
    if not isinstance(prediction, dict):
        raise Wrong("prediction should be a dict from operation name to dtype "
                    "name, but it is a "
                    f"{type(prediction).__name__}.")
    missing = [op for op in OPERATIONS_5_1 if op not in prediction]
    if missing:
        raise Wrong(f"prediction lacks {', '.join(repr(op) for op in missing)}; give "
                    "a dtype for each of "
                    f"{', '.join(OPERATIONS_5_1)}.")
    answers = {op: _as_dtype_name(prediction[op]) for op in OPERATIONS_5_1}
    odd = {op: value for op, value in answers.items()
           if value not in ("bfloat16", "float32")}
    if odd:
        raise Wrong("write each dtype as \"bfloat16\" or \"float32\" (or "
                    "torch.bfloat16, torch.float32); "
                    f"got {odd}.")
    measured = measured_dtypes_5_1()
    wrong = [op for op in OPERATIONS_5_1 if answers[op] != measured[op]]
    if wrong:
        raise Wrong(" ".join(f"{op} ran in {measured[op]}, not "
                             f"{answers[op]}: {WHY_5_1[op]}." for op in wrong))
    in_bf16 = [op for op in OPERATIONS_5_1 if measured[op] == "bfloat16"]
    return (
        f"counted under CPU autocast: {', '.join(in_bf16)} in bfloat16; "
        f"{', '.join(op for op in OPERATIONS_5_1 if op not in in_bf16)} in float32."
    )


# --- 5.2: bf16 in Trainer and in Accelerator
# -------------------------------------------------------------------

TRAINER_HINTS = [
    ("doesn't support bf16", "on a machine without a bfloat16 GPU, TrainingArguments "
                             "needs use_cpu=True beside "
                             "bf16=True."),
    ("At most one of fp16 and bf16", "choose one: bf16=True (fp16 needs a GradScaler, "
                                     "and on a CPU Accelerate runs "
                                      "it in float32)."),
    ("unexpected keyword", "check the argument's name in TrainingArguments "
                           "(help(TrainingArguments)): bf16=True."),
]
ACCELERATOR_HINTS = [
    ("Unknown mixed_precision mode", "Accelerate names it mixed_precision=\"bf16\" "
                                     "(one of 'no', 'fp16', 'bf16', "
                                     "'fp8')."),
    ("unexpected keyword", "the argument is Accelerator(mixed_precision=\"bf16\")."),
]


def _first_forward_loss(prepared_model, batch):
    with torch.no_grad():
        return prepared_model(**batch).loss.item()


def trainer_first_loss(make_training_args):
    """(the first logged training loss, how many addmm ran in bfloat16, Trainer's mixed
    precision)."""
    from transformers import DataCollatorWithPadding, Trainer
    from transformers.trainer_callback import PrinterCallback

    examples, tokenizer = training_examples(16)
    # save_strategy="no": nothing is written, and the folder goes when the check ends
    # (as in practice 2's checks)
    with (tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as output_dir,
          fresh_accelerate_state(), global_random_state_kept()):
        args = make_training_args(output_dir)
        # one step, 16 examples
        args.max_steps, args.per_device_train_batch_size, args.logging_steps = 1, 16, 1
        args.disable_tqdm, args.report_to, args.save_strategy = True, [], "no"
        trainer = Trainer(model=tiny_model(), args=args, train_dataset=examples,
                          data_collator=DataCollatorWithPadding(tokenizer))
        trainer.remove_callback(PrinterCallback)
        with DtypeCounter() as counter:
            trainer.train()
        # read before the state is put back
        precision = trainer.accelerator.mixed_precision
    loss = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    return loss, counter.counts[("addmm", "bfloat16")], precision


def intended_training_args(output_dir):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir, bf16=True, use_cpu=ON_CPU, report_to="none"
    )


def accelerator_first_loss(make_accelerator):
    """(the loss of one forward through a model the learner's Accelerator prepared, its
    logits' dtype, bf16 addmm)."""
    from accelerate import Accelerator

    batch = fixed_batches(16, 1)[0]
    with fresh_accelerate_state():
        accelerator = make_accelerator()
        if not isinstance(accelerator, Accelerator):
            raise Wrong("make_accelerator should return "
                        "Accelerator(...), but returned "
                        f"{type(accelerator).__name__}.")
        model = accelerator.prepare(tiny_model())
        with DtypeCounter() as counter, torch.no_grad():
            outputs = model(**batch)
    return (outputs.loss.item(), outputs.logits.dtype,
            counter.counts[("addmm", "bfloat16")])


@functools.lru_cache(maxsize=None)
def intended_5_2():
    from accelerate import Accelerator

    trainer = trainer_first_loss(intended_training_args)
    accelerator = accelerator_first_loss(
        lambda: Accelerator(mixed_precision="bf16", cpu=ON_CPU)
    )
    return trainer, accelerator


@checker("5.2")
@on_one_thread
def check_bf16_setups(make_training_args, make_accelerator):
    """``make_training_args(output_dir)`` and ``make_accelerator()``: bfloat16 mixed
    precision in both."""
    require_callable(make_training_args, "make_training_args")
    require_callable(make_accelerator, "make_accelerator")
    from transformers import TrainingArguments

    (reference_loss, _, _), (reference_forward, _, _) = intended_5_2()
    # TrainingArguments resets Accelerate's state: the learner's is put back
    with (tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as output_dir,
          fresh_accelerate_state()):
        args = call_learner(make_training_args, output_dir, name="make_training_args",
                            hints=TRAINER_HINTS)
    if not isinstance(args, TrainingArguments):
        raise Wrong("make_training_args should return TrainingArguments(...), but "
                    f"returned {type(args).__name__}.")
    loss, bf16_matmuls, precision = call_learner(trainer_first_loss, make_training_args,
                                                 name="Trainer with your arguments",
                                                 hints=TRAINER_HINTS)
    if bf16_matmuls == 0:
        if getattr(args, "fp16", False):
            raise Wrong("with fp16=True nothing ran in 16 bits: on a CPU, Accelerate "
                        "1.x enables neither float16 "
                        "autocast nor its GradScaler (its float16 branch needs a "
                        "device other than the CPU), and "
                        "trains in float32. Hint: bf16=True.")
        if getattr(args, "bf16_full_eval", False):
            raise Wrong("bf16_full_eval converts the model to bfloat16 for evaluation "
                        "only; training ran in "
                        "float32. Hint: bf16=True turns on autocast for training.")
        raise Wrong(f"Trainer trained in float32 (mixed precision {precision!r}): no "
                    "matrix multiply ran in "
                    "bfloat16. Hint: TrainingArguments(..., bf16=True).")
    if abs(loss - reference_loss) > 1e-6:
        raise Wrong(f"Trainer's first loss was {loss:.6f}, the intended arguments' "
                    f"{reference_loss:.6f}. Hint: "
                    "bf16=True (and use_cpu=True on a CPU), nothing else that changes "
                    "the computation.")
    forward_loss, logits_dtype, accelerator_matmuls = call_learner(
        accelerator_first_loss,
        make_accelerator,
        name="make_accelerator",
        hints=ACCELERATOR_HINTS,
    )
    if accelerator_matmuls == 0:
        raise Wrong("the Accelerator's model ran in float32: no matrix multiply in "
                    "bfloat16 (on a CPU, "
                    "mixed_precision=\"fp16\" does that too). Hint: "
                    "Accelerator(mixed_precision=\"bf16\").")
    if logits_dtype != torch.float32 or abs(forward_loss - reference_forward) > 1e-6:
        raise Wrong(
            f"the prepared model's loss was {forward_loss:.6f} (logits "
            f"{logits_dtype}); "
            "Accelerator(mixed_precision=\"bf16\")'s is "
            f"{reference_forward:.6f}, with float32 logits. "
            "Hint: prepare the model with accelerator.prepare and nothing else."
        )
    return ("Trainer ran its matrix multiplies in bfloat16 and logged the loss that "
            "bf16=True gives; the "
            "Accelerator's model gave the loss of mixed_precision=\"bf16\", with its "
            "logits converted back to "
            "float32 (convert_outputs_to_fp32).")


# --- 5.3: bytes per parameter of two recipes
# ---------------------------------------------------------------

def _held_bytes_per_parameter(model, optimizer):
    """(weights + gradients + optimizer state) / parameters, after a step: what a model
    holds between steps."""
    parameters = list(model.parameters())
    n = sum(p.numel() for p in parameters)
    weights = sum(p.numel() * p.element_size() for p in parameters)
    gradients = sum(
        p.grad.numel() * p.grad.element_size() for p in parameters if p.grad is not None
    )
    return (weights + gradients + optimizer_state_size(optimizer)[1]) / n


@functools.lru_cache(maxsize=None)
def measured_recipes():
    """{recipe: bytes per parameter held after one real step} for exercise 5.3's two
    recipes."""
    from accelerate import Accelerator

    batch = fixed_batches(8, 1)[0]
    with global_random_state_kept():
        # the whole model in bfloat16, no autocast
        model = tiny_model().to(torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(**batch).loss.backward()
        optimizer.step()
        pure = _held_bytes_per_parameter(model, optimizer)
        with fresh_accelerate_state():
            accelerator = Accelerator(mixed_precision="bf16", cpu=ON_CPU)
            model = tiny_model()
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
            prepared, optimizer = accelerator.prepare(model, optimizer)
            accelerator.backward(prepared(**batch).loss)
            optimizer.step()
            accelerate_sgd = _held_bytes_per_parameter(model, optimizer)
    return {"pure_bf16_adamw": pure, "accelerate_bf16_sgd_momentum": accelerate_sgd}


HINTS_5_3 = {
    "pure_bf16_adamw": {
        16: "that is float32 training's 4 + 4 + 8. Here the model itself is bfloat16: "
            "2-byte weights and 2-byte "
            "gradients, and torch's AdamW keeps its two moments in the dtype of "
            "each parameter.",
        18: "that is ML Engineering's 6 + 8 + 4, for autocast with float32 master "
            "weights. Here nothing is float32: "
            "the model was converted with .to(torch.bfloat16).",
        12: "that counts AdamW's two moments as float32 (8 bytes); torch's AdamW "
            "makes them like the parameter "
            "(zeros_like), so in bfloat16: 2 + 2.",
        6: "that counts the weights and AdamW's moments but not the gradient: "
           "backward leaves a bfloat16 gradient "
           "of 2 bytes beside every weight.",
        4: "that counts weights and gradients only; AdamW keeps two moments per "
           "parameter as well.",
    },
    "accelerate_bf16_sgd_momentum": {
        16: "that is AdamW's state (8 bytes); SGD with momentum keeps one buffer per "
            "parameter, 4 bytes in float32.",
        8: "that leaves out the momentum buffer: SGD with momentum keeps one float32 "
           "buffer per parameter.",
        10: "that counts the weights as bfloat16; Accelerate's bf16 keeps the "
            "weights, and so their gradients and "
            "the momentum, in float32: the bfloat16 copies exist only during "
            "forward and backward.",
        14: "that adds a 2-byte half-precision copy of every weight, as ML "
            "Engineering's 6 bytes do; with "
            "Accelerate's autocast the copies exist only during forward and backward, "
            "not between steps.",
        18: "that is ML Engineering's AdamW formula; here the optimizer is SGD with "
            "momentum, and Accelerate keeps "
            "no bfloat16 copy between steps.",
    },
}
NAMES_5_3 = {"pure_bf16_adamw": "pure_bf16_adamw_bytes",
             "accelerate_bf16_sgd_momentum": "accelerate_bf16_sgd_bytes"}


@checker("5.3")
@on_one_thread
def check_bytes_per_parameter(pure_bf16_adamw_bytes, accelerate_bf16_sgd_bytes):
    """Bytes per parameter held between steps by two recipes, compared with one real
    step of each."""
    answers = {"pure_bf16_adamw": pure_bf16_adamw_bytes,
               "accelerate_bf16_sgd_momentum": accelerate_bf16_sgd_bytes}
    require_done(list(answers.values()), "both answers", "a number of bytes per "
                                                         "parameter")
    for key, value in answers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Wrong(f"{NAMES_5_3[key]} should be a number of bytes per parameter, "
                        f"but it is {value!r}.")
    measured = measured_recipes()
    problems = []
    for key, value in answers.items():
        # the step counters add a few bytes per tensor
        if abs(value - measured[key]) <= 0.01:
            continue
        hint = HINTS_5_3[key].get(round(value), "count the bytes of a weight, of its "
                                                "gradient and of the "
                                                "optimizer's state for one parameter, "
                                                "in the dtypes the recipe keeps.")
        problems.append(f"{NAMES_5_3[key]} = {value:g}, but a real step held "
                        f"{measured[key]:.3f} bytes per "
                        f"parameter. Hint: {hint}")
    if problems:
        raise Wrong(" ".join(problems))
    return (f"one real step of each held {measured['pure_bf16_adamw']:.3f} and "
            f"{measured['accelerate_bf16_sgd_momentum']:.3f} bytes per parameter "
            "(AdamW's step counters are the "
            "last digits). A bfloat16 model halves parameter memory, but loses small "
            "updates (lesson 5); "
            "Accelerate's bf16 keeps float32's bytes.")


# --- 5.4: a float16 loop with a GradScaler, and gradient clipping
# ----------------------------------------

# high on purpose: the first steps overflow and must be skipped
INIT_SCALE_5_4 = 2.0**20
STEPS_5_4, BATCH_5_4, MAX_GRAD_NORM_5_4 = 8, 8, 1.0


def intended_float16_loop(model, optimizer, scaler, batches, max_grad_norm):
    """The intended answer of exercise 5.4."""
    device_type = next(model.parameters()).device.type
    for batch in batches:
        with torch.autocast(device_type, dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # the gradients' true size, for clipping
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def mistaken_float16_loop(no_scale=False, clip_scaled=False, no_clip=False,
                          no_update=False, no_zero_grad=False, double_step=False,
                          plain_step=False):
    """Exercise 5.4's loop with one typical mistake, to name the mistake a learner
    made."""
    def loop(model, optimizer, scaler, batches, max_grad_norm):
        device_type = next(model.parameters()).device.type
        for batch in batches:
            with torch.autocast(device_type, dtype=torch.float16):
                loss = model(**batch).loss
            (loss if no_scale else scaler.scale(loss)).backward()
            if not clip_scaled and not plain_step:
                scaler.unscale_(optimizer)
            if not no_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            if plain_step:
                optimizer.step()
            else:
                scaler.step(optimizer)
                if double_step:
                    optimizer.step()
                if not no_update:
                    scaler.update()
            if not no_zero_grad:
                optimizer.zero_grad()
    return loop


MISTAKES_5_4 = {
    "clip_scaled": "you clipped the scaled gradients: their norm is the true norm "
    "times the scale, so clipping "
    "shrank them to a norm of 1 before scaler.step divided them by the "
    "scale once more. Hint: "
    "scaler.unscale_(optimizer) before clip_grad_norm_.",
    "no_clip": "the gradients were never clipped to max_grad_norm. Hint: after "
    "scaler.unscale_(optimizer), "
    "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).",
    "no_scale": "backward ran on the unscaled loss, so float16 gradients underflow as "
    "before, and scaler.unscale_ "
    "divided them by the scale anyway. Hint: scaler.scale(loss).backward().",
    "no_update": "the scale never changed, so every step overflowed and was skipped: "
    "the weights never moved. "
    "Hint: call scaler.update() after scaler.step(optimizer), every step.",
    "no_zero_grad": "the gradients of each step were added to the previous ones. "
    "Hint: optimizer.zero_grad() "
    "after each step.",
    # optimizer.step() instead of scaler.step(optimizer), or beside it: the same NaN
    # weights, the same message
    "plain_step": "your optimizer.step() stepped on gradients that had overflowed, so "
    "the weights are NaN. "
    "scaler.step(optimizer) steps only when the gradients are finite, "
    "and skips the step otherwise; "
    "an optimizer.step() of your own, instead of it or beside it, steps "
    "anyway. Hint: call only "
    "scaler.step(optimizer).",
}


def run_float16_loop(loop):
    """(final weights, optimizer steps taken, final scale) of ``loop``, from the same
    start on the same batches."""
    from helpers.models import flat_parameters

    batches = fixed_batches(BATCH_5_4, STEPS_5_4)
    with global_random_state_kept():
        model = tiny_model()
        # SGD: a wrong gradient size shows in the weights
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        steps = []
        optimizer.register_step_post_hook(lambda *args: steps.append(1))
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=INIT_SCALE_5_4)
        loop(model, optimizer, scaler, batches, MAX_GRAD_NORM_5_4)
    return flat_parameters(model).cpu(), len(steps), scaler.get_scale()


@functools.lru_cache(maxsize=None)
def intended_5_4():
    return run_float16_loop(intended_float16_loop)


def _same(a, b):
    """Equal weights up to float rounding; inf and NaN must sit in the same places."""
    return (a.shape == b.shape
            and torch.allclose(a, b, rtol=1e-5, atol=1e-7, equal_nan=True)
            and torch.equal(torch.isinf(a), torch.isinf(b)))


@checker("5.4")
@on_one_thread
def check_float16_loop(train_float16):
    """``train_float16(model, optimizer, scaler, batches, max_grad_norm)``: float16 with
    a GradScaler, clipped."""
    require_callable(train_float16, "train_float16")
    hints = [("_scale is None", "the scaler never scaled a loss, so it has nothing to "
                                "unscale: backward on "
                                "scaler.scale(loss), not on the loss."),
             ("No inf checks were recorded", "scaler.update() needs "
                                             "scaler.step(optimizer) "
                                             "first, in the same "
                                             "step: scaler.step records whether the "
                                             "gradients overflowed."),
             ("is being called after step", "call scaler.update() after "
                                            "scaler.step(optimizer), every step: it "
                                            "readies the scaler for the next step and "
                                            "adjusts the scale."),
             ("unscale_() has already been called", "call scaler.unscale_(optimizer) "
                                                    "once per step, before "
                                                    "clipping; scaler.step does "
                                                    "not unscale twice.")]
    weights, steps, scale = call_learner(
        run_float16_loop, train_float16, name="train_float16", hints=hints
    )
    reference_weights, reference_steps, reference_scale = intended_5_4()
    if (torch.isfinite(weights).all() and _same(weights, reference_weights)
        and steps == reference_steps):
        return ("the first steps overflowed and were skipped while the "
                "scale fell from "
                f"2^{round(math.log2(INIT_SCALE_5_4))}; the others trained on clipped "
                "gradients, and the weights "
                "match the intended loop's.")
    for mistake, explanation in MISTAKES_5_4.items():
        try:
            variant_weights, variant_steps, _ = run_float16_loop(
                mistaken_float16_loop(**{mistake: True})
            )
        # a mistake the scaler stops with an error: the hints name those
        except (AssertionError, RuntimeError):
            continue
        if _same(weights, variant_weights) and steps == variant_steps:
            raise Wrong(explanation)
    if not torch.isfinite(weights).all():
        raise Wrong("some weights are inf or NaN: a step ran on gradients that "
                    "overflowed. Hint: step with "
                    "scaler.step(optimizer), which skips such steps.")
    raise Wrong(f"the optimizer stepped {steps} times (the intended loop: "
                f"{reference_steps}) and the weights differ "
                "from the intended loop's. Hint: per batch, "
                "scaler.scale(loss).backward(), "
                "scaler.unscale_(optimizer), clip_grad_norm_, scaler.step(optimizer), "
                "scaler.update(), "
                "optimizer.zero_grad().")
