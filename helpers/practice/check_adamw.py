"""Practice 4's checks (lesson 04, AdamW): answers weighed against one real step."""
import logging
import math

import torch

from helpers.optimizer_state import memory_key, optimizer_state_size
from helpers.practice import core
from helpers.units import GiB

HYPER = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)  # decay visible
STEPS, SCALES = 10, (1.0, 1e-5)  # gradients of about 1, and tiny ones: eps counts


def one_step(make_optimizer, shapes, dtype=torch.float32):
    """The optimizer after one step on zeros (its state does not depend on values)."""
    parameters = [torch.zeros(shape, dtype=dtype) for shape in shapes]
    for parameter in parameters:
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer = make_optimizer(parameters)
    optimizer.step()
    return optimizer


def prediction(number, name, after_step, cases, mistakes, correct):
    """Predict the bytes of ``after_step(*args)``'s state, for all cases at once."""
    def measure(answer, cases):
        return tuple(core.as_number(core.learner(answer, list(args[0]), *args[1:]),
                                    f"{name}'s answer", whole=True)
                     for _, args in cases)

    def describe(got, expected, cases):  # the state's bytes by entry and dtype
        (label, args), mine, truth = next(
            case for case in zip(cases, got, expected) if case[1] != case[2])
        blocks = {(f"{key} ({str(value.dtype)[6:]})", memory_key(value)): value.nbytes
                  for state in after_step(*args).state.values()
                  for key, value in state.items() if torch.is_tensor(value)}
        entries = {entry: sum(n for (e, _), n in blocks.items() if e == entry)
                   for entry, _ in blocks}
        return (f"on {label}, {name} gave {mine:,} bytes; one real step keeps "
                f"{truth:,}: {', '.join(f'{e} {n:,}' for e, n in entries.items())}. "
                "Hint: find the rule behind those entries, then check it on this case.")

    return core.Exercise(
        number, measure, lambda *args: optimizer_state_size(after_step(*args))[1],
        mistakes, configs=(cases,), describe=describe, name=name, correct=correct,
        same=core.close(rel=0, abs_=0.5))  # whole bytes; the nearest mistake is 4 off


DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHAPE_LISTS = [("an attention projection and its bias", [(768, 768), (768,)]),
               ("a 3-dimensional and a 0-dimensional tensor", [(4, 6, 8), (), (5,)]),
               ("one matrix", [(300, 64)])]
STATE_SHAPE_LISTS = [  # each tests a rule, at its edges: 4,096 values, blocks of 256
    [(256, 256), (256,), (256, 256), (256,)], [(5000,)], [(64, 64)], [(63, 65)],
    [(1, 5000)], [(300, 20), (20,), (7, 9)]]

ADAMW_STATE = prediction(
    "4.1", "adamw_state_bytes", lambda *args: one_step(torch.optim.AdamW, *args),
    [(f"{label} {shapes} in {str(dtype)[6:]}", (shapes, dtype))
     for label, shapes in SHAPE_LISTS for dtype in DTYPES],
    [("AdamW also keeps a `step` counter per parameter tensor: a 0-dimensional "
      "float32 tensor, 4 bytes.",
      lambda shapes, dtype: 2 * sum(map(math.prod, shapes)) * dtype.itemsize),
     ("8 bytes per parameter holds for float32 only, without the step counters: "
      "the EMAs take the parameter's dtype, and each tensor has a 4-byte `step`.",
      lambda shapes, dtype: 8 * sum(map(math.prod, shapes))),
     ("right for float32 only: the EMAs are zeros_like(param), in the parameter's "
      "dtype (dtype.itemsize).",
      lambda shapes, dtype: 8 * sum(map(math.prod, shapes)) + 4 * len(shapes))],
    lambda measured, cases: (
        f"your predictions match a real AdamW step in all {len(cases)} cases; for "
        f"{SHAPE_LISTS[0][0]}: " + ", ".join(
            f"{n:,} bytes in {str(dtype)[6:]}" for n, dtype in zip(measured, DTYPES))
        + ": two EMAs in the parameters' dtype, a 4-byte `step` per tensor."))


