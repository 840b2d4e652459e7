"""Checks for notebooks/practice/05_mixed_precision_practice.ipynb (lesson 05), on the
practice core: the dtypes autocast ran, a Trainer step and an Accelerator's forward
pass, bytes held after a real step, the weights after a real float16 loop."""
import functools
import math
import textwrap

import torch

from helpers.mixed_precision import DtypeCounter, dtype_name
from helpers.optimizer_state import optimizer_state_size
from helpers.practice import core, fixtures
from helpers.practice.core import Wrong
from helpers.practice.fixtures import args_with

# --- 5.1: which operations run in bfloat16 ----------------------------------------


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


# the intended prediction, as a learner writes it; the check measures the truth
AUTOCAST_DTYPES = {"embedding": "float32", "addmm": "bfloat16", "gelu": "bfloat16",
                   "native_layer_norm": "bfloat16", "_softmax": "bfloat16",
                   "mse_loss": "float32"}
# operation -> why it runs in the dtype it runs in, under CPU autocast to bfloat16
WHY_5_1 = {
    "embedding": "it is on no autocast list, and its weight is float32",
    "addmm": "a Linear's matmul is on autocast's lower-precision list",
    "gelu": "it is on no autocast list: it follows its input, a Linear's bfloat16 "
            "output",
    "native_layer_norm": "on the CPU it is on no list: it follows its input, gelu's "
                         "bfloat16 output (in DistilBERT, a float32 residual sum)",
    "_softmax": "it is on no CPU autocast list: it follows its input, a Linear's "
                "bfloat16 output",
    "mse_loss": "losses are on the CPU's float32 list: their inputs are cast up",
}


@functools.cache
def measured_dtypes_5_1():
    """{operation: its output's dtype} for one SmallNet forward under CPU autocast."""
    torch.manual_seed(0)  # check() puts the learner's random state back
    model, tokens, targets = SmallNet(), torch.randint(0, 50, (8,)), torch.rand(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16), DtypeCounter() as counter:
        model(tokens, targets)
    return {op: dtype for (op, dtype) in counter.counts if op in AUTOCAST_DTYPES}


def mispredicted(prediction, config):
    """(operation, predicted dtype) for each operation predicted wrong."""
    if not isinstance(prediction, dict):
        raise Wrong("prediction should be a dict from operation name to dtype name, "
                    f"but it is a {type(prediction).__name__}.")
    missing = [repr(op) for op in AUTOCAST_DTYPES if op not in prediction]
    if missing:
        raise Wrong(f"prediction lacks {', '.join(missing)}; give a dtype for each of "
                    f"{', '.join(AUTOCAST_DTYPES)}.")
    named = {op: dtype_name(value) if isinstance(value, torch.dtype) else value
             for op, value in prediction.items() if op in AUTOCAST_DTYPES}
    odd = {op: value for op, value in named.items()
           if value not in ("bfloat16", "float32")}
    if odd:
        raise Wrong('write each dtype as "bfloat16" or "float32" (or torch.bfloat16, '
                    f"torch.float32); got {odd}.")
    measured = measured_dtypes_5_1()
    return tuple((op, named[op]) for op in AUTOCAST_DTYPES if named[op] != measured[op])


def why_mispredicted(wrong, *_):
    return " ".join(f"{op} ran in {measured_dtypes_5_1()[op]}, not {dtype}: "
                    f"{WHY_5_1[op]}." for op, dtype in wrong)


def flipped(op):
    other = {"bfloat16": "float32", "float32": "bfloat16"}[AUTOCAST_DTYPES[op]]
    return {**AUTOCAST_DTYPES, op: other}


PREDICTION = core.Exercise(
    "5.1", measure=mispredicted, intended=AUTOCAST_DTYPES, name="prediction",
    mistakes=[(f"{op} ran in {AUTOCAST_DTYPES[op]}, not {flipped(op)[op]}: "
               f"{WHY_5_1[op]}.", flipped(op)) for op in AUTOCAST_DTYPES],
    describe=why_mispredicted,
    correct=lambda got, config: "counted under CPU autocast: " + "; ".join(
        f"{', '.join(op for op, d in measured_dtypes_5_1().items() if d == dtype)} "
        f"in {dtype}" for dtype in ("bfloat16", "float32")) + ".")


@core.checker(PREDICTION)
def check_autocast_prediction(prediction):
    """``prediction``: {operation: "bfloat16" or "float32"} under CPU autocast."""


# --- 5.2: bf16 in Trainer and in Accelerator ----------------------------------------

def matmul_dtypes(counter):  # the dtypes the matrix multiplies ran in
    return tuple(sorted(dtype for op, dtype in counter.counts if op == "addmm"))


