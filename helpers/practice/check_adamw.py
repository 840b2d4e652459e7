"""Checks for notebooks/practice/04_adamw_practice.ipynb (lesson 04).

Every check measures the real thing: torch.optim.AdamW, transformers' Adafactor and
bitsandbytes' AdamW8bit each take a step on parameters of the given shapes, and their
state is weighed as the lesson weighs it
(``helpers.optimizer_state.optimizer_state_size``). Bytes follow from shapes and dtypes
alone, so the checks run on the CPU (or, for a 7B model, on the meta device: shapes and
dtypes, no memory) and compare a prediction with the measurement exactly, on any
machine. The learner's function, too, runs on the meta device for the 7B model: one that
measures instead of predicting would otherwise allocate tens of GB. Exercise 4.3
compares a step with torch.optim.AdamW's, to a relative 1e-5, with gradients of about 1
and of about 1e-5 (where eps counts).

A wrong answer is compared with typical mistakes, each written as a function of the
shapes (4.3: as a step); the first mistake that reproduces every answer names the cause
in the hint.
"""
import contextlib
import functools
import logging
import math

import torch

# a module: the tests replace its function to break a check on purpose
from helpers import optimizer_state
from helpers.practice.verdicts import (
    Wrong,
    call_learner,
    checker,
    on_one_thread,
    require_callable,
    whole_number,
)
from helpers.units import GiB, MiB

DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what 4.1 and 4.2 try


def numel(shape):
    return math.prod(shape)  # 1 for a 0-dimensional shape ()


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def one_step(make_optimizer, shapes, dtype=torch.float32, device="cpu"):
    """(parameters, optimizer) after one step of ``make_optimizer(parameters)`` on
    parameters of these shapes.

    The gradients come from a real backward pass, so they have the dtype autograd gives
    them. The values do not matter: an optimizer's state has the same tensors, shapes
    and dtypes whatever they are.
    """
    parameters = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))
                  for shape in shapes]
    sum((p * 1e-3).sum() for p in parameters).backward()  # every gradient 1e-3
    optimizer = make_optimizer(parameters)
    optimizer.step()
    return parameters, optimizer


def state_entries(optimizer):
    """{'entry (dtype)': bytes} over every parameter's state: what a generic hint shows.
    Shared memory counted once."""
    entries, seen = {}, set()
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and optimizer_state.memory_key(value) not in seen:
                seen.add(optimizer_state.memory_key(value))
                name = f"{key} ({dtype_name(value.dtype)})"
                entries[name] = entries.get(name, 0) + value.untyped_storage().nbytes()
    return entries


def entries_text(entries):
    return ", ".join(f"{name} {n:,}" for name, n in entries.items())


def judge_predictions(cases, answers, mistakes, name):
    """Raise Wrong, naming the cause, unless every answer equals its case's measured
    bytes.

    ``cases``: dicts with the case's ``args`` (passed to the learner's function),
    ``label``, ``measured`` bytes and ``entries``. ``mistakes``: (function of the same
    args, hint) pairs, tried in order; the first that reproduces every answer names the
    cause.
    """
    wrong = [(case, answer) for case, answer in zip(cases, answers)
             if answer != case["measured"]]
    if not wrong:
        return
    case, answer = wrong[0]
    said = (f"on {case['label']}, {name} gave {answer:,} bytes; measured: "
            f"{case['measured']:,}")
    for mistake, hint in mistakes:
        if all(mistake(*c["args"]) == a for c, a in zip(cases, answers)):
            raise Wrong(f"{said}. Hint: {hint}")
    raise Wrong(f"{said}: {entries_text(case['entries'])}. Hint: find the rule behind "
                "those entries, "
                "then check it on this case.")


def fresh(args):
    """The arguments with a copy of the shapes list: what a learner's function does to
    it stays there."""
    shapes, *rest = args
    return (list(shapes), *rest)


ON_THE_META_DEVICE = (
    "the check calls your function on Llama-2-7B's shapes inside "
    "torch.device(\"meta\"), PyTorch's meta "
    "device, where a tensor has a shape and a dtype but no values: real tensors of a "
    "7B model would take "
    "tens of GB here. Anything that needs a tensor's values fails there: .item(), "
    "int(tensor), .tolist(), "
    "or bitsandbytes' AdamW8bit, which fills its lookup tables with values when it is "
    "created. Predict "
    "with Python numbers instead: math.prod(shape) values in a tensor of that shape.")


def on_llama(function, args, name):
    """``function(*args)`` for the 7B case, on the meta device; Wrong, saying so, if
    that is what broke it.

    A learner who measures instead of predicting would allocate tens of GB on a 7B
    model's shapes; on the meta device, tensors made inside their function take no
    memory. What needs values (``.item()``) fails there: the hint then explains the meta
    device instead of "run it on its own".
    """
    with torch.device("meta"):
        return call_learner(function, *fresh(args), name=name,
                            hints=[("meta", ON_THE_META_DEVICE),
                                   ("", "run it on its own, on "
                                        "llama_shapes(**LLAMA_2_7B), to see the full "
                                        "error. The check runs this case inside "
                                        "torch.device(\"meta\"), "
                                        "where tensors have no values.")])