@core.checker(ADAMW_STATE)
def check_optimizer_state_size(adamw_state_bytes):
    """``adamw_state_bytes(shapes, dtype)``: AdamW's state after one step, in bytes."""


# Llama-2-7B's sizes, from its config.json on the Hugging Face Hub
LLAMA_2_7B = {"vocab_size": 32_000, "hidden_size": 4_096, "intermediate_size": 11_008,
              "num_hidden_layers": 32}


def llama_shapes(vocab_size, hidden_size, intermediate_size, num_hidden_layers):
    """LlamaForCausalLM's parameter shapes, in order (no biases, untied embeddings)."""
    h, i = hidden_size, intermediate_size
    layer = [(h, h)] * 4 + [(i, h), (i, h), (h, i)] + [(h,), (h,)]
    return [(vocab_size, h), *layer * num_hidden_layers, (h,), (vocab_size, h)]


N_7B = sum(map(math.prod, llama_shapes(**LLAMA_2_7B)))
PARTS = ("weights", "gradients", "master weights", "optimizer state")
FITS, GPU_BYTES = "fits on one 80 GiB GPU", 80 * GiB


def mixed_precision_budget():
    """The intended answer: a mixed-precision AdamW step, weighed on the meta device."""
    shapes = llama_shapes(**LLAMA_2_7B)
    with torch.device("meta"):  # shapes and dtypes, no memory
        model = [torch.zeros(s, dtype=torch.bfloat16, requires_grad=True)
                 for s in shapes]
        sum(weight.sum() for weight in model).backward()
        adamw = one_step(torch.optim.AdamW, shapes)  # on the float32 master weights
    kept = (model, [w.grad for w in model], adamw.param_groups[0]["params"],
            [value for state in adamw.state.values() for value in state.values()])
    budget = {part: sum(t.nbytes for t in ts) for part, ts in zip(PARTS, kept)}
    return {**budget, FITS: sum(budget.values()) <= GPU_BYTES}


def measure_budget(answer, config):
    """The parts in bytes per parameter of Llama-2-7B, and whether they fit."""
    budget = core.learner(answer) if callable(answer) else answer
    if not (isinstance(budget, dict) and {*PARTS, FITS} <= set(budget)):
        raise core.Wrong(f"training_bytes should be a dict of the bytes of {PARTS}, "
                         f"and {FITS!r}: True or False; it is {budget!r:.80}.")
    if "bool" not in str(getattr(budget[FITS], "dtype", type(budget[FITS]))):  # NumPy's
        raise core.Wrong(f"{FITS!r} is {budget[FITS]!r}: give True or False.")
    per_parameter = {part: core.as_number(budget[part], f"training_bytes[{part!r}]")
                     / N_7B for part in PARTS}  # in GiB, MB...: core.in_units says so
    return {**per_parameter, FITS: bool(budget[FITS])}


def budget(bytes_per_parameter=(2, 2, 4, 8), fits=None, n=N_7B):  # a learner's
    """As a learner computes it: ``fits`` from the total, unless given."""
    parts = {part: b * n for part, b in zip(PARTS, bytes_per_parameter)}
    return {**parts, FITS: sum(parts.values()) <= GPU_BYTES if fits is None else fits}


def budget_correct(per_parameter, config):
    total = sum(per_parameter[part] for part in PARTS) * N_7B
    per_part = " + ".join(f"{per_parameter[part]:.0f}" for part in PARTS)
    return (f"one real mixed-precision step of Llama-2-7B's {N_7B:,} parameters (on "
            f"the meta device) keeps {per_part} = {total / N_7B:.0f} bytes per "
            f"parameter, {total / GiB:.1f} GiB before a single activation: sharded "
            f"evenly (FSDP, ZeRO-3), {math.ceil(total / GPU_BYTES)} GPUs of 80 GiB.")