def bf16_setups_run(answer, config):
    """(matmul dtypes, loss) of one Trainer step with the learner's arguments and of
    one forward pass of a model their Accelerator prepared (with the logits' dtype)."""
    from accelerate import Accelerator

    make_training_args, make_accelerator = answer
    fixtures.learners_arguments(make_training_args)  # a form problem, said first
    with DtypeCounter() as counter:
        trainer = core.learner(fixtures.trainer_run, 8, 8, make_args=make_training_args)
    loss, batch = fixtures.logged_losses(trainer)[0], fixtures.fixed_batches(8, 1)[0]
    with fixtures.fresh_accelerate_state():
        accelerator = core.returned(core.learner(make_accelerator), Accelerator,
                                    "make_accelerator")
        model = core.learner(accelerator.prepare, fixtures.tiny_model())
        with DtypeCounter() as forward, torch.no_grad():
            outputs = model(**batch)
    return {"trainer": (matmul_dtypes(counter), loss),
            "accelerator": (matmul_dtypes(forward), dtype_name(outputs.logits.dtype),
                            outputs.loss.item())}


def accelerator_with(**settings):  # make_accelerator as a learner writes it
    from accelerate import Accelerator

    return lambda: Accelerator(**settings)


SAME_RUN = core.close(rel=1e-5)  # the same computation; a float32 one differs by ~1e-3


BF16_ARGS = args_with(bf16=True, use_cpu=fixtures.ON_CPU)
BF16_ACCELERATOR = accelerator_with(mixed_precision="bf16")
BF16_SETUPS = core.Exercise(
    "5.2", measure=bf16_setups_run,
    intended=(BF16_ARGS, BF16_ACCELERATOR),
    name="make_training_args and make_accelerator", same=SAME_RUN,
    mistakes=[
        ("Trainer trained in float32 (on a CPU, so does fp16=True). Hint: "
         "TrainingArguments(..., bf16=True).",
         (args_with(use_cpu=fixtures.ON_CPU), BF16_ACCELERATOR)),
        ("the Accelerator's model ran in float32 (on a CPU, so does \"fp16\"). Hint: "
         'Accelerator(mixed_precision="bf16").', (BF16_ARGS, accelerator_with())),
        ('Accelerate names it mixed_precision="bf16".',
         (BF16_ARGS, accelerator_with(mixed_precision="bfloat16"))),
        *[("without a bfloat16 GPU, TrainingArguments needs use_cpu=True beside "
           "bf16=True.", (args_with(bf16=True), BF16_ACCELERATOR))] * fixtures.ON_CPU],
    describe='bf16=True and Accelerator(mixed_precision="bf16"), nothing else that '
    "changes the computation.",
    correct="Trainer ran its matrix multiplies in bfloat16, with bf16=True's loss; the "
    "Accelerator's model gave mixed_precision=\"bf16\"'s loss, its logits converted "
    "back to float32 (convert_outputs_to_fp32).")


@core.checker(BF16_SETUPS)
def check_bf16_setups(make_training_args, make_accelerator):
    """``make_training_args(output_dir)`` and ``make_accelerator()``: bfloat16 mixed
    precision in both."""


# --- 5.3: bytes per parameter of two recipes ----------------------------------------

def held_bytes_per_parameter(model, optimizer):
    """(weights + gradients + optimizer state) / parameters, held between steps."""
    parameters = list(model.parameters())
    held = sum(t.numel() * t.element_size() for p in parameters
               for t in (p, p.grad) if t is not None)
    return (held + optimizer_state_size(optimizer)[1]) / sum(p.numel()
                                                             for p in parameters)


@functools.cache
def measured_recipes():
    """Bytes per parameter held after one real step of pure bfloat16 AdamW and of
    Accelerate's bf16 with momentum SGD."""
    from accelerate import Accelerator

    batch = fixtures.fixed_batches(8, 1)[0]
    model = fixtures.tiny_model().to(torch.bfloat16)  # all bfloat16, no autocast
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(**batch).loss.backward()
    optimizer.step()
    pure = held_bytes_per_parameter(model, optimizer)
    with fixtures.fresh_accelerate_state():
        accelerator = Accelerator(mixed_precision="bf16", cpu=fixtures.ON_CPU)
        model = fixtures.tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        prepared, optimizer = accelerator.prepare(model, optimizer)
        accelerator.backward(prepared(**batch).loss)
        optimizer.step()
        return pure, held_bytes_per_parameter(model, optimizer)


