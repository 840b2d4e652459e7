"""Checks for notebooks/practice/04_adamw_practice.ipynb (lesson 04)."""
import copy

import torch

from helpers import optimizer_state  # a module, not its function: exercise 4.3's answer is also optimizer_state_size
from helpers.practice.verdicts import Wrong, call_learner, checker, require_callable, require_done, whole_number
from helpers.units import MiB


def measured_adamw_state_bytes(model):
    """Bytes of every tensor in AdamW's state after one step on a copy of ``model``."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # the state's size does not depend on the gradient's values
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    _, state_bytes = optimizer_state.optimizer_state_size(optimizer)
    return state_bytes


@checker("4.1")
def check_adamw_estimate(model, adamw_estimate_bytes):
    """``adamw_estimate_bytes``: your estimate of AdamW's state for ``model``, in bytes."""
    require_done(adamw_estimate_bytes, "adamw_estimate_bytes", "your estimate in bytes (a formula is fine)")
    if not isinstance(model, torch.nn.Module):
        raise Wrong(f"model should be the tiny DistilBERT (model = build_model(\"tiny\")), but it is a "
                    f"{type(model).__name__}. Hint: run the exercise's first cell again.")
    if isinstance(adamw_estimate_bytes, bool) or not isinstance(adamw_estimate_bytes, (int, float)):
        raise Wrong(f"adamw_estimate_bytes should be a number of bytes, but it is {adamw_estimate_bytes!r}.")
    n_parameters = sum(p.numel() for p in model.parameters())
    measured = measured_adamw_state_bytes(model)
    ratio = adamw_estimate_bytes / measured
    if abs(ratio - 1) <= 0.01:
        return (f"estimate {adamw_estimate_bytes / MiB:.3f} MiB, measured {measured / MiB:.3f} MiB after one "
                f"AdamW step, ratio {ratio:.4f}. The small difference is the step counters: one 4-byte tensor "
                "per parameter tensor.")
    per_parameter = adamw_estimate_bytes / n_parameters
    if adamw_estimate_bytes < 0.01 * measured:
        raise Wrong(f"your estimate is {adamw_estimate_bytes:,.1f}, far below the {measured:,} bytes measured. "
                    "Hint: is it in MiB or in elements? Give bytes: parameters x bytes of state per parameter.")
    hints = {1: "that is one byte per parameter: each EMA value is a float32, 4 bytes.",
             2: "that counts two states per parameter but not their size: each is a float32, 4 bytes.",
             4: "that is one state per parameter; AdamW keeps two EMAs for every parameter.",
             12: "that adds the gradient (4 bytes); the gradient exists with any optimizer, it is not AdamW's state.",
             16: "that is weights + gradients + state; the question asks for the optimizer's state only."}
    hint = hints.get(round(per_parameter), "count the states AdamW keeps for each parameter, and their bytes.")
    raise Wrong(f"your estimate is {per_parameter:.2f} bytes per parameter; measured: {measured / n_parameters:.2f}. "
                f"Hint: {hint}")


def reference_adamw_run(learner_step=None, steps=10, **hyper):
    """(parameter, exp_avg, exp_avg_sq) after ``steps`` steps of torch.optim.AdamW, or of ``learner_step``.

    Both run from the same parameter on the same random gradients, drawn from their own generator.
    """
    generator = torch.Generator().manual_seed(0)
    param = torch.randn(6, 4, generator=generator)
    grads = [torch.randn(6, 4, generator=generator) for _ in range(steps)]
    if learner_step is None:
        reference = torch.nn.Parameter(param.clone())
        optimizer = torch.optim.AdamW([reference], **hyper)
        for grad in grads:
            reference.grad = grad.clone()
            optimizer.step()
        state = optimizer.state[reference]
        return reference.detach(), state["exp_avg"], state["exp_avg_sq"]
    exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
    for step, grad in enumerate(grads, start=1):
        learner_step(param, grad.clone(), exp_avg, exp_avg_sq, step, **hyper)
    return param, exp_avg, exp_avg_sq


def variant_step(no_bias_correction=False, coupled_decay=False, no_decay=False, eps_inside=False):
    """AdamW with one typical mistake, to name the mistake a learner made."""
    def step_fn(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay):
        beta1, beta2 = betas
        if coupled_decay:
            grad = grad + weight_decay * param  # Adam's L2 penalty, not AdamW's decoupled decay
        elif not no_decay:
            param.mul_(1 - lr * weight_decay)
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        c1, c2 = (1.0, 1.0) if no_bias_correction else (1 - beta1**step, 1 - beta2**step)
        denominator = (exp_avg_sq / c2 + eps).sqrt() if eps_inside else (exp_avg_sq / c2).sqrt() + eps
        param.addcdiv_(exp_avg, denominator, value=-lr / c1)
    return step_fn