TRAINING_BUDGET = core.Exercise(
    "4.2", measure_budget, mixed_precision_budget, name="training_bytes", mistakes=[
        *[(f"those are bytes per parameter: multiply by the {N_7B:,} parameters.",
           budget(n=1, fits=fits)) for fits in (None, False)],  # `fits` either way
        ("AdamW's state is like the float32 master weights it updates: 2 x 4 bytes.",
         budget((2, 2, 4, 4))),
        ("a gradient takes its weight's dtype: bfloat16, 2 bytes.",
         budget((2, 4, 4, 8))),
        (f"16 bytes per parameter are {16 * N_7B / GiB:.1f} GiB: more than 80 GiB.",
         budget(fits=True))],
    describe=f"in bytes per parameter, of Llama-2-7B's {N_7B:,}; which dtype has each "
    "part here?", correct=budget_correct,
    same=core.close(rel=0.01))  # the mistakes are 50 % off or more; step counters 2e-8


@core.checker(TRAINING_BUDGET)
def check_training_memory(training_bytes):
    """``training_bytes``: {part: bytes, FITS: True or False}, Llama-2-7B's."""


def measure_step(step, scale):
    """The parameter and state after STEPS steps on gradients of about ``scale``."""
    generator = torch.Generator().manual_seed(0)  # the same numbers in every run
    parameter, state = torch.randn(6, 4, generator=generator), {}
    for _ in range(STEPS):
        gradient = scale * torch.randn(6, 4, generator=generator)
        core.learner(step, parameter, gradient, state, **HYPER)
    return core.learner(lambda: {  # divided by scale: one tolerance fits both
        "parameter": parameter, "exp_avg": state["exp_avg"] / scale,
        "exp_avg_sq": state["exp_avg_sq"] / scale**2,
        "step": core.as_number(state["step"], "state['step']")})


def torch_adamw_step(param, grad, state, **hyper):
    """The intended answer: torch.optim.AdamW's own step, its state in ``state``."""
    if not state:
        state["optimizer"] = torch.optim.AdamW([param], **hyper)
    param.grad = grad
    state["optimizer"].step()
    state.update(state["optimizer"].state[param])


FIXED_STEP = core.Exercise(
    "4.3", measure_step, torch_adamw_step, configs=SCALES, name="fixed_step",
    mistakes=[  # decay lines around Adam's update (AdamW's, at weight_decay=0)
        ("this still adds weight_decay x param to the gradient (Adam's L2), which "
         "sqrt(exp_avg_sq) then divides. AdamW decouples it: "
         "param.mul_(1 - lr * weight_decay), the gradient left alone.",
         lambda param, grad, state, weight_decay, **adam: torch_adamw_step(
             param, grad.add(param, alpha=weight_decay), state, **adam,
             weight_decay=0)),
        ("the weights decay twice: remove the line that adds weight_decay x param to "
         "the gradient.", lambda param, grad, state, lr, weight_decay, **adam:
         torch_adamw_step(param.mul_(1 - lr * weight_decay), grad.add(
             param, alpha=weight_decay), state, lr=lr, **adam, weight_decay=0)),
        ("no weight decay now: param.mul_(1 - lr * weight_decay) before the update.",
         lambda *args, **hyper: torch_adamw_step(*args, **hyper | {"weight_decay": 0})),
        ("the decay is scaled by the learning rate: 1 - lr x weight_decay.",
         lambda param, grad, state, weight_decay, **adam: torch_adamw_step(
             param.mul_(1 - weight_decay), grad, state, **adam, weight_decay=0))],
    label="gradients of about {:g}", describe="start from colleague_step and change "
    "only how weight_decay is applied, in place on param.",
    same=core.close(rel=1e-5, abs_=1e-7),  # right answers 0.2x of it, mistakes 6,000x
    correct=f"after {STEPS} steps with gradients of about 1 and 1e-5, your parameter "
    "and state match torch.optim.AdamW's: the decay shrinks each weight in proportion "
    "to its size, outside the adaptive update.")


