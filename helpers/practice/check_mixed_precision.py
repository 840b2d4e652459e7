"""Practice 5's checks (lesson 05): autocast, bf16 setups, bytes held, GradScaler."""
import contextlib
import functools

import torch
from accelerate import Accelerator

from helpers.mixed_precision import DtypeCounter, dtype_name
from helpers.models import flat_parameters
from helpers.optimizer_state import optimizer_state_size
from helpers.practice import core, fixtures
from helpers.practice.fixtures import ON_CPU, SmallNet, args_with

SCALE_EXPONENT = 20  # a high start on purpose: the first steps overflow, are skipped


WHY_5_1 = {  # operation: (its dtype under CPU autocast to bfloat16, why)
    "embedding": ("float32", "it is on no autocast list, and its weight is float32"),
    "addmm": ("bfloat16", "a Linear's matmul is on autocast's lower-precision list"),
    "gelu": ("bfloat16", "it is on no list: it follows its input, a Linear's output"),
    "native_layer_norm": ("bfloat16", "on the CPU it is on no list: it follows its "
                          "input, gelu's bfloat16 output (in DistilBERT, a float32 "
                          "residual sum)"),
    "_softmax": ("bfloat16", "it is on no CPU list: it follows a Linear's output"),
    "mse_loss": ("float32", "losses are on the CPU's float32 list: inputs cast up")}
AUTOCAST_DTYPES = {op: dtype for op, (dtype, _) in WHY_5_1.items()}  # the answer


def ran_and_predicted(prediction, config):
    """{operation: (its dtype in a SmallNet forward under CPU autocast, predicted)}."""
    if not isinstance(prediction, dict) or not prediction.keys() >= WHY_5_1.keys():
        raise core.Wrong("prediction should be a dict with a dtype for each of "
                         f"{core.listed(WHY_5_1)}; got {core.short_repr(prediction)}.")
    torch.manual_seed(0)  # check() puts the learner's random state back
    with torch.autocast("cpu", dtype=torch.bfloat16), DtypeCounter() as counter:
        SmallNet()(torch.randint(0, 50, (8,)), torch.rand(8, 4))
    return {op: (ran, str(prediction[op]).removeprefix("torch."))  # or torch.bfloat16
            for op, ran in counter.counts if op in WHY_5_1}


PREDICTION = core.Exercise(
    "5.1", measure=ran_and_predicted, intended=AUTOCAST_DTYPES, name="prediction",
    describe=lambda got, expected, config: " ".join(
        f"{op} ran in {ran}, not {said}: {WHY_5_1[op][1]}."
        for op, (ran, said) in got.items() if ran != said),
    correct=lambda got, config: "counted under CPU autocast: " + "; ".join(
        f"{', '.join(op for op, (ran, _) in got.items() if ran == dtype)} in {dtype}"
        for dtype in ("bfloat16", "float32")) + ".")


@core.checker(PREDICTION)
def check_autocast_prediction(prediction):
    """``prediction``: {operation: "bfloat16" or "float32"} under CPU autocast."""


def bf16_setups_run(answer, config):
    """Accelerator: logits dtype and loss; then Trainer: matmul dtypes and loss."""
    make_training_args, make_accelerator = answer
    fixtures.learners_arguments(make_training_args)  # a form problem, said first
    with fixtures.fresh_accelerate_state() as learners, torch.no_grad():
        accelerator = core.returned(core.learner(make_accelerator), Accelerator,
                                    "make_accelerator")
        with (fixtures.fresh_accelerate_state(learners)  # made before: use its state
              if vars(accelerator.state) is learners[1] else contextlib.nullcontext()):
            outputs = core.learner(accelerator.prepare, fixtures.tiny_model())(
                **fixtures.fixed_batches(8, 1)[0])
    with DtypeCounter() as counter:
        trainer = core.learner(fixtures.trainer_run, 8, 8, make_args=make_training_args)
    return {"trainer": ([d for op, d in counter.counts if op == "addmm"],
                        fixtures.logged_losses(trainer)[0]),
            "accelerator": (dtype_name(outputs.logits.dtype), outputs.loss.item())}


