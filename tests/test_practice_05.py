"""Practice 5 (mixed precision): right answers pass; near misses and typical mistakes
get the intended message."""
import pytest
import torch
from accelerate import Accelerator
from practice_support import assert_verdict, draws_after_seeding
from transformers import TrainingArguments

from helpers.practice import check_mixed_precision as l5
from helpers.practice.verdicts import CORRECT, NOT_DONE, WRONG

ON_CPU = not torch.cuda.is_available()

# --- 5.1: what autocast runs in bfloat16
# -------------------------------------------------------------------

RIGHT_5_1 = {"embedding": "float32", "addmm": "bfloat16", "gelu": "bfloat16",
             "native_layer_norm": "bfloat16", "_softmax": "bfloat16",
             "mse_loss": "float32"}


@pytest.mark.parametrize("prediction", [
    RIGHT_5_1,
    # torch dtypes are fine too
    {op: getattr(torch, dtype) for op, dtype in RIGHT_5_1.items()},
])
def test_5_1_accepts_the_measured_dtypes(prediction):
    assert_verdict(l5.check_autocast_prediction.verdict(prediction), CORRECT,
                   "native_layer_norm", "embedding, mse_loss in float32")


@pytest.mark.parametrize(
    "mistake, fragments",
    [
        (
            {"native_layer_norm": "float32"},
            [
                "native_layer_norm ran in bfloat16",
                "follows its input",
                # DistilBERT's table, copied
                "float32 residual sum",
            ],
        ),
        ({"gelu": "float32"}, ["gelu ran in bfloat16", "dtype of its input"]),
        ({"embedding": "bfloat16"},
         ["embedding ran in float32", "on no autocast list"]),
        ({"mse_loss": "bfloat16"}, ["mse_loss ran in float32", "float32 list"]),
        ({"addmm": "float32"}, ["addmm ran in bfloat16", "lower-precision list"]),
        ({"_softmax": "float32", "native_layer_norm": "float32"},
         ["_softmax ran in bfloat16", "native_layer_norm ran in bfloat16"]),
    ],
)
def test_5_1_names_each_wrong_prediction_and_why(mistake, fragments):
    assert_verdict(l5.check_autocast_prediction.verdict({**RIGHT_5_1, **mistake}),
                   WRONG, *fragments)


@pytest.mark.parametrize("prediction, fragment", [
    ({**RIGHT_5_1, "addmm": "bf16"}, '"bfloat16" or "float32"'),
    ({op: dtype for op, dtype in RIGHT_5_1.items() if op != "gelu"}, "lacks 'gelu'"),
    (["bfloat16"] * 6, "should be a dict"),
])
def test_5_1_explains_answers_in_the_wrong_form(prediction, fragment):
    assert_verdict(l5.check_autocast_prediction.verdict(prediction), WRONG, fragment)


def test_5_1_not_done_yet():
    assert_verdict(l5.check_autocast_prediction.verdict({op: ... for op in RIGHT_5_1}),
                   NOT_DONE, "`...`")


# --- 5.2: bfloat16 in Trainer and in Accelerator
# -----------------------------------------------------------

def bf16_args(output_dir):
    return TrainingArguments(
        output_dir=output_dir, bf16=True, use_cpu=ON_CPU, report_to="none"
    )


def bf16_accelerator():
    return Accelerator(mixed_precision="bf16")


@pytest.mark.parametrize(
    "make_args, make_accelerator",
    [
        (bf16_args, bf16_accelerator),
        (
            lambda d: TrainingArguments(output_dir=d, bf16=True, use_cpu=ON_CPU,
                                        report_to="none", logging_steps=5),
            lambda: Accelerator(mixed_precision="bf16", cpu=ON_CPU),
        ),
    ],
)
def test_5_2_accepts_bf16_in_both(make_args, make_accelerator):
    assert_verdict(l5.check_bf16_setups.verdict(make_args, make_accelerator), CORRECT,
                   "bfloat16", "convert_outputs_to_fp32")


