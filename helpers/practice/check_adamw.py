"""Checks for notebooks/practice/04_adamw_practice.ipynb (lesson 04), on the practice
core. The intended answers measure: AdamW, Adafactor and 8-bit AdamW take one real step
and their state is weighed as the lesson weighs it (optimizer_state_size), so a
prediction matches to the byte. A prediction function is judged on all its cases at
once (one configuration): a mistake is known by its answers on every case.
"""
import logging
import math

import torch

from helpers.optimizer_state import memory_key, optimizer_state_size
from helpers.practice import core
from helpers.units import GiB


def values(shapes):
    return sum(math.prod(shape) for shape in shapes)  # math.prod(()) is 1


def one_step(make_optimizer, shapes, dtype=torch.float32):
    """The optimizer after one step on zeros of these shapes (the state's tensors,
    shapes and dtypes do not depend on the values)."""
    parameters = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
                  for shape in shapes]
    sum((p * 1e-3).sum() for p in parameters).backward()
    optimizer = make_optimizer(parameters)
    optimizer.step()
    return optimizer


def state_entries(optimizer):
    """``exp_avg (float32) 2,359,296, ...``: the state's bytes by entry and dtype."""
    entries, seen = {}, set()
    for key, value in [item for state in optimizer.state.values()
                       for item in state.items() if torch.is_tensor(item[1])]:
        if memory_key(value) not in seen:
            seen.add(memory_key(value))
            name = f"{key} ({str(value.dtype)[6:]})"
            entries[name] = entries.get(name, 0) + value.untyped_storage().nbytes()
    return ", ".join(f"{name} {n:,}" for name, n in entries.items())


def prediction(number, name, after_step, cases, mistakes, correct):
    """An exercise whose answer predicts the bytes of ``after_step(*args)``'s state for
    each (label, args) case; the intended answer takes that step and weighs it."""
    def measure(answer, cases):
        return tuple(core.as_number(core.learner(answer, list(args[0]), *args[1:]),
                                    f"{name}'s answer", whole=True)
                     for _, args in cases)

    def describe(got, expected, cases):
        (label, args), mine, truth = next(
            case for case in zip(cases, got, expected) if case[1] != case[2])
        return (f"on {label}, {name} gave {mine:,} bytes; one real step keeps "
                f"{truth:,}: {state_entries(after_step(*args))}. Hint: find the rule "
                "behind those entries, then check it on this case.")

    return core.Exercise(
        number, measure, lambda *args: optimizer_state_size(after_step(*args))[1],
        mistakes, configs=(cases,), describe=describe, name=name, correct=correct,
        same=core.close(rel=0, abs_=0.5))  # whole bytes; the nearest mistake is 4 off


# --- 4.1: AdamW's state, to the byte -----------------------------------------------

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHAPE_LISTS = [("an attention projection and its bias", [(768, 768), (768,)]),
               ("a 3-dimensional and a 0-dimensional tensor", [(4, 6, 8), (), (5,)]),
               ("one matrix", [(300, 64)])]

ADAMW_STATE = prediction(
    "4.1", "adamw_state_bytes",
    lambda shapes, dtype: one_step(torch.optim.AdamW, shapes, dtype),
    [(f"{label} {shapes} in {str(dtype)[6:]}", (shapes, dtype))
     for label, shapes in SHAPE_LISTS for dtype in DTYPES],
    [("AdamW also keeps a `step` counter per parameter tensor: a 0-dimensional "
      "float32 tensor, 4 bytes.",
      lambda shapes, dtype: 2 * values(shapes) * dtype.itemsize),
     ("8 bytes per parameter holds for float32 only, without the step counters: "
      "the EMAs take the parameter's dtype, and each tensor has a 4-byte `step`.",
      lambda shapes, dtype: 8 * values(shapes)),
     ("right for float32 only: the EMAs are zeros_like(param), in the parameter's "
      "dtype (dtype.itemsize).", lambda shapes, dtype: 8 * values(shapes) + 4 * len(
          shapes)),
     ("`step` is float32 (4 bytes) whatever the parameter's dtype.",
      lambda shapes, dtype: (2 * values(shapes) + len(shapes)) * dtype.itemsize),
     ("there is a `step` counter per parameter tensor, not one per optimizer.",
      lambda shapes, dtype: 2 * values(shapes) * dtype.itemsize + 4),
     ("a tensor holds math.prod(shape) values, not sum(shape).", lambda shapes, dtype:
      sum(2 * sum(shape) * dtype.itemsize + 4 for shape in shapes))],
    lambda measured, cases: (
        f"your predictions match a real AdamW step in all {len(cases)} cases; for "
        f"{SHAPE_LISTS[0][0]}: " + ", ".join(
            f"{n:,} bytes in {str(dtype)[6:]}" for n, dtype in zip(measured, DTYPES))
        + ": two EMAs in the parameters' dtype, a 4-byte `step` per tensor."))