BF16_ARGS = args_with(bf16=True, use_cpu=ON_CPU)
BF16_ACCELERATOR = functools.partial(Accelerator, mixed_precision="bf16")
BF16_SETUPS = core.Exercise(
    "5.2", measure=bf16_setups_run, intended=(BF16_ARGS, BF16_ACCELERATOR),
    name="make_training_args and make_accelerator", mistakes=[
        ("Trainer trained in float32 (on a CPU, so does fp16=True). Hint: "
         "TrainingArguments(..., bf16=True).",  # the usual fp16=True: float32 on a CPU
         (args_with(fp16=ON_CPU, use_cpu=ON_CPU), BF16_ACCELERATOR)),
        ("the Accelerator's model ran in float32 (on a CPU, so does \"fp16\"). Hint: "
         'Accelerator(mixed_precision="bf16").', (BF16_ARGS, Accelerator))],
    same=core.close(rel=1e-5),  # the same computation; a float32 one differs by ~1e-3
    describe='bf16=True and Accelerator(mixed_precision="bf16"), nothing else that '
    "changes the computation.",
    correct="Trainer ran its matrix multiplies in bfloat16, with bf16=True's loss; the "
    "Accelerator's model gave mixed_precision=\"bf16\"'s loss, its logits converted "
    "back to float32 (convert_outputs_to_fp32).")


@core.checker(BF16_SETUPS)
def check_bf16_setups(make_training_args, make_accelerator):
    """Bfloat16 in ``make_training_args(output_dir)`` and ``make_accelerator()``."""


def held_after_step(model, precision, optimizer_class, **settings):
    """Bytes per parameter held after one real step: weights, gradients, optimizer."""
    with fixtures.fresh_accelerate_state():
        accelerator = Accelerator(mixed_precision=precision, cpu=ON_CPU)
        optimizer = optimizer_class(model.parameters(), **settings)
        prepared, stepper = accelerator.prepare(model, optimizer)
        accelerator.backward(prepared(**fixtures.fixed_batches(8, 1)[0]).loss)
        stepper.step()
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    return (sum(t.numel() * t.element_size() for t in tensors)
            + optimizer_state_size(optimizer)[1]) / len(flat_parameters(model))


@functools.cache
def measured_recipes():  # pure bfloat16 AdamW; Accelerate's bf16 with momentum SGD
    return (held_after_step(fixtures.tiny_model().to(torch.bfloat16), "no",
                            torch.optim.AdamW, lr=1e-3),
            held_after_step(fixtures.tiny_model(), "bf16", torch.optim.SGD, lr=1e-2,
                            momentum=0.9))


BYTES_NAMES = ("pure_bf16_adamw_bytes", "accelerate_bf16_sgd_bytes")
RIGHT_BYTES = (2 + 2 + 2 + 2, 4 + 4 + 4)  # the intended answer, as a learner counts
WRONG_BYTES = {  # (which answer, a wrong count): what it counted
    (0, 4 + 4 + 8): "that is float32 training's 4 + 4 + 8; here the model is "
    "bfloat16, and AdamW's moments take the parameter's dtype.",
    (0, 6 + 8 + 4): "that is ML Engineering's 6 + 8 + 4, with float32 master "
    "weights; here nothing is float32 (.to(torch.bfloat16)).",
    (1, 4 + 4 + 8): "that is AdamW's state; SGD with momentum keeps one float32 "
    "buffer, 4 bytes.",
    (1, 2 + 4 + 4): "Accelerate's bf16 keeps weights, gradients and momentum in "
    "float32; its bfloat16 copies live only in forward and backward."}


def bytes_hint(which, number):  # a listed mistake's hint, else the real step's bytes
    return f"{BYTES_NAMES[which]} = {number:g}" + (
        f": {WRONG_BYTES[which, number]}" if (which, number) in WRONG_BYTES else
        f", but a real step held {measured_recipes()[which]:.3f} bytes per parameter. "
        "Hint: add a weight's bytes, its gradient's and the optimizer's state's.")


BYTES = core.Exercise(
    "5.3", intended=RIGHT_BYTES, name=" and ".join(BYTES_NAMES),
    # each number, or "as measured" within a tenth of a byte of the real step's: AdamW's
    # step counters add 0.001 bytes; the nearest mistake is 2 bytes away
    measure=lambda answer, config: tuple(
        "as measured" if abs(number - held) < 0.1 else number for number, held
        in zip(map(core.as_number, answer, BYTES_NAMES), measured_recipes())),
    mistakes=[(bytes_hint(which, wrong), tuple(
        wrong if i == which else right for i, right in enumerate(RIGHT_BYTES)))
        for which, wrong in WRONG_BYTES],
    describe=lambda got, expected, config: " ".join(
        bytes_hint(which, number) for which, number in enumerate(got)
        if number != "as measured"),
    correct=lambda got, config: "real steps held {:.3f} and {:.3f} bytes per parameter "
    "(the last digits: AdamW's step counters). A bfloat16 model halves the memory but "
    "loses small updates; Accelerate's bf16 keeps float32's bytes.".format(
        *measured_recipes()))


