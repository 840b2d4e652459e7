"""Practice 4 (AdamW): right answers written as a learner would pass, each listed
mistake gets its own hint, and a form problem is "not quite", never a failed check."""
import math
from fractions import Fraction

import numpy as np
import torch
from practice_support import assert_judged, assert_verdict

from helpers.practice import check_adamw as l4
from helpers.practice.core import CORRECT, NOT_DONE, WRONG, check


def unfinished(*args):
    return ...


def test_4_1_adamw_state():
    def by_entry(shapes, dtype):  # sizes read from tensors, counted with NumPy
        value = torch.empty((), dtype=dtype).element_size()
        step = torch.tensor(0.0).element_size()
        return np.sum([2 * value * np.prod(s) + step for s in shapes])

    assert_judged(
        l4.ADAMW_STATE, by_entry,
        lambda shapes, dtype: float(sum(2 * math.prod(s) * dtype.itemsize + 4
                                        for s in shapes)))
    assert_verdict(check(l4.ADAMW_STATE, lambda shapes, dtype: 0.5), WRONG,
                   "whole number", "math.ceil")
    assert_verdict(check(l4.ADAMW_STATE, lambda shapes, dtype: 7), WRONG,
                   "one real step keeps 4,724,744", "exp_avg (float32) 2,362,368")
    assert_verdict(l4.check_optimizer_state_size.verdict(unfinished), NOT_DONE)


def test_llama_shapes_are_those_of_the_model_transformers_builds():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**l4.LLAMA_2_7B, num_attention_heads=32,
                         num_key_value_heads=32, tie_word_embeddings=False)
    with torch.device("meta"):  # shapes only
        model = LlamaForCausalLM(config)
    shapes = [tuple(parameter.shape) for parameter in model.parameters()]
    assert l4.llama_shapes(**l4.LLAMA_2_7B) == shapes


def budget_of(n_parameters, rounded=False):
    per_parameter = {"weights": 2, "gradients": 2, "master weights": 4,
                     "optimizer state": 8}  # bfloat16, bfloat16, float32, 2 x float32
    budget = {part: n * n_parameters for part, n in per_parameter.items()}
    if rounded:  # to 3 significant figures, as a learner may write them
        budget = {part: float(f"{n:.3g}") for part, n in budget.items()}
    return {**budget, "fits on one 80 GiB GPU": sum(budget.values()) <= 80 * 2**30}


def test_4_2_training_budget():
    n = sum(math.prod(shape) for shape in l4.llama_shapes(**l4.LLAMA_2_7B))
    assert_judged(l4.TRAINING_BUDGET, budget_of(np.int64(n)), budget_of(n, True),
                  {**budget_of(Fraction(n)), "total": 16 * n})
    assert_verdict(l4.check_training_memory.verdict(budget_of(n)), CORRECT,
                   "2 + 2 + 4 + 8 = 16 bytes per parameter", "100.4 GiB", "2 GPUs")
    assert_verdict(check(l4.TRAINING_BUDGET, {**budget_of(n), "weights": 3 * n}),
                   WRONG, "intended answer: weights 3. Hint: in bytes per parameter")
    for form in (16 * n, {"weights": 2 * n}):  # "fits" as "no": named, test below
        assert_verdict(check(l4.TRAINING_BUDGET, form), WRONG, "should be a dict")
    assert_verdict(l4.check_training_memory.verdict(
        {**budget_of(n), "fits on one 80 GiB GPU": ...}), NOT_DONE)