@core.checker(ADAMW_STATE)
def check_optimizer_state_size(adamw_state_bytes):
    """``adamw_state_bytes(shapes, dtype)``: AdamW's state after one step, in bytes."""


# --- 4.2: a 7B model's mixed-precision training budget ------------------------------

# Llama-2-7B's sizes, from its config.json on the Hugging Face Hub
LLAMA_2_7B = {"vocab_size": 32_000, "hidden_size": 4_096, "intermediate_size": 11_008,
              "num_hidden_layers": 32}


def llama_shapes(vocab_size, hidden_size, intermediate_size, num_hidden_layers):
    """Parameter shapes of Transformers' LlamaForCausalLM (no biases, embeddings not
    tied), in order: per layer the q, k, v and o projections, the gated feed-forward
    and two RMSNorm weights; then the final norm and the output layer."""
    h, i = hidden_size, intermediate_size
    layer = [(h, h)] * 4 + [(i, h), (i, h), (h, i)] + [(h,), (h,)]
    return [(vocab_size, h), *layer * num_hidden_layers, (h,), (vocab_size, h)]


N_7B = values(llama_shapes(**LLAMA_2_7B))
PARTS = ("weights", "gradients", "master weights", "optimizer state")
FITS, GPU_BYTES = "fits on one 80 GiB GPU", 80 * GiB


def mixed_precision_budget():
    """The intended answer, measured: one mixed-precision AdamW step of Llama-2-7B's
    shapes on the meta device (shapes and dtypes, no memory): bfloat16 weights and
    gradients, and the float32 master weights that AdamW updates."""
    with torch.device("meta"):
        weights = [torch.zeros(shape, dtype=torch.bfloat16, requires_grad=True)
                   for shape in llama_shapes(**LLAMA_2_7B)]
        sum(weight.sum() for weight in weights).backward()
        masters = [weight.detach().float() for weight in weights]
        for master, weight in zip(masters, weights):
            master.grad = weight.grad.float()  # for the step only: dropped after it
        optimizer = torch.optim.AdamW(masters)
        optimizer.step()
    kept = (weights, [weight.grad for weight in weights], masters,
            [value for state in optimizer.state.values() for value in state.values()])
    budget = {part: sum(t.numel() * t.element_size() for t in tensors)
              for part, tensors in zip(PARTS, kept)}
    return {**budget, FITS: sum(budget.values()) <= GPU_BYTES}


def measure_budget(answer, config):
    """The learner's dict, its parts as numbers (the intended one is measured)."""
    budget = core.learner(answer) if callable(answer) else answer
    fits = budget.get(FITS) if isinstance(budget, dict) else None
    truth_value = isinstance(fits, bool) or str(getattr(fits, "dtype", "")) in (
        "bool", "torch.bool")  # NumPy's and PyTorch's too
    if not (isinstance(budget, dict) and set(PARTS) <= set(budget) and truth_value):
        raise core.Wrong(f"training_bytes should be a dict of the bytes of {PARTS}, "
                         f"and {FITS!r}: True or False; it is {budget!r:.80}.")
    return {**{part: core.as_number(budget[part], f"training_bytes[{part!r}]")
               for part in PARTS}, FITS: bool(fits)}