@core.checker(BYTES)
def check_bytes_per_parameter(pure_bf16_adamw_bytes, accelerate_bf16_sgd_bytes):
    """Bytes per parameter held between steps by two recipes."""


def train_float16(model, optimizer, scaler, batches, max_grad_norm):  # 5.4's intended
    for batch in batches:
        with torch.autocast(model.device.type, dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)"
UNSCALE, STEP, ZERO = ("scaler.unscale_(optimizer)", "scaler.step(optimizer)",
                       "optimizer.zero_grad()")
miss = functools.partial(core.edited, train_float16)  # a near miss of 5.4's loop


def float16_run(loop, max_grad_norm):
    """The steps taken, final scale and weights' change of ``loop``, on 5 batches."""
    model = fixtures.tiny_model()
    start, steps = flat_parameters(model), []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # sizes show in the weights
    optimizer.register_step_pre_hook(lambda *args: steps.append(any(
        p.grad is not None and p.grad.any() for p in model.parameters())))
    scaler = torch.amp.GradScaler(fixtures.DEVICE.type, init_scale=2.0**SCALE_EXPONENT)
    core.learner(loop, model, optimizer, scaler, fixtures.fixed_batches(8, 5),
                 max_grad_norm)
    return {"steps": len(steps), "steps without gradients": steps.count(False),
            "scale": int(scaler.get_scale()),  # compared first
            "weights": (flat_parameters(model) - start).float().cpu()}


FLOAT16_LOOP = core.Exercise(
    "5.4", measure=float16_run, intended=train_float16, configs=(1.0, 0.25),
    name="train_float16", label="max_grad_norm={}", mistakes=[
        ("you clipped the scaled gradients, far below max_grad_norm. Hint: scaler."
         "unscale_(optimizer) before clip_grad_norm_.", miss((UNSCALE, ""))),
        ("the gradients were never clipped. Hint: after unscale_, torch.nn.utils."
         "clip_grad_norm_(model.parameters(), max_grad_norm).", miss((CLIP, ""))),
        ("you clipped at 1.0, not at max_grad_norm (0.25 here). Hint: clip_grad_norm_("
         "..., max_grad_norm).", miss((CLIP, CLIP.replace("max_grad_norm)", "1.0)")))),
        ("clip_grad_value_ clips each element; Trainer clips the norm of all gradients "
         "together. Hint: clip_grad_norm_.",
         miss((CLIP, CLIP.replace("clip_grad_norm_", "clip_grad_value_")))),
        ("optimizer.step() stepped on overflowed gradients: the weights are NaN. "
         "Hint: scaler.step(optimizer) skips such steps.",
         miss((STEP, "optimizer.step()"))),
        ("each step's gradients were added to the previous ones. Hint: "
         "optimizer.zero_grad() after each step.", miss((ZERO, ""))),
        ("optimizer.zero_grad() ran before scaler.step(optimizer), so each step found "
         "no gradients and left the weights as they were. Hint: zero_grad() last, "
         "after scaler.update().", miss((ZERO, ""), (STEP, f"{ZERO}\n{STEP}")))],
    # right answers' weights differ by under 2e-5 (float16 amplifies clip_grad_norm_'s
    # 1e-6), a mistake's by 0.05 or more (tests/test_practice_05.py)
    same=core.close(rel=0, abs_=1e-3),
    describe="per batch: scale(loss).backward(), unscale_, clip_grad_norm_, scaler."
    "step (it skips steps on overflowed gradients), scaler.update(), zero_grad().",
    error_hints=[  # what GradScaler raises, and the fix
        ("_scale is None", "scaler.scale(loss).backward(), not loss.backward()."),
        ("is being called after step()", "per batch, in this order: unscale_, clip, "
         "scaler.step(optimizer), scaler.update()."),
        ("No inf checks were recorded prior to update", "per step, one scaler.step("
         "optimizer), not optimizer.step(), then one scaler.update()."),
        ("recorded for this optimizer", "scaler.step(optimizer) found no gradients: "
         "optimizer.zero_grad() after the step, not before it.")],
    correct=f"the first steps overflowed and were skipped while the scale fell from "
    f"2^{SCALE_EXPONENT}; the others trained on clipped gradients, as the intended "
    "loop did, with max_grad_norm 1.0 and 0.25.")


@core.checker(FLOAT16_LOOP)
def check_float16_loop(train_float16):
    """``train_float16(model, optimizer, scaler, batches, max_grad_norm)``, clipped."""