def whole_bytes(answer, name, large=False):
    """``answer`` as an int (``whole_number``); for the 7B case a tensor without a value
    says why it has none."""
    if large and torch.is_tensor(answer) and answer.is_meta:
        raise Wrong(f"{name} is a tensor without a value, {answer!r}. Hint: "
                    f"{ON_THE_META_DEVICE}")
    return whole_number(answer, name)


def learner_bytes(function, args, name, large=False):
    """The learner's prediction for one case, as a whole number of bytes.

    ``large``: the shapes are a 7B model's, and the function runs on the meta device
    (``on_llama``).
    """
    answer = (on_llama(function, args, name) if large
              else call_learner(function, *fresh(args), name=name))
    return whole_bytes(answer, f"{name}'s answer", large)


# --- 4.1: AdamW's state, to the byte
# -------------------------------------------------------------

def adamw(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)


ADAMW_CASES = [  # (label, shapes): one list of each kind a learner might get wrong
    ("an attention projection and its bias", [(768, 768), (768,)]),
    ("a 3-dimensional and a 0-dimensional tensor", [(4, 6, 8), (), (5,)]),
    ("one matrix", [(300, 64)]),
]


def measured_adamw_cases():
    """One case per shape list and dtype: AdamW after one step, weighed by the lesson's
    optimizer_state_size."""
    cases = []
    for label, shapes in ADAMW_CASES:
        for dtype in DTYPES:
            _, optimizer = one_step(adamw, shapes, dtype)
            cases.append(
                {"args": (shapes, dtype),
                 "measured": optimizer_state.optimizer_state_size(optimizer)[1],
                 "entries": state_entries(optimizer),
                 "label": f"{label} {shapes} in {dtype_name(dtype)}"}
            )
    return cases


def values(shapes):
    return sum(numel(shape) for shape in shapes)


# torch/optim/adam.py, _init_group: `step` is a 0-dimensional float32 tensor
STEP_BYTES = 4
ADAMW_MISTAKES = [
    (lambda shapes, dtype: 2 * values(shapes) * dtype.itemsize,
     "the two EMAs are right, but AdamW also keeps a `step` counter for every "
     "parameter tensor: a " "0-dimensional float32 tensor, 4 bytes per tensor."),
    (lambda shapes, dtype: 8 * values(shapes) + STEP_BYTES * len(shapes),
     "that is right for float32 only. AdamW creates both EMAs with "
     "torch.zeros_like(param): they take the "
     "parameter's dtype, 2 bytes per value in bfloat16 or float16 (use "
     "dtype.itemsize)."),
    (lambda shapes, dtype: 8 * values(shapes),
     "that is the lesson's 8 bytes per parameter, which holds for float32 only and "
     "leaves out the step "
     "counters. Both EMAs take the parameter's dtype (torch.zeros_like(param)), and "
     "every parameter tensor "
     "also has a `step` counter, a 0-dimensional float32 tensor of 4 bytes."),
    (lambda shapes, dtype: (2 * values(shapes) + len(shapes)) * dtype.itemsize,
     "the EMAs are right, the step counters are not: `step` is float32 (4 "
     "bytes) whatever the " "parameter's dtype."),
    (
        lambda shapes, dtype: (
            2 * values(shapes) * dtype.itemsize + STEP_BYTES * values(shapes)
        ),
        "there is one `step` counter per parameter tensor, not one per value.",
    ),
    (lambda shapes, dtype: 2 * values(shapes) * dtype.itemsize + STEP_BYTES,
     "there is one `step` counter per parameter tensor, not one for the "
     "whole optimizer."),
    (
        lambda shapes, dtype: (
            values(shapes) * dtype.itemsize + STEP_BYTES * len(shapes)
        ),
        "that is one EMA; AdamW keeps two for every value: exp_avg and exp_avg_sq.",
    ),
    (
        lambda shapes, dtype: (
            4 * values(shapes) * dtype.itemsize + STEP_BYTES * len(shapes)
        ),
        "that counts the weights and the gradients too; the optimizer's state is "
        "exp_avg, exp_avg_sq and step.",
    ),
    (
        lambda shapes, dtype: sum(
            2 * sum(shape) * dtype.itemsize + STEP_BYTES for shape in shapes
        ),
        "a tensor holds the product of its dimensions, math.prod(shape) "
        "values, not their sum.",
    ),
    (lambda shapes, dtype: 16 * values(shapes),
     "that is weights + gradients + state in float32; the question asks for the "
     "optimizer's state only, " "in the parameters' dtype."),
]