BYTES_NAMES = ("pure_bf16_adamw_bytes", "accelerate_bf16_sgd_bytes")
RIGHT_BYTES = (2 + 2 + 2 + 2, 4 + 4 + 4)  # the intended answer, as a learner counts
WRONG_BYTES = [  # (which answer, a wrong count, what it counted)
    (0, 4 + 4 + 8, "that is float32 training's 4 + 4 + 8; here the model is "
     "bfloat16, and AdamW's moments take the parameter's dtype."),
    (0, 6 + 8 + 4, "that is ML Engineering's 6 + 8 + 4, with float32 master weights; "
     "here nothing is float32 (.to(torch.bfloat16))."),
    (0, 2 + 2 + 8, "AdamW's two moments are zeros_like(param): bfloat16, 2 + 2."),
    (0, 2 + 2 + 2, "that leaves out the 2-byte bfloat16 gradient of each weight."),
    (0, 2 + 2, "AdamW keeps two moments per parameter besides weight and gradient."),
    (1, 4 + 4 + 8, "that is AdamW's state; SGD with momentum keeps one float32 "
     "buffer, 4 bytes."),
    (1, 4 + 4, "that leaves out SGD's float32 momentum buffer."),
    (1, 2 + 4 + 4, "Accelerate's bf16 keeps weights, gradients and momentum in "
     "float32; its bfloat16 copies live only in forward and backward."),
    (1, 4 + 2 + 4 + 4, "Accelerate's autocast keeps no half-precision copy between "
     "steps (ML Engineering's 6 bytes do)."),
    (1, 6 + 8 + 4, "that is ML Engineering's AdamW formula; here: SGD with momentum, "
     "no bfloat16 copy between steps."),
]


def bytes_or_measured(answer, config):
    """Each answer, or "as measured" within a tenth of a byte of the real step: AdamW's
    step counters add 0.001 bytes; the nearest mistake is 2 bytes away."""
    numbers = map(core.as_number, answer, BYTES_NAMES)
    return tuple("as measured" if abs(number - held) < 0.1 else number
                 for number, held in zip(numbers, measured_recipes()))


def describe_bytes(got, expected, config):
    whys = {(which, wrong): why for which, wrong, why in WRONG_BYTES}
    return " ".join(
        f"{BYTES_NAMES[which]} = {number:g}, but a real step held {held:.3f} bytes per "
        "parameter. Hint: " + whys.get((which, number), "add a weight's bytes, its "
                                       "gradient's and the optimizer's state's.")
        for which, (number, held) in enumerate(zip(got, measured_recipes()))
        if number != "as measured")


BYTES = core.Exercise(
    "5.3", measure=bytes_or_measured, intended=RIGHT_BYTES, describe=describe_bytes,
    name="pure_bf16_adamw_bytes and accelerate_bf16_sgd_bytes",
    mistakes=[(f"{BYTES_NAMES[which]} = {wrong}: {why}",
               tuple(wrong if i == which else right for i, right in enumerate(
                   RIGHT_BYTES))) for which, wrong, why in WRONG_BYTES],
    correct=lambda got, config: (
        "real steps held {:.3f} and {:.3f} bytes per parameter (the last digits: "
        "AdamW's step counters). A bfloat16 model halves the memory but loses small "
        "updates; Accelerate's bf16 keeps float32's bytes.").format(
            *measured_recipes()))


@core.checker(BYTES)
def check_bytes_per_parameter(pure_bf16_adamw_bytes, accelerate_bf16_sgd_bytes):
    """Bytes per parameter held between steps by two recipes."""


# --- 5.4: a float16 loop with a GradScaler, and gradient clipping -----------------

INIT_SCALE = 2.0**20  # high on purpose: the first steps overflow and must be skipped
STEPS, BATCH = 8, 8


def float16_loop(after_forward):
    """``train_float16`` as a learner writes it: ``after_forward`` is the code that
    follows the forward pass in each step."""
    namespace = {"torch": torch}
    exec("def train_float16(model, optimizer, scaler, batches, max_grad_norm):\n"
         "    for batch in batches:\n"
         "        with torch.autocast(model.device.type, dtype=torch.float16):\n"
         "            loss = model(**batch).loss\n"
         + textwrap.indent(textwrap.dedent(after_forward), " " * 8), namespace)
    return namespace["train_float16"]


# the intended answer of 5.4 after the forward pass (unscale_: clip the true sizes)
INTENDED_STEPS = """\
scaler.scale(loss).backward()
scaler.unscale_(optimizer)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
scaler.step(optimizer)
scaler.update()
optimizer.zero_grad()
"""
intended_float16_loop = float16_loop(INTENDED_STEPS)


def intended_but(old, new=None):
    """The intended loop with ``old`` written as ``new`` (without its line if None)."""
    if new is None:  # the line left out
        return float16_loop("".join(line for line in INTENDED_STEPS.splitlines(True)
                                    if old not in line))
    return float16_loop(INTENDED_STEPS.replace(old, new))