def lessons_form(param, grad, state, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    state.setdefault("step", 0)
    exp_avg = state.setdefault("exp_avg", torch.zeros_like(param))
    exp_avg_sq = state.setdefault("exp_avg_sq", torch.zeros_like(param))
    state["step"] += 1
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    corrected_avg = exp_avg / (1 - beta1 ** state["step"])
    corrected_avg_sq = exp_avg_sq / (1 - beta2 ** state["step"])
    param.sub_(lr * corrected_avg / (corrected_avg_sq.sqrt() + eps))


def new_tensors_in_the_dict(param, grad, state, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    step = state.get("step", torch.tensor(0.0)) + 1
    exp_avg = state.get("exp_avg", torch.zeros_like(param)) * beta1 + (1 - beta1) * grad
    exp_avg_sq = (state.get("exp_avg_sq", torch.zeros_like(param)) * beta2
                  + (1 - beta2) * grad**2)
    state.update(step=step, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    update = (exp_avg / (1 - beta1**step)) / ((exp_avg_sq / (1 - beta2**step)).sqrt()
                                              + eps)
    param.copy_(param * (1 - lr * weight_decay) - lr * update)


def test_4_3_fixed_step():
    assert_judged(l4.FIXED_STEP, lessons_form, new_tensors_in_the_dict)

    def half_the_decay(param, grad, state, lr, betas, eps, weight_decay):
        lessons_form(param, grad, state, lr, betas, eps, weight_decay / 2)

    assert_verdict(check(l4.FIXED_STEP, half_the_decay), WRONG,
                   "with gradients of about 1, what differs from the intended "
                   "answer: parameter.")
    assert_verdict(check(l4.FIXED_STEP, lambda *args, **hyper: None), WRONG,
                   "raised KeyError: 'exp_avg'")
    assert_verdict(l4.check_fixed_step.verdict(unfinished), NOT_DONE)


def adafactor_like_the_solution(shapes, momentum):
    return sum(4 * ((sum(s) if len(s) == 2 else math.prod(s))
                    + (math.prod(s) if momentum else 0)) + 4 for s in shapes)


def adamw8bit_like_the_solution(shapes):
    sizes = [math.prod(shape) for shape in shapes]
    return sum(2 * n + 8 * -(-n // 256) if n >= 4096 else 8 * n for n in sizes) + (
        2048 if max(sizes) >= 4096 else 0)


def test_4_4_adafactor_and_8bit_state():
    assert_judged(l4.ADAFACTOR_STATE, adafactor_like_the_solution,
                  lambda *case: np.int64(adafactor_like_the_solution(*case)))
    assert_judged(
        l4.ADAMW8BIT_STATE, adamw8bit_like_the_solution,
        lambda shapes: torch.tensor(float(adamw8bit_like_the_solution(shapes))))
    verdict = l4.state_verdict
    assert_verdict(verdict(adafactor_like_the_solution, adamw8bit_like_the_solution),
                   CORRECT, "Adafactor predictions match 12", "8-bit AdamW")
    assert_verdict(verdict(adafactor_like_the_solution, unfinished), NOT_DONE,
                   "adamw8bit_state_bytes")
    assert_verdict(verdict(lambda shapes, momentum: 1, unfinished), WRONG,
                   "adafactor_state_bytes gave 1 bytes")



def test_4_2_bytes_per_parameter_and_a_fits_not_a_bool_are_named():
    """The second tester: 2, 2, 4, 8 with "fits" False (rightly) got "Hint: in bytes
    per parameter"; "fits" as 'no' was cut from the message before it showed."""
    per_parameter = {**dict(zip(l4.PARTS, (2, 2, 4, 8))), l4.FITS: False}
    verdict = check(l4.TRAINING_BUDGET, per_parameter)
    assert_verdict(verdict, WRONG, "those are bytes per parameter", "multiply by")
    n = sum(math.prod(shape) for shape in l4.llama_shapes(**l4.LLAMA_2_7B))
    said_no = {**{part: b for part, b in budget_of(n).items() if part in l4.PARTS},
               l4.FITS: "no"}
    assert_verdict(check(l4.TRAINING_BUDGET, said_no), WRONG,
                   f"{l4.FITS!r} is 'no': give True or False")


def test_4_2_a_budget_in_gib_or_mb_is_named_as_such():
    """Issue 44: bytes given in GiB were told "Hint: in bytes per parameter"."""
    n = sum(math.prod(shape) for shape in l4.llama_shapes(**l4.LLAMA_2_7B))
    for unit, size in (("GiB", 2**30), ("GB", 1e9), ("MiB", 2**20)):
        in_unit = {**{part: bytes_ / size for part, bytes_ in budget_of(n).items()
                      if part in l4.PARTS}, l4.FITS: False}
        verdict = check(l4.TRAINING_BUDGET, in_unit)
        assert_verdict(verdict, WRONG, f"gave {unit}", "asks for bytes")
        assert "per parameter" not in verdict.message
