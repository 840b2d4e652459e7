"""Practice 5 (mixed precision): right answers pass, and mistakes get their hints."""
import inspect
from fractions import Fraction

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from practice_support import assert_judged, assert_verdict, draws_after_seeding
from transformers import TrainingArguments

from helpers.practice import check_mixed_precision as l5
from helpers.practice import core
from helpers.practice.core import WRONG, cached_outcome, check, one_thread, outcome
from helpers.practice.fixtures import ON_CPU


def test_5_1_judges_predictions_by_the_counted_dtypes():
    measured = l5.PREDICTION.measure(l5.AUTOCAST_DTYPES, None)
    assert all(ran == predicted for ran, predicted in measured.values())
    assert_judged(l5.PREDICTION, {op: getattr(torch, d) for op, d in
                                  l5.AUTOCAST_DTYPES.items()})
    lesson_figure = {**l5.AUTOCAST_DTYPES, "native_layer_norm": "float32"}
    assert_verdict(check(l5.PREDICTION, lesson_figure), WRONG,  # the usual wrong one
                   "native_layer_norm ran in bfloat16, not float32: on the CPU")
    both_wrong = {**l5.AUTOCAST_DTYPES, "_softmax": "float32", "gelu": "bf16"}
    assert_verdict(check(l5.PREDICTION, both_wrong), WRONG,
                   "gelu ran in bfloat16, not bf16", "_softmax ran in bfloat16")
    for wrong_form in ({"gelu": "bfloat16"}, ["bfloat16"] * 6):
        assert_verdict(check(l5.PREDICTION, wrong_form), WRONG, "should be a dict "
                       "with a dtype for each of embedding, addmm, gelu")


def test_5_2_judges_both_setups_by_what_they_ran_and_keeps_the_learners_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    learners = Accelerator(mixed_precision="bf16")
    assert_judged(l5.BF16_SETUPS, (
        lambda d: TrainingArguments(output_dir=d, bf16=True, use_cpu=ON_CPU,
                                    report_to="none", logging_steps=5),
        lambda: Accelerator(mixed_precision="bf16", cpu=ON_CPU)))
    assert learners.state.mixed_precision == "bf16"  # the learner's, put back
    assert cached_outcome(l5.BF16_SETUPS, "intended", 0)["trainer"][0] == ["bfloat16"]
    AcceleratorState._reset_state(reset_partial_state=True)


def test_5_2_names_a_wrong_kind_of_answer_and_an_unfinished_one():
    answers = {"should return Accelerator(...), but returned autocast": (
        l5.BF16_ARGS, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
        "Unknown mixed_precision mode: bfloat16": (
            l5.BF16_ARGS, lambda: Accelerator(mixed_precision="bfloat16"))}
    if ON_CPU:  # bf16=True without a bfloat16 GPU
        answers["assign use_cpu"] = (l5.args_with(bf16=True), l5.BF16_ACCELERATOR)
    for fragment, answer in answers.items():  # no Trainer runs: the Accelerator first
        assert_verdict(l5.check_bf16_setups.verdict(*answer), WRONG, fragment)
    assert_verdict(l5.check_bf16_setups.verdict(lambda d: ..., l5.BF16_ACCELERATOR),
                   "not done yet", "make_training_args")


def test_5_3_judges_numbers_of_any_type_against_a_real_step():
    assert [round(held, 2) for held in l5.measured_recipes()] == [8.0, 12.0]
    assert_judged(l5.BYTES, (np.sum([2, 2, 2, 2]), 12.0), (np.float32(8), np.int64(12)),
                  (Fraction(8001, 1000), torch.tensor(12)))
    for answer, fragments in [
            ((16, 16), ["pure_bf16_adamw_bytes = 16: that is float32 training's",
                        "accelerate_bf16_sgd_bytes = 16: that is AdamW's state"]),
            # bfloat16 weights or bfloat16 gradients: the hint blames neither alone
            ((8, 10), ["keeps weights, gradients and momentum in float32"]),
            ((7, 12), ["real step held 8.001 bytes per parameter"]),
            (("8 bytes", 12), ["should be a number"])]:
        assert_verdict(l5.check_bytes_per_parameter.verdict(*answer), WRONG, *fragments)


def clipped_by_hand(model, optimizer, scaler, batches, max_grad_norm):
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)  # first, not last: the same training
        with torch.autocast(model.device.type, dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in gradients]))
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