@checker("4.1")
@on_one_thread
def check_optimizer_state_size(adamw_state_bytes):
    """``adamw_state_bytes(shapes, dtype)``: the bytes of torch.optim.AdamW's state
    after its first step."""
    require_callable(adamw_state_bytes, "adamw_state_bytes")
    cases = measured_adamw_cases()
    answers = [learner_bytes(adamw_state_bytes, case["args"], "adamw_state_bytes")
               for case in cases]
    judge_predictions(cases, answers, ADAMW_MISTAKES, "adamw_state_bytes")
    shown = {
        dtype_name(case["args"][1]): case["measured"] for case in cases[: len(DTYPES)]
    }
    return (f"your predictions match the measured state in all {len(cases)} cases. For "
            f"{ADAMW_CASES[0][0]}: "
            + ", ".join(f"{n:,} bytes in {d}" for d, n in shown.items())
            + ": two EMAs in the parameters' dtype, and a 4-byte `step` per tensor.")


# --- 4.2: a 7B model's training memory
# -----------------------------------------------------------

LLAMA_2_7B = {"vocab_size": 32_000, "hidden_size": 4_096, "intermediate_size": 11_008,
              # Llama-2-7B's sizes (its config.json on the Hugging Face Hub)
              "num_hidden_layers": 32}


def llama_shapes(vocab_size, hidden_size, intermediate_size, num_hidden_layers):
    """Parameter shapes of transformers' LlamaForCausalLM (no biases, embeddings not
    tied), in order.

    Per layer: q, k, v and o projections (hidden x hidden), the gated feed-forward (gate
    and up: intermediate x hidden, down: hidden x intermediate) and two RMSNorm weights;
    then the final norm and the output layer. tests/test_practice_04.py compares them
    with the model built on the meta device.
    """
    h, i = hidden_size, intermediate_size
    layer = [(h, h)] * 4 + [(i, h), (i, h), (h, i)] + [(h,), (h,)]
    return [(vocab_size, h), *layer * num_hidden_layers, (h,), (vocab_size, h)]


PARTS = ("weights", "gradients", "optimizer state")