@core.checker(FIXED_STEP)
def check_fixed_step(fixed_step):
    """``fixed_step(param, grad, state, lr, betas, eps, weight_decay)``."""


def adafactor_after_step(shapes, momentum):
    from transformers.optimization import Adafactor
    return one_step(lambda params: Adafactor(params, lr=1e-3, scale_parameter=False,
                    relative_step=False, beta1=0.9 if momentum else None), shapes)


def adamw8bit_after_step(shapes):
    # as in the lesson: its import warns, on CPUs with AVX512-BF16, of a 4-bit kernel
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    import bitsandbytes
    return one_step(bitsandbytes.optim.AdamW8bit, shapes)


def factored(shape):  # a matrix's second moment: one value per row and per column
    return sum(shape) if len(shape) == 2 else math.prod(shape)


def eight_bit(n):  # two uint8 states, each with a float32 scale per started 256 values
    return 2 * n + 2 * 4 * math.ceil(n / 256) if n >= 4096 else 8 * n


ADAFACTOR_STATE = prediction(
    "4.4", "adafactor_state_bytes", adafactor_after_step,
    [(f"{shapes} with momentum={momentum}", (shapes, momentum))
     for shapes in STATE_SHAPE_LISTS for momentum in (False, True)],
    [("every tensor also keeps RMS: a 0-dimensional float32 tensor, 4 bytes.",
      lambda shapes, momentum: sum(4 * (factored(s) + momentum * math.prod(s))
                                   for s in shapes)),
     ("a matrix's second moment is factored: one float32 per row and per column.",
      lambda shapes, momentum: sum(4 * (1 + momentum) * math.prod(s) + 4
                                   for s in shapes)),
     ("with momentum (beta1) Adafactor also keeps exp_avg, a full float32 tensor.",
      lambda shapes, momentum: sum(4 * factored(s) + 4 for s in shapes))],
    lambda measured, cases: (f"your Adafactor predictions match {len(cases)} real "
                             "steps, with momentum and without."))

ADAMW8BIT_STATE = prediction(
    "4.4", "adamw8bit_state_bytes", adamw8bit_after_step,
    [(str(shapes), (shapes,)) for shapes in STATE_SHAPE_LISTS],
    [("the 8-bit codes index two lookup tables, qmap1 and qmap2: 2 x 256 float32, "
      "once for the whole optimizer.",
      lambda shapes: sum(eight_bit(math.prod(s)) for s in shapes)),
     ("the two lookup tables (2,048 bytes) are shared by every tensor's state: count "
      "them once.", lambda shapes: sum(eight_bit(n) + 2048 * (n >= 4096)
                                        for n in map(math.prod, shapes)))],
    lambda measured, cases: (f"your 8-bit AdamW predictions match {len(cases)} real "
                             "steps, at the edges too (4,096 values, partial blocks)."))


def state_verdict(adafactor_state_bytes, adamw8bit_state_bytes):
    """The Verdict on the first function that is not right, else on both."""
    first, second = (core.check(ADAFACTOR_STATE, adafactor_state_bytes),
                     core.check(ADAMW8BIT_STATE, adamw8bit_state_bytes))
    return next((v for v in (first, second) if v.status != core.CORRECT), core.Verdict(
        "4.4", core.CORRECT, f"{first.message} Y{second.message[1:]}"))


def check_adafactor_and_8bit_state(adafactor_state_bytes, adamw8bit_state_bytes):
    """Prints ``state_verdict``: both functions' predictions for float32 parameters."""
    print(state_verdict(adafactor_state_bytes, adamw8bit_state_bytes))