def budget(bytes_per_parameter=(2, 2, 4, 8), fits=False, n=N_7B):
    """A learner's budget, reasoned per parameter: bytes of each part x ``n``."""
    return {**{part: b * n for part, b in zip(PARTS, bytes_per_parameter)}, FITS: fits}


def describe_budget(got, expected, config):
    parts = [f"{part} {got[part] / N_7B:.3g} (measured: {expected[part] / N_7B:.3g})"
             for part in PARTS if abs(got[part] / expected[part] - 1) > 0.01]
    if parts:
        return (f"in bytes per parameter of Llama-2-7B's {N_7B:,}, your "
                + "; ".join(parts) + ". Hint: which dtype has each part here?")
    total = sum(got[part] for part in PARTS)
    return (f"the parts add up to {total / GiB:.1f} GiB, so {FITS!r} is "
            f"{total <= GPU_BYTES}.")


def budget_correct(measured, config):
    total = sum(measured[part] for part in PARTS)
    per_part = " + ".join(f"{measured[part] / N_7B:.0f}" for part in PARTS)
    return (f"one real mixed-precision step of Llama-2-7B's {N_7B:,} parameters (on "
            f"the meta device) keeps {per_part} = {total / N_7B:.0f} bytes per "
            f"parameter, {total / GiB:.1f} GiB before a single activation: sharded "
            f"evenly (FSDP, ZeRO-3), {math.ceil(total / GPU_BYTES)} GPUs of 80 GiB.")


TRAINING_BUDGET = core.Exercise(
    "4.2", measure_budget, mixed_precision_budget, name="training_bytes",
    mistakes=[
        (f"those are bytes per parameter: multiply by the {N_7B:,} parameters.",
         budget(n=1)),
        ("AdamW's state is like the float32 master weights it updates: 2 x 4 bytes.",
         budget((2, 2, 4, 4))),
        ("a gradient takes its weight's dtype: bfloat16, 2 bytes.",
         budget((2, 4, 4, 8))),
        ("mixed precision keeps float32 master weights, 4 bytes, beside the bfloat16 "
         "model.", budget((2, 2, 0, 8))),
        ("the master weights are a part of their own; AdamW's state is exp_avg and "
         "exp_avg_sq, 8 bytes.", budget((2, 2, 4, 12))),
        (f"16 bytes per parameter are {16 * N_7B / GiB:.1f} GiB: more than 80 GiB.",
         budget(fits=True))],
    describe=describe_budget, correct=budget_correct,
    same=core.close(rel=0.01))  # the mistakes are 50 % off or more; step counters 2e-8


@core.checker(TRAINING_BUDGET)
def check_training_memory(training_bytes):
    """``training_bytes``: {part: bytes, FITS: True or False} for Llama-2-7B trained in
    mixed precision with AdamW."""


# --- 4.3: find the bug in an AdamW step ---------------------------------------------

HYPER = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)  # decay visible
STEPS, SCALES = 10, (1.0, 1e-5)  # gradients of about 1, and tiny ones: eps counts


def measure_step(step, scale):
    """(parameter, exp_avg / scale, exp_avg_sq / scale**2, step) after STEPS steps on
    gradients of about ``scale``: the divisions let one tolerance fit both runs."""
    generator = torch.Generator().manual_seed(0)  # the same numbers in every run
    parameter, state = torch.randn(6, 4, generator=generator), {}
    for _ in range(STEPS):
        gradient = scale * torch.randn(6, 4, generator=generator)
        core.learner(step, parameter, gradient, state, **HYPER)
    return core.learner(lambda: {
        "parameter": parameter, "exp_avg": state["exp_avg"] / scale,
        "exp_avg_sq": state["exp_avg_sq"] / scale**2,
        "step": core.as_number(state["step"], "state['step']")})