def measured_training_bytes(shapes, dtype, device):
    """{part: bytes} of a real backward pass and AdamW step: weights, their gradients
    and AdamW's state.

    On the meta device tensors have shapes and dtypes but no memory, so bytes are numel
    x element_size (AdamW's state tensors share no memory; its `step` counters stay on
    the CPU).
    """
    parameters, optimizer = one_step(adamw, shapes, dtype, device)

    def weigh(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    state = [v for s in optimizer.state.values() for v in s.values()]
    gradients = [p.grad for p in parameters]
    return {"weights": weigh(parameters), "gradients": weigh(gradients),
            "optimizer state": weigh(state)}


# (label, shapes, device, dtypes): float16 has bfloat16's bytes, so the 7B skips it
TRAINING_CASES = [
    ("an attention projection and its bias", ADAMW_CASES[0][1], "cpu", DTYPES),
    ("Llama-2-7B (on the meta device)", llama_shapes(**LLAMA_2_7B), "meta", DTYPES[:2]),
]


# the same on every call (the 7B's backward and step take a second): measured once
@functools.cache
def measured_training_cases():
    return tuple(
        {"args": (shapes, dtype),
         "measured": measured_training_bytes(shapes, dtype, device),
         "label": f"{label} in {dtype_name(dtype)}", "7B": device == "meta"}
        for label, shapes, device, dtypes in TRAINING_CASES
        for dtype in dtypes
    )


PART_MISTAKES = {
    "weights": [(lambda shapes, dtype: 4 * values(shapes),
                 "a weight takes its dtype's bytes: 4 in float32, 2 in bfloat16 or "
                 "float16 (dtype.itemsize).")],
    "gradients": [(lambda shapes, dtype: 4 * values(shapes),
                   "a gradient has its parameter's dtype (backward writes p.grad in "
                   "p's dtype): 2 bytes per "
                   "value for a bfloat16 or float16 model, not 4."),
                  (lambda shapes, dtype: 0,
                   "the gradients are there too: backward fills p.grad for every "
                   "parameter, and they stay "
                   "until the optimizer has used them.")],
    "optimizer state": ADAMW_MISTAKES,
}


def training_answer(training_bytes, case):
    """{part: whole number of bytes}: the learner's answer for one case (the 7B on the
    meta device)."""
    if case["7B"]:
        answer = on_llama(training_bytes, case["args"], "training_bytes")
    else:
        answer = call_learner(
            training_bytes, *fresh(case["args"]), name="training_bytes"
        )
    if not isinstance(answer, dict) or set(PARTS) - set(answer):
        raise Wrong("training_bytes should return a dict with the keys "
                    f"{', '.join(repr(p) for p in PARTS)}, "
                    f"but on {case['label']} it returned {answer!r}.")
    return {
        part: whole_bytes(answer[part], f"training_bytes(...)[{part!r}]", case["7B"])
        for part in PARTS
    }


@checker("4.2")
@on_one_thread
def check_training_memory(training_bytes):
    """``training_bytes(shapes, dtype)``: {'weights', 'gradients', 'optimizer state'},
    bytes for AdamW training."""
    require_callable(training_bytes, "training_bytes")
    cases = measured_training_cases()
    answers, failed_on_llama = [], None
    for case in cases:
        try:
            answers.append(training_answer(training_bytes, case))
        except Wrong as reason:
            if not case["7B"]:
                raise
            # the small cases are judged first: a wrong rule is the first thing to fix
            failed_on_llama = reason
            break
    for part in PARTS:
        measured = [
            {**case, "measured": case["measured"][part],
             "entries": {part: case["measured"][part]}}
            for case in cases[: len(answers)]
        ]
        judge_predictions(measured, [answer[part] for answer in answers],
                          PART_MISTAKES[part], f"training_bytes(...)[{part!r}]")
    if failed_on_llama:
        raise Wrong(f"your parts match the measured ones on {TRAINING_CASES[0][0]}, "
                    "but not on Llama-2-7B's "
                    f"shapes: {failed_on_llama}")
    llama = {
        dtype_name(case["args"][1]): case["measured"] for case in cases if case["7B"]
    }
    n = values(TRAINING_CASES[1][1])
    lines = [f"{d}: " + " + ".join(f"{parts[p] / n:.2f}" for p in PARTS)
             + f" = {sum(parts.values()) / n:.2f} bytes per parameter, "
               f"{sum(parts.values()) / GiB:.1f} GiB"
             for d, parts in llama.items()]
    return (f"your parts match the measured ones in all {len(cases)} cases. "
            f"Llama-2-7B's {n:,} parameters, " "weights + gradients + AdamW's state: "
            + "; ".join(lines) + ". Activations come on top.")


# --- 4.3: find the bug in an AdamW step
# -----------------------------------------------------------

# lr x weight_decay large enough to see
HYPER = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
STEPS = 10
# gradients of about 1, and tiny ones, where eps counts
GRADIENT_SCALES = USUAL, TINY_SCALE = (1.0, 1e-5)
# float32 rounding after 10 steps, for values of about 1 (the parameter's)
RTOL, ATOL = 1e-5, 1e-7
# exp_avg has the gradients' size and exp_avg_sq their square's: their ATOL is ATOL x
# scale and ATOL x scale**2, the same tolerance relative to the values compared. The
# right answers in tests/test_practice_04.py stay within a fifth of it; each near miss
# there is at least 300 times beyond it, in one of the runs.


def random_run(scale=1.0):
    """A parameter and STEPS gradients of about ``scale``, from the check's own
    generator (the learner's stays untouched). Both runs draw the same numbers: only the
    gradients' size differs."""
    generator = torch.Generator().manual_seed(0)
    parameter = torch.randn(6, 4, generator=generator)
    return parameter, [
        scale * torch.randn(6, 4, generator=generator) for _ in range(STEPS)
    ]


def torch_adamw_run(scale, **hyper):
    """(parameter, exp_avg, exp_avg_sq, step) after torch.optim.AdamW's steps: the
    intended result."""
    start, gradients = random_run(scale)
    parameter = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.AdamW([parameter], **hyper)
    for gradient in gradients:
        parameter.grad = gradient.clone()
        optimizer.step()
    state = optimizer.state[parameter]
    return (parameter.detach(), state["exp_avg"], state["exp_avg_sq"],
            float(state["step"]))


def step_function_run(step_function, scale, **hyper):
    """(parameter, exp_avg, exp_avg_sq, step) after ``step_function(param, grad, state,
    **hyper)`` steps."""
    parameter, gradients = random_run(scale)
    state = {}
    for gradient in gradients:
        step_function(parameter, gradient.clone(), state, **hyper)
    missing = {"step", "exp_avg", "exp_avg_sq"} - set(state)
    if missing:
        raise Wrong(f"after {STEPS} steps `state` has no "
                    f"{', '.join(sorted(missing))}. Hint: keep the state "
                    "in the dict the step receives, as colleague_step does "
                    "(state['exp_avg'], ...).")
    return parameter, state["exp_avg"], state["exp_avg_sq"], float(state["step"])


def runs(step_function):
    """{gradient scale: (parameter, exp_avg, exp_avg_sq, step)} after
    ``step_function``'s steps, HYPER."""
    return {scale: step_function_run(step_function, scale, **HYPER)
            for scale in GRADIENT_SCALES}


def close(yours, expected, scale):
    """Whether the parameter, exp_avg and exp_avg_sq of two runs with gradients of about
    ``scale`` agree."""
    return all(torch.allclose(mine, intended, rtol=RTOL, atol=ATOL * scale**power)
               for mine, intended, power in zip(yours[:3], expected[:3], (0, 1, 2)))


def all_close(yours, expected):
    return all(close(yours[scale], expected[scale], scale) for scale in GRADIENT_SCALES)


def adamw_variant(decay="decoupled", eps_at="after_root"):
    """colleague_step with its decay and eps written one way: AdamW's by default, or one
    of STEP_MISTAKES."""
    def step(param, grad, state, lr, betas, eps, weight_decay):
        beta1, beta2 = betas
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(param),
                         exp_avg_sq=torch.zeros_like(param))
        state["step"] += 1
        if decay in ("decoupled", "both"):
            param.mul_(1 - lr * weight_decay)
        elif decay == "without_lr":
            param.mul_(1 - weight_decay)
        if decay in ("coupled", "both"):
            grad = grad.add(param, alpha=weight_decay)
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1, bias_correction2 = (1 - beta1 ** state["step"],
                                              1 - beta2 ** state["step"])
        root = state["exp_avg_sq"].sqrt()
        # torch.optim.AdamW's
        denominator = {
            "after_root": root / math.sqrt(bias_correction2) + eps,
            "inside_root": (state["exp_avg_sq"] / bias_correction2 + eps).sqrt(),
            "before_bias_correction": (root + eps) / math.sqrt(bias_correction2),
            "none": root / math.sqrt(bias_correction2),
        }[eps_at]
        param.addcdiv_(state["exp_avg"], denominator, value=-lr / bias_correction1)
        if decay == "after_update":
            param.mul_(1 - lr * weight_decay)
    return step