MISTAKES = {
    "no_bias_correction": "The EMAs are right, but the bias correction is missing: both EMAs start at 0, so divide exp_avg by "
                          "1 - beta1**step and exp_avg_sq by 1 - beta2**step before using them.",
    "coupled_decay": "You added weight_decay x param to the gradient: that is Adam's L2 penalty. AdamW decouples "
                     "it: shrink the parameter itself, param *= 1 - lr x weight_decay, and leave the gradient alone.",
    "no_decay": "The EMAs are right, but the weight decay is missing: AdamW shrinks the parameter, param *= 1 - lr x weight_decay.",
    "eps_inside": "The EMAs are right, but eps is inside the square root; it belongs outside: sqrt(exp_avg_sq / correction2) + eps.",
}
HYPER = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.1)  # large enough to tell mistakes apart


@checker("4.2")
def check_adamw_step(adamw_step):
    """``adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay)``, in place."""
    require_callable(adamw_step, "adamw_step")
    expected = reference_adamw_run(**HYPER)
    yours = call_learner(lambda: reference_adamw_run(adamw_step, **HYPER), name="adamw_step")

    def same(a, b):
        return all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(a, b))

    if same(yours, expected):
        return "after 10 steps your parameter, exp_avg and exp_avg_sq match torch.optim.AdamW's."
    for mistake, explanation in MISTAKES.items():
        if same(yours, reference_adamw_run(variant_step(**{mistake: True}), **HYPER)):
            raise Wrong(explanation)
    if not same(yours[1:], expected[1:]):
        if torch.allclose(yours[1], torch.zeros_like(yours[1])):
            raise Wrong("exp_avg is still all zeros after 10 steps. Hint: update the EMAs in place "
                        "(exp_avg.mul_(beta1).add_(...)); `exp_avg = ...` only rebinds a local name.")
        raise Wrong("your EMAs differ from PyTorch's. Hint: exp_avg = beta1 x exp_avg + (1 - beta1) x grad and "
                    "exp_avg_sq = beta2 x exp_avg_sq + (1 - beta2) x grad², both updated in place.")
    if torch.equal(yours[0], reference_adamw_run(lambda *args, **kwargs: None, **HYPER)[0]):
        raise Wrong("the parameter never changed. Hint: update it in place (param.mul_, param.addcdiv_).")
    raise Wrong("the EMAs are right, the parameter update is not. Hint: param -= lr x (exp_avg / c1) / "
                "(sqrt(exp_avg_sq / c2) + eps), after the decoupled decay param *= 1 - lr x weight_decay.")


