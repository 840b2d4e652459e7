"""Practice 5 (mixed precision): right answers written several ways pass, each listed
mistake gets its own hint, answers in the wrong form are named."""
from fractions import Fraction

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from practice_support import assert_judged, assert_verdict, draws_after_seeding
from transformers import TrainingArguments

from helpers.practice import check_mixed_precision as l5
from helpers.practice.core import (
    CORRECT,
    NOT_DONE,
    WRONG,
    cached_outcome,
    check,
    one_thread,
    outcome,
)
from helpers.practice.fixtures import ON_CPU

# --- 5.1: what autocast runs in bfloat16 --------------------------------------------


def test_5_1_judges_predictions_by_the_counted_dtypes():
    assert l5.measured_dtypes_5_1() == l5.AUTOCAST_DTYPES
    as_dtypes = {op: getattr(torch, name) for op, name in l5.AUTOCAST_DTYPES.items()}
    assert_judged(l5.PREDICTION, as_dtypes)
    both_wrong = {**l5.AUTOCAST_DTYPES, "_softmax": "float32", "gelu": "float32"}
    assert_verdict(check(l5.PREDICTION, both_wrong), WRONG, "gelu ran in bfloat16",
                   "_softmax ran in bfloat16")


@pytest.mark.parametrize("prediction, fragment", [
    ({**l5.AUTOCAST_DTYPES, "addmm": "bf16"}, '"bfloat16" or "float32"'),
    ({op: d for op, d in l5.AUTOCAST_DTYPES.items() if op != "gelu"}, "lacks 'gelu'"),
    (["bfloat16"] * 6, "should be a dict"),
])
def test_5_1_names_an_answer_in_the_wrong_form(prediction, fragment):
    assert_verdict(l5.check_autocast_prediction.verdict(prediction), WRONG, fragment)


# --- 5.2: bfloat16 in Trainer and in Accelerator ------------------------------------

def test_5_2_judges_both_setups_by_what_they_ran():
    assert_judged(l5.BF16_SETUPS, (
        lambda d: TrainingArguments(output_dir=d, bf16=True, use_cpu=ON_CPU,
                                    report_to="none", logging_steps=5),
        lambda: Accelerator(mixed_precision="bf16", cpu=ON_CPU)))


@pytest.mark.skipif(not ON_CPU, reason="these two run in float32 on a CPU only")
@pytest.mark.parametrize("settings", [dict(fp16=True), dict(bf16_full_eval=True)])
def test_5_2_other_settings_that_train_in_float32_on_a_cpu(settings):
    answer = (l5.args_with(use_cpu=True, **settings), l5.BF16_ACCELERATOR)
    assert_verdict(check(l5.BF16_SETUPS, answer), WRONG, "Trainer trained in float32")


def test_5_2_names_a_wrong_kind_of_answer_and_an_unfinished_one():
    autocast = (l5.BF16_ARGS, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert_verdict(l5.check_bf16_setups.verdict(*autocast), WRONG,
                   "should return Accelerator(...), but returned autocast")
    assert_verdict(l5.check_bf16_setups.verdict(lambda d: ..., l5.BF16_ACCELERATOR),
                   NOT_DONE, "make_training_args")


def test_5_2_puts_the_learners_accelerate_state_back():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    learners = Accelerator(mixed_precision="bf16")
    assert_verdict(check(l5.BF16_SETUPS, l5.BF16_SETUPS.intended), CORRECT)
    assert learners.state.mixed_precision == "bf16"
    AcceleratorState._reset_state(reset_partial_state=True)


# --- 5.3: bytes per parameter of two recipes ----------------------------------------

def test_5_3_judges_numbers_of_any_type_against_a_real_step():
    assert [round(held, 2) for held in l5.measured_recipes()] == [8.0, 12.0]
    assert_judged(l5.BYTES, (np.sum([2, 2, 2, 2]), 12.0), (np.float32(8), np.int64(12)),
                  (Fraction(8001, 1000), torch.tensor(12)))


def test_5_3_two_wrong_numbers_get_a_hint_each():
    assert_verdict(l5.check_bytes_per_parameter.verdict(16, 16), WRONG,
                   "pure_bf16_adamw_bytes = 16", "float32 training's",
                   "accelerate_bf16_sgd_bytes = 16", "AdamW's state")
    assert_verdict(l5.check_bytes_per_parameter.verdict("8 bytes", 12), WRONG,
                   "should be a number")


# --- 5.4: float16 with a GradScaler, and clipping -----------------------------------

CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n"

def clipped_by_hand(model, optimizer, scaler, batches, max_grad_norm):
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)  # first, not last: the same training
        with torch.autocast(model.device.type, dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in gradients]))
        if norm > max_grad_norm:
            for g in gradients:
                g.mul_(max_grad_norm / norm)
        scaler.step(optimizer)
        scaler.update()


def clipped_while_scaled(model, optimizer, scaler, batches, max_grad_norm):
    for batch in batches:
        with torch.autocast(model.device.type, dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(),
                                       max_grad_norm * scaler.get_scale())
        scaler.step(optimizer)  # unscales, then steps
        scaler.update()
        optimizer.zero_grad()


def test_5_4_judges_loops_by_the_weights_they_train():
    assert_judged(l5.FLOAT16_LOOP, clipped_by_hand, clipped_while_scaled)


def test_5_4_the_tolerance_sits_in_the_gap_between_right_and_wrong_loops():
    def gap(got, index):  # how far from the intended update, relative to its size
        expected = cached_outcome(l5.FLOAT16_LOOP, "intended", index)
        if not isinstance(got, dict) or got["steps"] != expected["steps"]:
            return float("inf")
        return ((got["update"] - expected["update"]).norm()
                / expected["update"].norm()).nan_to_num(float("inf")).item()

    with one_thread():
        for index, max_grad_norm in enumerate(l5.FLOAT16_LOOP.configs):
            right = [gap(outcome(l5.FLOAT16_LOOP, loop, max_grad_norm), index)
                     for loop in (clipped_by_hand, clipped_while_scaled)]
            wrong = [gap(cached_outcome(l5.FLOAT16_LOOP, mistake, index), index)
                     for mistake in range(len(l5.FLOAT16_LOOP.mistakes))]
            # same_training's 1 %: 10 times the right loops' gap, a tenth of a mistake's
            assert max(right) < 1e-3 and min(w for w in wrong if w > 0) > 0.1


@pytest.mark.parametrize("after_forward, fragments", [
    ("scaler.scale(loss).backward()\nscaler.step(optimizer)\noptimizer.step()\n"
     "scaler.update()\noptimizer.zero_grad()",
     ["weights are NaN", "only with scaler.step(optimizer)"]),
    ("scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.unscale_(optimizer)"
     "\n" + CLIP + "scaler.update()\noptimizer.zero_grad()",
     ["unscale_(optimizer) ran after a scaler.step(optimizer)", "in this order"]),
    ("scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\n" + CLIP +
     "scaler.step(optimizer)\nscaler.update()\nscaler.update()\noptimizer.zero_grad()",
     ["found no scaler.step(optimizer) since the last update"]),
])
def test_5_4_hints_name_only_what_the_loop_did(after_forward, fragments):
    verdict = check(l5.FLOAT16_LOOP, l5.float16_loop(after_forward))
    assert_verdict(verdict, WRONG, *fragments)
    assert "never clipped" not in verdict.message


def test_a_check_that_trains_leaves_the_learners_random_numbers_alone():
    assert draws_after_seeding(lambda: check(l5.FLOAT16_LOOP, clipped_by_hand)) \
        == draws_after_seeding()