TINY_SIZE = f"{TINY_SCALE:.0e}".replace("e-0", "e-")  # 1e-5
TINY = f"with gradients of about {TINY_SIZE} (the check's second run)"
STEP_MISTAKES = [  # (how adamw_variant writes the mistake, hint)
    (dict(decay="coupled"),
     "this step still adds weight_decay x param to the gradient: that is Adam's "
     "L2 penalty (what "
     "torch.optim.Adam does with weight_decay). The decay is then divided by "
     "sqrt(exp_avg_sq) like the "
     "gradient: a weight with large gradients is hardly decayed, and with a zero "
     "gradient every weight "
     "shrinks by about lr, whatever its size. AdamW decouples it: param *= 1 - lr x "
     "weight_decay, and the "
     "gradient is left alone."),
    (dict(decay="both"),
     "you added AdamW's decoupled decay but kept the line that adds weight_decay x "
     "param to the gradient, so "
     "the weights decay twice. Remove that line."),
    (dict(decay="none"),
     "there is no weight decay now. AdamW shrinks the parameter itself, param *= 1 - "
     "lr x weight_decay, before "
     "the Adam update, in place (param.mul_), so that the caller's tensor changes."),
    (dict(decay="without_lr"),
     "AdamW's decay is scaled by the learning rate: param *= 1 - lr x weight_decay, "
     "not 1 - weight_decay."),
    (dict(decay="after_update"),
     "the decay comes after the Adam update here, so it shrinks the updated weight. "
     "AdamW (torch.optim.AdamW, "
     "and the paper) decays the weight of the previous step, before the update."),
    (dict(eps_at="inside_root"),
     "the decay is right, but eps is inside the square root here: sqrt(exp_avg_sq / "
     "bias_correction2 + eps). "
     "torch.optim.AdamW adds it outside, sqrt(exp_avg_sq) / sqrt(bias_correction2) + "
     "eps, as colleague_step "
     f"does. {TINY[0].upper() + TINY[1:]} that matters: sqrt(1e-8) = 1e-4 is ten "
     "times the gradients."),
    (dict(eps_at="before_bias_correction"),
     "the decay is right, but eps is added before the division by "
     "sqrt(bias_correction2) here: "
     "(sqrt(exp_avg_sq) + eps) / sqrt(bias_correction2). torch.optim.AdamW adds it "
     "after, as colleague_step "
     "does: sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps. The "
     f"difference shows {TINY}."),
    (dict(eps_at="none"),
     "the decay is right, but the denominator has no eps: torch.optim.AdamW adds it, "
     "sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps, as colleague_step does. "
     f"It shows {TINY}."),
]