def float16_run(loop, max_grad_norm):
    """{"update": the weights' change, "steps": optimizer steps taken, "scale": the
    final scale} of ``loop``, from the same start on the same batches."""
    from helpers.models import flat_parameters

    model = fixtures.tiny_model()
    start = flat_parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # sizes show in the weights
    steps = []
    optimizer.register_step_post_hook(lambda *args: steps.append(1))
    scaler = torch.amp.GradScaler(fixtures.DEVICE.type, init_scale=INIT_SCALE)
    batches = fixtures.fixed_batches(BATCH, STEPS)
    core.learner(loop, model, optimizer, scaler, batches, max_grad_norm)
    return {"update": (flat_parameters(model) - start).float().cpu(),
            "steps": len(steps), "scale": scaler.get_scale()}


def same_training(got, expected):
    """The same steps and scale, and updates within 1 % of each other's size: right
    answers differ by 3e-4 to 7e-4 of it (float16 rounding amplifies clip_grad_norm_'s
    1e-6), every mistake by more than 100 % (tests/test_practice_05.py)."""
    a, b = got["update"], expected["update"]
    return (got["steps"] == expected["steps"] and got["scale"] == expected["scale"]
            and torch.equal(a.isnan(), b.isnan())
            and (a - b).nan_to_num().norm() <= 0.01 * b.nan_to_num().norm())


def describe_float16(got, expected, max_grad_norm):
    if got["update"].isnan().any():
        return ("some weights are NaN: a step ran on overflowed gradients. Hint: step "
                "only with scaler.step(optimizer), which skips such steps.")
    return (f"with max_grad_norm={max_grad_norm}, {got['steps']} optimizer steps (the "
            f"intended loop: {expected['steps']}), other weights. Hint: per batch, "
            "scale(loss).backward(), unscale_, clip_grad_norm_, scaler.step, "
            "scaler.update(), zero_grad().")


FLOAT16_LOOP = core.Exercise(
    "5.4", measure=float16_run, intended=intended_float16_loop, configs=(1.0, 0.25),
    name="train_float16", same=same_training, describe=describe_float16,
    mistakes=[
        ("you clipped the scaled gradients, far below max_grad_norm. Hint: "
         "scaler.unscale_(optimizer) before clip_grad_norm_.",
         intended_but("scaler.unscale_(optimizer)")),
        ("the gradients were never clipped. Hint: after unscale_, torch.nn.utils."
         "clip_grad_norm_(model.parameters(), max_grad_norm).",
         intended_but("torch.nn.utils.clip")),
        ("you clipped at 1.0, not at max_grad_norm (0.25 here). Hint: "
         "clip_grad_norm_(..., max_grad_norm).",
         intended_but("max_grad_norm)", "1.0)")),
        ("clip_grad_value_ clips each element; Trainer clips the norm of all "
         "gradients together. Hint: clip_grad_norm_.",
         intended_but("norm_(", "value_(")),
        ("the scaler never scaled a loss. Hint: scaler.scale(loss).backward().",
         intended_but("scaler.scale(loss)", "loss")),
        ("scaler.unscale_(optimizer) ran after a scaler.step(optimizer) with no "
         "scaler.update() between them. Hint: every batch, in this order: unscale_, "
         "clip, scaler.step(optimizer), scaler.update().",
         intended_but("scaler.update()")),
        ("scaler.update() found no scaler.step(optimizer) since the last update. Hint: "
         "scaler.step(optimizer), not optimizer.step(), then scaler.update().",
         float16_loop("scaler.scale(loss).backward()\noptimizer.step()\n"
                      "scaler.update()\n")),
        ("optimizer.step() stepped on overflowed gradients: the weights are NaN. "
         "Hint: scaler.step(optimizer) skips such steps.",
         intended_but("scaler.step(optimizer)", "optimizer.step()")),
        ("each step's gradients were added to the previous ones. Hint: "
         "optimizer.zero_grad() after each step.", intended_but("zero_grad"))],
    error_hints=[("unscale_() has already been called", "call scaler.unscale_("
                  "optimizer) once per step, before clipping.")],
    correct=f"the first steps overflowed and were skipped while the scale fell from 2^"
    f"{round(math.log2(INIT_SCALE))}; the others trained on clipped gradients, as the "
    "intended loop did, with max_grad_norm 1.0 and 0.25.")


@core.checker(FLOAT16_LOOP)
def check_float16_loop(train_float16):
    """``train_float16(model, optimizer, scaler, batches, max_grad_norm)``: float16 with
    a GradScaler, clipped."""