def optimizers_to_weigh():
    """(name, optimizer after one step, state elements, state bytes, parameter bytes) for several optimizers."""
    from transformers.optimization import Adafactor

    with torch.random.fork_rng(devices=[]):  # the layers draw their weights from the global generator: restore it
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    cases = [("AdamW", model, lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
             ("SGD with momentum", model, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
             ("SGD without momentum", model, lambda ps: torch.optim.SGD(ps, lr=0.1)),
             ("Adafactor", model, lambda ps: Adafactor(ps, lr=1e-3, relative_step=False, scale_parameter=False)),
             ("AdamW on a bfloat16 model", bf16_model, lambda ps: torch.optim.AdamW(ps, lr=1e-3))]
    for name, m, make in cases:
        m = copy.deepcopy(m)
        for p in m.parameters():
            p.grad = torch.ones_like(p)
        optimizer = make(list(m.parameters()))
        optimizer.step()
        yield (name, optimizer, *optimizer_state.optimizer_state_size(optimizer),
               sum(p.numel() * p.element_size() for p in m.parameters()))


@checker("4.3")
def check_optimizer_state_size(optimizer_state_size):
    """``optimizer_state_size(optimizer)``: the bytes of every tensor in ``optimizer.state``."""
    require_callable(optimizer_state_size, "optimizer_state_size")
    hints = [("'str' object has no attribute", "looping over a dict gives its keys (names such as 'exp_avg'): "
                                                "loop over state.values() instead."),
             ("not iterable", "optimizer.state maps each parameter to a dict: loop over optimizer.state.values(), "
                              "then over each dict's values()."),
             ("has no attribute 'numel'", "some state entries are not tensors (Adafactor keeps its step as an int): "
                                          "skip them with isinstance(value, torch.Tensor)."),
             ("has no attribute 'element_size'", "skip state entries that are not tensors "
                                                 "(isinstance(value, torch.Tensor)).")]
    lines = []
    for name, optimizer, elements, true_bytes, parameter_bytes in optimizers_to_weigh():
        answer = call_learner(optimizer_state_size, optimizer, name=f"optimizer_state_size on {name}", hints=hints)
        answer = whole_number(answer, f"optimizer_state_size on {name}")
        if answer == true_bytes:
            lines.append(f"{name} {answer:,}")
            continue
        if answer == elements:
            raise Wrong(f"on {name} you returned {answer:,}, the number of elements; the state holds {true_bytes:,} "
                        "bytes. Hint: multiply each tensor's numel() by its element_size().")
        if answer == parameter_bytes:
            raise Wrong(f"on {name} you returned {answer:,}, the bytes of the parameters themselves. Hint: weigh "
                        "what is inside optimizer.state, not optimizer.param_groups.")
        if "bfloat16" in name and answer == 2 * true_bytes:
            raise Wrong(f"on {name} you returned {answer:,}, twice the {true_bytes:,} bytes: a bfloat16 value has "
                        "2 bytes, not 4. Hint: use each tensor's element_size() rather than assuming 4.")
        raise Wrong(f"on {name} you returned {answer:,} bytes; its state holds {true_bytes:,}. Hint: add up "
                    "numel() x element_size() over every tensor in every parameter's state.")
    return "state bytes: " + ", ".join(lines) + "."


DISTILBERT_PARTS = {
    "the word embeddings": lambda c: c.vocab_size * c.dim,
    "the position embeddings": lambda c: c.max_position_embeddings * c.dim,
    "the embedding LayerNorm": lambda c: 2 * c.dim,
    "the attention projections (q, k, v, out)": lambda c: c.n_layers * 4 * (c.dim * c.dim + c.dim),
    "the feed-forward layers (lin1, lin2)": lambda c: c.n_layers * (2 * c.dim * c.hidden_dim + c.hidden_dim + c.dim),
    "the two LayerNorms of every layer": lambda c: c.n_layers * 2 * 2 * c.dim,
    "the pre_classifier": lambda c: c.dim * c.dim + c.dim,
    "the classifier": lambda c: c.dim * c.num_labels + c.num_labels,
}
BIASES = {"the attention biases": lambda c: c.n_layers * 4 * c.dim,
          "the feed-forward biases": lambda c: c.n_layers * (c.hidden_dim + c.dim),
          "the biases of pre_classifier and classifier": lambda c: c.dim + c.num_labels}


def configurations():
    """The DistilBERT configurations the learner's formula must count: the slides', the tiny one and a third."""
    from helpers.models import model_config

    other = model_config("tiny", num_labels=3)
    other.update({"vocab_size": 300, "dim": 48, "n_layers": 3, "n_heads": 4, "hidden_dim": 96,
                  "max_position_embeddings": 40})
    return {"distilbert-base-cased": model_config("base"), "distilbert-tiny": model_config("tiny"),
            "a third configuration (3 labels)": other}


def counted_parameters(config):
    """Parameters of the model built from ``config``: the truth the learner's formula is checked against."""
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):  # shapes only: no memory, no time
        model = AutoModelForSequenceClassification.from_config(config)
    return sum(p.numel() for p in model.parameters())


@checker("4.4")
def check_parameters_from_config(parameters_from_config):
    """``parameters_from_config(config)``: DistilBERT's parameter count, from its configuration alone."""
    require_callable(parameters_from_config, "parameters_from_config")
    hints = [("has no attribute", "DistilBERT's configuration names its sizes vocab_size, dim, n_layers, "
                                  "hidden_dim, max_position_embeddings and num_labels.")]
    results = []
    for name, config in configurations().items():
        answer = call_learner(parameters_from_config, config, name=f"parameters_from_config on {name}", hints=hints)
        answer = whole_number(answer, f"parameters_from_config on {name}")
        truth = counted_parameters(config)
        if answer != truth:
            difference = truth - answer
            missing = [part for part, size in {**DISTILBERT_PARTS, **BIASES}.items() if size(config) == abs(difference)]
            which = (f" That is exactly the size of {' or of '.join(missing)}: "
                     f"{'missing' if difference > 0 else 'counted twice'}?" if missing else "")
            raise Wrong(f"on {name} you computed {answer:,}; the model built from it has {truth:,} parameters "
                        f"({'short by' if difference > 0 else 'over by'} {abs(difference):,}).{which} Hint: a Linear(a, b) "
                        "has a x b weights and b biases; a LayerNorm has 2 x its width; add the embeddings, 6 Linear "
                        "layers and 2 LayerNorms per transformer layer, then pre_classifier and classifier.")
        results.append((name, answer))
    base = results[0][1]
    return (f"your formula matches the built models ({', '.join(f'{n}: {a:,}' for n, a in results)}). "
            f"For the slides' model, AdamW's state is then {base:,} x 8 bytes = {base * 8 / MiB:.1f} MiB.")