@contextlib.contextmanager
def calls_to_torch_adam():
    """Yield a list that records each call, inside the block, of PyTorch's own Adam
    update.

    torch.optim.Adam's and AdamW's step, and the functional torch.optim.adam.adam, all
    hand the update to one of these three functions of torch/optim/adam.py, which
    ``adam`` looks up in its module when called.
    """
    from torch.optim import adam as module

    names = ("_single_tensor_adam", "_multi_tensor_adam", "_fused_adam")
    originals = {name: getattr(module, name) for name in names}
    calls = []

    def recording(name, original):
        @functools.wraps(original)
        def recorded(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)
        return recorded

    for name, original in originals.items():
        setattr(module, name, recording(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


def decay_factors(fixed_step, steps=3):
    """What the learner's step multiplies each weight by in each of its first steps,
    with a zero gradient.

    A zero gradient keeps both EMAs at zero, so Adam's update is 0 / eps = 0: only the
    weight decay acts.
    """
    parameter, _ = random_run()
    state, factors = {}, []
    for _ in range(steps):
        before = parameter.clone()
        call_learner(fixed_step, parameter, torch.zeros_like(parameter), state,
                     name="fixed_step", **HYPER)
        factors.append(parameter / before)
    return factors


def wrong_decay(fixed_step):
    """Wrong, saying how the step decays the weights with a zero gradient, compared with
    AdamW's decay."""
    lr, weight_decay = HYPER["lr"], HYPER["weight_decay"]
    intended = 1 - lr * weight_decay
    factors = decay_factors(fixed_step)
    adamw_rule = ("AdamW multiplies every weight by 1 - lr x weight_decay = "
                  f"{intended:g} at every step "
                  f"(lr {lr:g}, weight_decay {weight_decay:g})")
    if not all(torch.allclose(f, f.flatten()[:1].expand_as(f), rtol=RTOL, atol=0)
               for f in factors):
        low, high = factors[0].min().item(), factors[0].max().item()
        raise Wrong("the EMAs are right, the parameter is not. With a zero gradient, "
                    "where only the weight decay "
                    "acts, your step does not multiply all weights by one factor: in "
                    "its first step the factors "
                    f"run from {low:.5f} to {high:.5f}. {adamw_rule}, so each weight "
                    "shrinks in proportion to its "
                    "size. Hint: param *= 1 - lr x weight_decay, before the update.")
    per_step = [f.flatten()[0].item() for f in factors]
    if all(math.isclose(f, intended, rel_tol=RTOL) for f in per_step):
        raise Wrong("the EMAs are right, the parameter is not. With a zero gradient "
                    "your step shrinks the weights "
                    f"as AdamW does (x {intended:g} per step), so the difference lies "
                    "in the Adam update. Hint: "
                    "start again from colleague_step and change only how "
                    "weight_decay is applied.")
    raise Wrong("the EMAs are right, the parameter is not. With a zero gradient, "
                "where only the weight decay "
                "acts, your step multiplies the weights by "
                f"{', '.join(f'{f:.5f}' for f in per_step)} in its "
                f"first {len(per_step)} steps; {adamw_rule}. Hint: param *= 1 - lr x "
                "weight_decay, before the "
                "update, at every step.")


@checker("4.3")
@on_one_thread
def check_fixed_step(fixed_step):
    """``fixed_step(param, grad, state, lr, betas, eps, weight_decay)``: colleague_step
    with AdamW's decay."""
    require_callable(fixed_step, "fixed_step")
    expected = {scale: torch_adamw_run(scale, **HYPER) for scale in GRADIENT_SCALES}
    with calls_to_torch_adam() as torch_adam_calls:
        yours = call_learner(runs, fixed_step, name="fixed_step")
    if yours[USUAL][3] != expected[USUAL][3]:
        raise Wrong(f"state['step'] is {yours[USUAL][3]:g} after {STEPS} steps. Hint: "
                    "add 1 to it at every step, "
                    "as colleague_step does.")
    if all_close(yours, expected):
        note = (" Note: your step calls PyTorch's own Adam update "
                "(torch/optim/adam.py), so it matches by "
                "construction; to practise finding the bug, write the step out, as "
                "colleague_step does."
                if torch_adam_calls else "")
        return (f"after {STEPS} steps, with gradients of about 1 and of about "
                f"{TINY_SIZE}, your "
                "parameter, exp_avg and exp_avg_sq match torch.optim.AdamW's. The "
                "decay now shrinks each weight "
                "in proportion to its size, outside the adaptive update." + note)
    start, _ = random_run()
    if torch.equal(yours[USUAL][0], start):
        raise Wrong(f"after {STEPS} steps the parameter your step was given is "
                    "unchanged. Hint: `param = param * "
                    "(1 - lr * weight_decay)`, or working on a copy, gives the name "
                    "param a new tensor, which the "
                    "caller never sees (nor the update that follows). Change the "
                    "given tensor in place: "
                    "param.mul_(1 - lr * weight_decay).")
    for variant, hint in STEP_MISTAKES:
        if all_close(yours, runs(adamw_variant(**variant))):
            raise Wrong(hint)
    if torch.count_nonzero(yours[USUAL][1]) == 0:
        raise Wrong("exp_avg is still all zeros. Hint: update the state's tensors in "
                    "place (lerp_, mul_, "
                    "addcmul_); `exp_avg = ...` only gives a new tensor a local name.")
    if not all(torch.allclose(x, y, rtol=RTOL, atol=ATOL * scale**power)
               for scale in GRADIENT_SCALES
               for x, y, power in zip(yours[scale][1:3], expected[scale][1:3], (1, 2))):
        raise Wrong("your EMAs differ from torch.optim.AdamW's, so more than the "
                    "decay changed. Hint: start "
                    "again from colleague_step and change only how "
                    "weight_decay is applied.")
    if close(yours[USUAL], expected[USUAL], USUAL):
        raise Wrong("your step matches torch.optim.AdamW with gradients of about 1, "
                    f"but not {TINY}, where eps "
                    "weighs in the denominator. Hint: keep eps where "
                    "colleague_step has it: "
                    "sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps.")
    wrong_decay(fixed_step)


# --- 4.4: Adafactor's and 8-bit AdamW's state
# -----------------------------------------------------

@contextlib.contextmanager
def quiet_bitsandbytes_import():
    """Import bitsandbytes without its CPU backend's warning about a 4-bit kernel
    (lesson 4 explains it).

    bitsandbytes/backends/cpu/ops.py logs it on CPUs with AVX512-BF16, about 4-bit
    matrix products, which these checks do not use; the 8-bit optimizer's CPU update is
    unaffected. The logger's level is restored afterwards.
    """
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def make_adafactor(momentum):
    from transformers.optimization import Adafactor

    return lambda parameters: Adafactor(parameters, lr=1e-3, relative_step=False,
                                        scale_parameter=False, warmup_init=False,
                                        beta1=0.9 if momentum else None)


def make_adamw8bit():
    with quiet_bitsandbytes_import():
        import bitsandbytes as bnb
    return lambda parameters: bnb.optim.AdamW8bit(parameters, lr=1e-3)


# 1-D and 2-D shapes: each list tests a rule (below: 4,096 values, blocks of 256)
FACTORED_CASES = [
    ("two 256 x 256 projections and their biases",
     [(256, 256), (256,), (256, 256), (256,)]),
    ("a vector of 5,000 values", [(5000,)]),
    ("a 64 x 64 matrix (4,096 values)", [(64, 64)]),
    # with the 4,096 above: the threshold, to the value
    ("a 63 x 65 matrix (4,095 values)", [(63, 65)]),
    ("a 1 x 5,000 matrix", [(1, 5000)]),
    ("three small tensors", [(300, 20), (20,), (7, 9)]),
]


def measured_state_cases(make_optimizer, args_of):
    """One case per shape list of FACTORED_CASES and per ``args_of(shapes)``: the state
    after one real step."""
    cases = []
    for label, shapes in FACTORED_CASES:
        for args in args_of(shapes):
            _, optimizer = one_step(make_optimizer(*args[1:]), shapes)
            extra = "" if len(args) == 1 else f" with momentum={args[1]}"
            cases.append(
                {"args": args,
                 "measured": optimizer_state.optimizer_state_size(optimizer)[1],
                 "entries": state_entries(optimizer),
                 "label": f"{label} {shapes}{extra}"}
            )
    return cases


def adafactor_rule(rms=4, step=0, factor_matrices=True, factor_vectors=False,
                   momentum_bytes=4, momentum_factored=False, momentum_always=False):
    """transformers' Adafactor state in bytes, float32 parameters: a mistake model for
    the hints.

    With the defaults it gives the measured bytes; each mistake in ADAFACTOR_MISTAKES
    changes one setting.
    """
    def rule(shapes, momentum=False):
        total = 0
        for shape in shapes:
            if len(shape) == 2:  # a matrix: one value per row and one per column
                second = sum(shape) if factor_matrices else numel(shape)
                first = sum(shape) if momentum_factored else numel(shape)
            else:  # a vector: one value per entry (taken as 1 x n when factor_vectors)
                second = numel(shape) + (1 if factor_vectors else 0)
                first = numel(shape)
            has_momentum = momentum or momentum_always
            total += (4 * second + rms + step
                      + (momentum_bytes * first if has_momentum else 0))
        return total
    return rule


ADAFACTOR_MISTAKES = [
    (adafactor_rule(rms=0), "every tensor also keeps RMS, its root mean square: a "
                            "0-dimensional float32 "
                            "tensor, 4 bytes per tensor."),
    (adafactor_rule(step=4), "`step` is a Python int in Adafactor's state, not a "
                             "tensor: it holds no tensor "
                             "bytes (optimizer_state_size skips it)."),
    (adafactor_rule(factor_matrices=False), "a matrix keeps its second moment "
                                            "factored: exp_avg_sq_row and "
                                            "exp_avg_sq_col, one float32 per row and "
                                            "one per column, not a value "
                                            "per entry."),
    (adafactor_rule(momentum_bytes=0), "with momentum (beta1 set) Adafactor also "
                                       "keeps exp_avg, a full float32 "
                                       "tensor: 4 bytes per value."),
    (adafactor_rule(momentum_factored=True), "exp_avg, the first moment, is not "
                                             "factored: it is a full float32 "
                                             "tensor, 4 bytes per value."),
    (adafactor_rule(momentum_always=True), "without momentum (beta1=None, the "
                                           "default) there is no exp_avg: "
                                           "only the factored second moment and RMS."),
    (adafactor_rule(factor_vectors=True), "a vector's second moment is not factored: "
                                          "exp_avg_sq, one float32 "
                                          "per value."),
]


def adamw8bit_rule(threshold=4096, below_is_float32=True, block=256, round_up=True,
                   scales=2, tables=2048, tables_per_tensor=False, tables_always=False,
                   step=0):
    """bitsandbytes' AdamW8bit state in bytes, float32 parameters: a mistake model for
    the hints.

    With the defaults it gives the measured bytes; each mistake in ADAMW8BIT_MISTAKES
    changes one setting.
    """
    def rule(shapes):
        total, eight_bit = 0, 0
        for shape in shapes:
            n = numel(shape)
            if n < threshold and below_is_float32:
                total += 2 * 4 * n + step
                continue
            eight_bit += 1
            blocks = n // block + (bool(n % block) if round_up else 0)
            total += 2 * n + scales * 4 * blocks + step
        if eight_bit and tables_per_tensor:
            return total + tables * eight_bit
        return total + (tables if eight_bit or tables_always else 0)
    return rule


ADAMW8BIT_MISTAKES = [
    (adamw8bit_rule(tables=0), "the 8-bit codes index two lookup tables, qmap1 and "
     "qmap2: 256 float32 values "
     "each, 2,048 bytes in all, once for the whole optimizer."),
    (adamw8bit_rule(tables_per_tensor=True), "the two lookup tables (2,048 bytes) are "
     "shared by every tensor's " "state: count them once, as "
     "optimizer_state_size does."),
    (adamw8bit_rule(tables_always=True), "the lookup tables exist only when some "
     "tensor has 8-bit states; " "tensors under 4,096 values keep float32 "
     "states and need none."),
    (adamw8bit_rule(round_up=False), "a last, partial block of 256 values has its own "
     "scale too: round the " "number of blocks up (5,000 values are 20 blocks)."),
    (adamw8bit_rule(block=2048), "bitsandbytes uses blocks of 256 values here (the "
     "paper's 2,048 is not this " "version's): one float32 scale per block and state."),
    (adamw8bit_rule(threshold=4097), "a tensor of exactly 4,096 values already gets "
     "8-bit states: float32 " "states are for tensors under 4,096 values "
     "(min_8bit_size)."),
    (adamw8bit_rule(below_is_float32=False), "tensors under 4,096 values (biases, "
     "LayerNorms, small matrices) " "keep two float32 states: 8 " "bytes per value."),
    (adamw8bit_rule(scales=0), "each block of 256 values also has a float32 scale in "
     "each state, absmax1 and " "absmax2."),
    (adamw8bit_rule(scales=1), "each state has its own scales: absmax1 and absmax2, "
     "one float32 per block each."),
    (adamw8bit_rule(step=4), "`step` is a Python int in bitsandbytes' state, not a "
     "tensor: it holds no tensor " "bytes."),
    *(
        (adamw8bit_rule(threshold=threshold), "the line between float32 and 8-bit "
         "states is elsewhere: a tensor " "gets 8-bit states from 4,096 values up "
         "(min_8bit_size); one of 4,095 " "values keeps two float32 states.")
        for threshold in sorted(
            {n + k for _, shapes in FACTORED_CASES for n in map(numel, shapes)
             for k in (0, 1)}
            # one threshold between each two sizes of the cases: any
            # other is alike
            - {4096}
        )
    ),
]


def size_text(n_bytes):
    return f"{n_bytes / GiB:.2f} GiB" if n_bytes >= GiB else f"{n_bytes / MiB:.1f} MiB"


@checker("4.4")
@on_one_thread
def check_adafactor_and_8bit_state(adafactor_state_bytes, adamw8bit_state_bytes):
    """``adafactor_state_bytes(shapes, momentum)`` and
    ``adamw8bit_state_bytes(shapes)``, float32 parameters.

    Without bitsandbytes (requirements.txt pins it) the 8-bit function is not judged,
    and the verdict says so.
    """
    require_callable(adafactor_state_bytes, "adafactor_state_bytes")
    require_callable(adamw8bit_state_bytes, "adamw8bit_state_bytes")
    try:
        make_adamw8bit()
        judged = {"adafactor_state_bytes": adafactor_state_bytes,
                  "adamw8bit_state_bytes": adamw8bit_state_bytes}
    except ImportError as error:
        judged = {"adafactor_state_bytes": adafactor_state_bytes}
        unchecked = (
            " adamw8bit_state_bytes was not checked: bitsandbytes cannot "
            "be imported here "
            f"({error}); requirements.txt pins it, and `make lab` installs it."
        )
    ways = {
        "adafactor_state_bytes": (make_adafactor,
                                  lambda shapes: [(shapes, False), (shapes, True)],
                                  ADAFACTOR_MISTAKES),
        "adamw8bit_state_bytes": (make_adamw8bit, lambda shapes: [(shapes,)],
                                  ADAMW8BIT_MISTAKES),
    }
    for name, function in judged.items():
        make_optimizer, args_of, mistakes = ways[name]
        cases = measured_state_cases(make_optimizer, args_of)
        answers = [learner_bytes(function, case["args"], name) for case in cases]
        judge_predictions(cases, answers, mistakes, name)
    # too large to measure here: what the checked functions predict
    llama = llama_shapes(**LLAMA_2_7B)
    n = values(llama)
    if len(judged) == 1:
        return ("your Adafactor predictions match the measured states of "
                "every shape list.") + unchecked
    try:
        predicted = {
            "Adafactor": learner_bytes(adafactor_state_bytes, (llama, False),
                                       "adafactor_state_bytes", large=True),
            "Adafactor with momentum": learner_bytes(adafactor_state_bytes,
                                                     (llama, True),
                                                     "adafactor_state_bytes",
                                                     large=True),
            "8-bit AdamW": learner_bytes(
                adamw8bit_state_bytes, (llama,), "adamw8bit_state_bytes", large=True
            ),
        }
    except Wrong as reason:
        raise Wrong("your predictions match the measured states of every shape "
                    "list, but not on "
                    f"Llama-2-7B's shapes: {reason}") from None
    return (
        "your predictions match the measured states of every shape list. Applied "
        "to Llama-2-7B's "
        f"{n:,} parameters, your functions predict "
        + ", ".join(f"{name} {size_text(b)} ({b / n:.3f} bytes per parameter)"
                    for name, b in predicted.items())
        + "; AdamW's float32 state would be 8 bytes per parameter."
    )