@pytest.mark.skipif(not ON_CPU, reason="these near misses are the CPU's")
@pytest.mark.parametrize(
    "make_args, make_accelerator, fragments",
    [
        (
            lambda d: TrainingArguments(
                output_dir=d, fp16=True, use_cpu=True, report_to="none"
            ),
            bf16_accelerator,
            ["fp16=True nothing ran in 16 bits", "float32", "bf16=True"],
        ),
        (lambda d: TrainingArguments(output_dir=d, bf16=True, report_to="none"),
         bf16_accelerator, ["ValueError", "use_cpu=True"]),
        (
            lambda d: TrainingArguments(
                output_dir=d, bf16_full_eval=True, use_cpu=True, report_to="none"
            ),
            bf16_accelerator,
            ["for evaluation only", "bf16=True"],
        ),
        (lambda d: TrainingArguments(output_dir=d, use_cpu=True, report_to="none"),
         bf16_accelerator, ["trained in float32", "bf16=True"]),
        (bf16_args, lambda: Accelerator(mixed_precision="fp16"),
         ["ran in float32", 'mixed_precision="bf16"']),
        (bf16_args, lambda: Accelerator(mixed_precision="bfloat16"),
         ["Unknown mixed_precision mode", 'mixed_precision="bf16"']),
        (bf16_args, lambda: Accelerator(), ["ran in float32"]),
        (bf16_args, lambda: torch.autocast("cpu", dtype=torch.bfloat16),
         ["should return Accelerator"]),
    ],
)
def test_5_2_names_the_typical_mistakes(make_args, make_accelerator, fragments):
    assert_verdict(
        l5.check_bf16_setups.verdict(make_args, make_accelerator), WRONG, *fragments
    )


def test_5_2_not_done_yet():
    def unfinished(output_dir):
        return ...

    assert_verdict(l5.check_bf16_setups.verdict(unfinished, bf16_accelerator), NOT_DONE,
                   "make_training_args")


# --- 5.3: bytes per parameter of two recipes
# ---------------------------------------------------------------

@pytest.mark.parametrize(
    "pure, accelerate", [(8, 12), (2 + 2 + 2 + 2, 4 + 4 + 4.0), (8.001, 12)]
)
def test_5_3_accepts_the_weighed_bytes(pure, accelerate):
    assert_verdict(l5.check_bytes_per_parameter.verdict(pure, accelerate), CORRECT,
                   "8.001", "12.000")


@pytest.mark.parametrize("pure, accelerate, fragments", [
    (16, 12, ["pure_bf16_adamw_bytes = 16", "float32 training's 4 + 4 + 8"]),
    (18, 12, ["ML Engineering's 6 + 8 + 4"]),
    (12, 12, ["moments as float32", "zeros_like"]),
    (6, 12, ["not the gradient"]),
    (8, 16, ["accelerate_bf16_sgd_bytes = 16", "one buffer per parameter"]),
    (8, 8, ["leaves out the momentum buffer"]),
    (8, 10, ["counts the weights as bfloat16", "only during forward and backward"]),
    (8, 14, ["half-precision copy of every weight"]),
    # both named
    (16, 16, ["pure_bf16_adamw_bytes = 16", "accelerate_bf16_sgd_bytes = 16"]),
])
def test_5_3_names_the_typical_mistakes(pure, accelerate, fragments):
    assert_verdict(
        l5.check_bytes_per_parameter.verdict(pure, accelerate), WRONG, *fragments
    )


def test_5_3_a_wrong_kind_of_answer_is_named():
    assert_verdict(
        l5.check_bytes_per_parameter.verdict("8 bytes", 12), WRONG, "should be a number"
    )
    assert_verdict(l5.check_bytes_per_parameter.verdict(..., 12), NOT_DONE, "`...`")