def torch_adamw_step(param, grad, state, lr, betas, eps, weight_decay):
    """The intended answer: torch.optim.AdamW's own step, its state in ``state``."""
    if not state:
        state["optimizer"] = torch.optim.AdamW([param], lr=lr, betas=betas, eps=eps,
                                               weight_decay=weight_decay)
    param.grad = grad
    state["optimizer"].step()
    state.update(state["optimizer"].state[param])


def adamw_step(param, grad, state, lr, betas, eps, weight_decay, eps_inside=False):
    """colleague_step with its decay fixed; the mistakes below change a line of it."""
    beta1, beta2 = betas
    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(param),
                     exp_avg_sq=torch.zeros_like(param))
    state["step"] += 1
    param.mul_(1 - lr * weight_decay)
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    correction = 1 - beta2 ** state["step"]
    denominator = ((state["exp_avg_sq"] / correction + eps).sqrt() if eps_inside
                   else state["exp_avg_sq"].sqrt() / math.sqrt(correction) + eps)
    param.addcdiv_(state["exp_avg"], denominator,
                   value=-lr / (1 - beta1 ** state["step"]))


def colleague_step(param, grad, state, lr, betas, eps, weight_decay):  # Adam's L2
    adamw_step(param, grad.add(param, alpha=weight_decay), state, lr, betas, eps, 0.0)


def decay_without_lr(param, grad, state, lr, betas, eps, weight_decay):
    param.mul_(1 - weight_decay)
    adamw_step(param, grad, state, lr, betas, eps, 0.0)


def decay_on_a_copy(param, grad, state, lr, betas, eps, weight_decay):
    param = param * (1 - lr * weight_decay)
    adamw_step(param, grad, state, lr, betas, eps, 0.0)


FIXED_STEP = core.Exercise(
    "4.3", measure_step, torch_adamw_step, configs=SCALES, name="fixed_step",
    mistakes=[
        ("this still adds weight_decay x param to the gradient (Adam's L2), which "
         "sqrt(exp_avg_sq) then divides. AdamW decouples it: "
         "param.mul_(1 - lr * weight_decay), the gradient left alone.", colleague_step),
        ("the weights decay twice: remove the line that adds weight_decay x param to "
         "the gradient.",
         lambda param, grad, state, lr, betas, eps, weight_decay: adamw_step(
             param, grad.add(param, alpha=weight_decay), state, lr, betas, eps,
             weight_decay)),
        ("no weight decay now: param.mul_(1 - lr * weight_decay) before the update.",
         lambda param, grad, state, lr, betas, eps, weight_decay: adamw_step(
             param, grad, state, lr, betas, eps, 0.0)),
        ("the decay is scaled by the learning rate: 1 - lr x weight_decay.",
         decay_without_lr),
        ("`param = param * (...)` makes a new tensor the caller never sees. Hint: "
         "param.mul_(1 - lr * weight_decay), in place.", decay_on_a_copy),
        ("eps belongs outside the square root, as in colleague_step: with gradients "
         "of 1e-5, sqrt(1e-8) is ten times them.",
         lambda *args, **hyper: adamw_step(*args, **hyper, eps_inside=True))],
    label="gradients of about {:g}", describe="start from colleague_step and change "
    "only how weight_decay is applied.",
    error_hints=[("KeyError", "keep the state in the dict the step receives, as "
                              "colleague_step does.")],
    same=core.close(rel=1e-5, abs_=1e-7),  # float32 rounding over 10 steps: right
    # answers stay within a fifth of it, each mistake thousands of times beyond it
    correct=f"after {STEPS} steps with gradients of about 1 and 1e-5, your parameter "
    "and state match torch.optim.AdamW's: the decay shrinks each weight in proportion "
    "to its size, outside the adaptive update.")


@core.checker(FIXED_STEP)
def check_fixed_step(fixed_step):
    """``fixed_step(param, grad, state, lr, betas, eps, weight_decay)``: colleague_step
    with AdamW's decay."""


# --- 4.4: Adafactor's and 8-bit AdamW's state ---------------------------------------