def test_5_4_judges_loops_by_the_weights_they_train_with_a_tolerance_in_the_gap():
    def gap(got, index):  # the largest difference from the intended weights (NaN: 1)
        expected = cached_outcome(l5.FLOAT16_LOOP, "intended", index)
        if not isinstance(got, dict) or got["steps"] != expected["steps"]:
            return float("inf")
        return (got["weights"] - expected["weights"]).abs().nan_to_num(1).max().item()

    with one_thread():  # as checks run: on one thread, tensors compare faster
        # its mistakes: clipping at a hard-coded 1.0, clip_grad_value_ (not "never
        # clipped"); its right answers: clipping by hand, and the scaled gradients
        assert_judged(l5.FLOAT16_LOOP, clipped_by_hand, clipped_while_scaled)
        for index, max_grad_norm in enumerate(l5.FLOAT16_LOOP.configs):
            right = gap(outcome(l5.FLOAT16_LOOP, clipped_by_hand, max_grad_norm), index)
            wrong = [gap(cached_outcome(l5.FLOAT16_LOOP, mistake, index), index)
                     for mistake in range(len(l5.FLOAT16_LOOP.mistakes))]
            # the tolerance, 1e-3: over 10 times the right loop's gap, under a tenth of
            # a mistake's (clipping at 1.0 is right where max_grad_norm is 1.0)
            assert right < 1e-4 and min(w for w in wrong if w > 0) > 1e-2


LINES = inspect.getsource(l5.train_float16).splitlines()
INTENDED = [line.strip() for line in LINES[4:]]  # its 6 steps, after the forward
STEP = dict(zip("scale unscale clip step update zero".split(), INTENDED),
            backward="loss.backward()", optimizer_step="optimizer.step()")


def loop_of(steps):
    """5.4's intended loop with ``steps`` (names of STEP) in place of its 6 steps."""
    return core.edited(l5.train_float16, *[(line, "") for line in INTENDED[1:]],
                       (INTENDED[0], "\n".join(STEP[step] for step in steps.split())))


@pytest.mark.parametrize("steps, fragments", [
    ("backward unscale clip step update zero", ["scaler.scale(loss).backward(), not"]),
    ("scale step unscale clip update zero", ["called after step()", "in this order"]),
    ("scale unscale clip step zero", ["called after step()", "in this order"]),
    ("scale optimizer_step update zero", ["prior to update", "not optimizer.step()"]),
    ("scale zero unscale clip step update", ["found no gradients", "not before it"]),
    ("", ["with max_grad_norm=1.0, what differs from the intended answer: steps 0"]),
])
def test_5_4_hints_name_only_what_the_loop_did(steps, fragments):
    loop = loop_of(steps)
    verdict = check(l5.FLOAT16_LOOP, loop)
    assert_verdict(verdict, WRONG, *fragments)
    assert "never clipped" not in verdict.message


def test_a_check_leaves_the_learners_random_numbers_alone():  # 5.1's measure seeds
    as_dtypes = {op: getattr(torch, d) for op, d in l5.AUTOCAST_DTYPES.items()}
    assert draws_after_seeding(lambda: check(l5.PREDICTION, as_dtypes)) \
        == draws_after_seeding()


def test_5_2_an_accelerator_made_earlier_in_the_notebook_passes_and_still_works():
    """Issue 44: returning an Accelerator(mixed_precision="bf16") made before the check
    was rejected: the check's reset of Accelerate's state broke it."""
    AcceleratorState._reset_state(reset_partial_state=True)
    made_earlier = Accelerator(mixed_precision="bf16", cpu=ON_CPU)
    assert_verdict(check(l5.BF16_SETUPS, (l5.BF16_ARGS, lambda: made_earlier)),
                   l5.core.CORRECT)
    assert made_earlier.state.mixed_precision == "bf16"  # untouched, and it still runs
    model = made_earlier.prepare(torch.nn.Linear(2, 2))
    assert model(torch.ones(1, 2)).dtype == torch.float32  # converted back, as prepared


def test_5_4_zero_grad_before_scaler_step_gets_its_own_hint():
    """Issue 44: optimizer.zero_grad() between clipping and scaler.step was told
    "unscale_ before clip_grad_norm_", which the learner did."""
    loop = loop_of("scale unscale clip zero step update")
    verdict = check(l5.FLOAT16_LOOP, loop)
    assert_verdict(verdict, WRONG, "zero_grad() ran before scaler.step(optimizer)")
    assert "unscale_" not in verdict.message


def test_5_1_the_figure_on_a_cpu_differs_from_the_answer_in_the_layer_norm_alone():
    """What exercise 5.1 says of the lesson's DistilBERT figure (issue 43), counted as
    the figure counts: eager attention, one forward under CPU bfloat16 autocast."""
    from helpers.mixed_precision import DtypeCounter, autocast_for, on_fake_tensors
    from helpers.models import build_model

    model = build_model("tiny")
    model.set_attn_implementation("eager")
    with on_fake_tensors(), autocast_for("bfloat16", "cpu"), DtypeCounter() as counter:
        model(input_ids=torch.randint(5, 100, (2, 16)), labels=torch.tensor([0, 1]))
    figure = {op: {d for o, d in counter.counts if o == op} for op in l5.WHY_5_1}
    figure["mse_loss"] = {d for o, d in counter.counts if o == "nll_loss_forward"}
    differ = [op for op, dtype in l5.AUTOCAST_DTYPES.items() if figure[op] != {dtype}]
    assert differ == ["native_layer_norm"], figure