def test_5_3_the_measurement_is_the_recipes_truth():
    measured = l5.measured_recipes()
    assert (abs(measured["pure_bf16_adamw"] - 8) < 0.01
            and measured["accelerate_bf16_sgd_momentum"] == 12)


# --- 5.4: float16 with a GradScaler, and clipping
# ----------------------------------------------------------

def loop_with_named_steps(model, optimizer, scaler, batches, max_grad_norm):
    device_type = next(model.parameters()).device.type
    for batch in batches:
        # zeroing first, not last: the same training
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=torch.float16):
            outputs = model(**batch)
        scaled = scaler.scale(outputs.loss)
        scaled.backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
        scaler.step(optimizer)
        scaler.update()


@pytest.mark.parametrize("loop", [l5.intended_float16_loop, loop_with_named_steps])
def test_5_4_accepts_a_scaled_clipped_loop(loop):
    assert_verdict(l5.check_float16_loop.verdict(loop), CORRECT, "skipped",
                   "match the intended loop's")


@pytest.mark.parametrize(
    "mistake, fragments",
    [
        (
            "clip_scaled",
            ["clipped the scaled gradients",
             "scaler.unscale_(optimizer) before clip_grad_norm_"],
        ),
        ("no_clip", ["never clipped"]),
        ("no_zero_grad", ["added to the previous ones"]),
        ("plain_step",
         ["stepped on gradients that had overflowed", "only scaler.step(optimizer)"]),
        ("double_step",
         ["stepped on gradients that had overflowed", "only scaler.step(optimizer)"]),
        ("no_scale", ["_scale is None", "scaler.scale(loss)"]),
        ("no_update",
         ["being called after step", "scaler.update() after scaler.step(optimizer)"]),
    ],
)
def test_5_4_names_the_typical_mistakes(mistake, fragments):
    verdict = l5.check_float16_loop.verdict(l5.mistaken_float16_loop(**{mistake: True}))
    assert_verdict(verdict, WRONG, *fragments)


def test_5_4_a_plain_step_then_update_is_explained():
    def step_then_update(model, optimizer, scaler, batches, max_grad_norm):
        for batch in batches:
            with torch.autocast(
                next(model.parameters()).device.type, dtype=torch.float16
            ):
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            optimizer.step()
            scaler.update()
            optimizer.zero_grad()

    assert_verdict(l5.check_float16_loop.verdict(step_then_update), WRONG,
                   "No inf checks were recorded", "needs scaler.step(optimizer) first")


def test_5_4_not_done_yet():
    def unfinished(model, optimizer, scaler, batches, max_grad_norm):
        ...

    assert_verdict(l5.check_float16_loop.verdict(unfinished), NOT_DONE, "train_float16")


# --- the learner's state
# --------------------------------------------------------------------------------

@pytest.mark.parametrize("run_check", [
    lambda: l5.check_bf16_setups.verdict(bf16_args, bf16_accelerator),
    lambda: l5.check_float16_loop.verdict(l5.intended_float16_loop),
], ids=["5.2 (trains with Trainer)", "5.4 (trains in float16)"])
def test_a_check_that_trains_leaves_the_learners_random_numbers_alone(run_check):
    assert draws_after_seeding(run_check) == draws_after_seeding()


def test_a_check_leaves_the_learners_thread_count_alone():
    threads = torch.get_num_threads()
    l5.check_autocast_prediction.verdict(RIGHT_5_1)
    assert torch.get_num_threads() == threads


def test_a_check_puts_the_learners_accelerate_state_back():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    learners = Accelerator(mixed_precision="bf16")
    assert_verdict(
        l5.check_bf16_setups.verdict(
            bf16_args, lambda: Accelerator(mixed_precision="bf16")
        ),
        CORRECT,
    )
    assert (learners.state.mixed_precision == "bf16"
            and AcceleratorState().mixed_precision == "bf16")
    AcceleratorState._reset_state(reset_partial_state=True)