STATE_SHAPE_LISTS = [  # each tests a rule, at its edges: 4,096 values, blocks of 256
    [(256, 256), (256,), (256, 256), (256,)], [(5000,)], [(64, 64)], [(63, 65)],
    [(1, 5000)], [(300, 20), (20,), (7, 9)]]


def adafactor_after_step(shapes, momentum):
    from transformers.optimization import Adafactor

    return one_step(lambda parameters: Adafactor(
        parameters, lr=1e-3, relative_step=False, scale_parameter=False,
        warmup_init=False, beta1=0.9 if momentum else None), shapes)


def adamw8bit_after_step(shapes):
    # importing bitsandbytes logs a warning about 4-bit matrix products on CPUs with
    # AVX512-BF16 (lesson 4 explains it): these checks use none, so it is held back
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import bitsandbytes
    finally:
        logger.setLevel(level)
    return one_step(bitsandbytes.optim.AdamW8bit, shapes)


def factored(shape):  # a matrix's second moment: one value per row and per column
    return sum(shape) if len(shape) == 2 else math.prod(shape)


def eight_bit(n, block=256):  # two uint8 states and a float32 scale per block each
    return 2 * n + 2 * 4 * math.ceil(n / block) if n >= 4096 else 8 * n


def tables(shapes):  # qmap1 and qmap2, 256 float32 each, shared by every 8-bit state
    return 2048 if max(map(math.prod, shapes)) >= 4096 else 0


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
      lambda shapes, momentum: sum(4 * factored(s) + 4 for s in shapes)),
     ("exp_avg, the first moment, is not factored: a full float32 tensor.",
      lambda shapes, momentum: sum(
          4 * (1 + momentum) * factored(s) + 4 for s in shapes))],
    lambda measured, cases: (f"your Adafactor predictions match {len(cases)} real "
                             "steps, with momentum and without."))

ADAMW8BIT_STATE = prediction(
    "4.4", "adamw8bit_state_bytes", adamw8bit_after_step,
    [(str(shapes), (shapes,)) for shapes in STATE_SHAPE_LISTS],
    [("add the two lookup tables, qmap1 and qmap2: 2 x 256 float32, once.",
      lambda shapes: sum(eight_bit(math.prod(s)) for s in shapes)),
     ("count the lookup tables (2,048 bytes) once: every state shares them.",
      lambda shapes: sum(eight_bit(n) + 2048 * (n >= 4096)
                         for n in map(math.prod, shapes))),
     ("a last, partial block of 256 has its own scale: round the blocks up.",
      lambda shapes: tables(shapes) + sum(2 * n + 8 * (n // 256) if n >= 4096
                                          else 8 * n for n in map(math.prod, shapes))),
     ("4,096 values already get 8-bit states; float32 is for fewer.",
      lambda shapes: sum(eight_bit(n) if n != 4096 else 8 * n
                         for n in map(math.prod, shapes))
      + (2048 if max(map(math.prod, shapes)) > 4096 else 0))],
    lambda measured, cases: (f"your 8-bit AdamW predictions match {len(cases)} real "
                             "steps, at the edges too (4,096 values, partial blocks)."))


def state_verdict(adafactor_state_bytes, adamw8bit_state_bytes):
    """The Verdict on the first function that is not right, else on both."""
    first = core.check(ADAFACTOR_STATE, adafactor_state_bytes)
    if first.status != core.CORRECT:
        return first
    second = core.check(ADAMW8BIT_STATE, adamw8bit_state_bytes)
    return second if second.status != core.CORRECT else core.Verdict(
        "4.4", core.CORRECT, f"{first.message} Y{second.message[1:]}")


def check_adafactor_and_8bit_state(adafactor_state_bytes, adamw8bit_state_bytes):
    """``adafactor_state_bytes(shapes, momentum)`` and
    ``adamw8bit_state_bytes(shapes)``, float32 parameters: prints the verdict."""
    print(state_verdict(adafactor_state_bytes, adamw8bit_state_bytes))


check_adafactor_and_8bit_state.verdict = state_verdict
