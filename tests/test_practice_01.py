"""Practice 1 (gradient checkpointing): right answers written several ways pass; near
misses are "not quite", each with a hint that names what the answer did."""
import math
import warnings

import numpy as np
import pytest
import torch
from practice_support import assert_verdict, draws_after_seeding
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, checkpoint_sequential

from helpers.practice import check_gradient_checkpointing as l1
from helpers.practice.verdicts import CHECK_FAILED, CORRECT, NOT_DONE, WRONG, Wrong

aten = torch.ops.aten

# --- 1.1: predict what a region that ends before B keeps and runs
# ---------------------------------------

RIGHT = {"kept_KiB": 256, "A_runs": 1, "B_runs": 1}


@pytest.mark.parametrize(
    "prediction",
    [
        RIGHT,
        {"kept_KiB": 256.0, "A_runs": 1.0, "B_runs": 1},
        {"B_runs": 1, "A_runs": 1, "kept_KiB": 2 * 128},
        # numbers computed with numpy or torch
        {"kept_KiB": np.int64(256), "A_runs": np.int64(1), "B_runs": np.int64(1)},
        {"kept_KiB": torch.tensor(256), "A_runs": 1, "B_runs": 1},
    ],
)
def test_1_1_accepts_the_measured_values(prediction):
    assert_verdict(l1.check_region_before_b_prediction.verdict(prediction), CORRECT,
                   "256 KiB kept", "sin 1x", "addmm 1x", "early stop", "same bytes as "
                                                                       "without "
                                                                       "checkpointing")


def test_1_1_the_right_answer_is_what_the_graph_does():
    measured = l1.region_before_b_measurements()
    assert {key: measured[key] for key in RIGHT} == RIGHT
    assert measured["kept_without_checkpointing_KiB"] == RIGHT["kept_KiB"]
    # what the early-stop hint relies on
    assert measured["A_runs_without_early_stop"] == 2


@pytest.mark.parametrize(
    "prediction, off, fragments",
    [
        # believes checkpoint drops everything, as in the lesson's full region
        (
            {"kept_KiB": 0, "A_runs": 2, "B_runs": 2},
            "kept_KiB, A_runs and B_runs",
            ["nothing stays", "region's output", "without early stop",
             "outside the region"],
        ),
        # believes only B is kept, as when B came in from outside in the lesson, and A
        # recomputed
        (
            {"kept_KiB": 128, "A_runs": 2, "B_runs": 1},
            "kept_KiB and A_runs",
            ["one tensor of 128 KiB", "mul, outside it, saves both",
             "without early stop", "before or after it runs"],
        ),
        # right bytes, but A recomputed: early stop forgotten
        ({"kept_KiB": 256, "A_runs": 2, "B_runs": 1}, "A_runs", ["without early stop"]),
        # C counted as kept
        ({"kept_KiB": 384, "A_runs": 1, "B_runs": 1}, "kept_KiB",
         ["less stays", "save C"]),
        # B recomputed although it is outside the region
        ({"kept_KiB": 256, "A_runs": 1, "B_runs": 2}, "B_runs",
         ["computed outside the region"]),
        # the reviewer's: the right bytes, given in bytes; four tensors (x or W counted
        # too); sin never run, run thrice
        ({"kept_KiB": 262144, "A_runs": 1, "B_runs": 1}, "kept_KiB",
         ["is a number of bytes", "1 KiB = 1024 bytes"]),
        ({"kept_KiB": 384 * 1024, "A_runs": 1, "B_runs": 1}, "kept_KiB",
         ["is a number of bytes"]),
        (
            {"kept_KiB": 512, "A_runs": 1, "B_runs": 1},
            "kept_KiB",
            ["Count only the tensors created in this forward",
             "x, W and b existed before", "C is read by no backward"],
        ),
        ({"kept_KiB": 256, "A_runs": 0, "B_runs": 1}, "A_runs", ["count forward once"]),
        ({"kept_KiB": 256, "A_runs": 3, "B_runs": 1}, "A_runs", ["count forward once"]),
    ],
)
def test_1_1_near_misses_are_not_quite_and_say_why(prediction, off, fragments):
    verdict = l1.check_region_before_b_prediction.verdict(prediction)
    assert_verdict(verdict, WRONG, f"off: {off}.", *fragments)
    # a hint explains; it does not give the measured value away
    assert "256" not in verdict.message


@pytest.mark.parametrize(
    "prediction, fragment",
    [
        ([256, 1, 1], '"kept_KiB", "A_runs" and "B_runs"'),
        ({"kept": 256, "A_runs": 1, "B_runs": 1}, '"kept_KiB", "A_runs" and "B_runs"'),
        ({"kept_KiB": "256", "A_runs": 1, "B_runs": 1}, "whole number"),
        ({"kept_KiB": 256.5, "A_runs": 1, "B_runs": 1}, "whole number"),
        # the reviewer's: nan and inf are wrong answers, not a failure of the check; a
        # MiB fraction; a negative count
        ({"kept_KiB": float("nan"), "A_runs": 1, "B_runs": 1},
         'prediction["kept_KiB"] should be a whole number'),
        ({"kept_KiB": float("inf"), "A_runs": 1, "B_runs": 1},
         'prediction["kept_KiB"] should be a whole number'),
        ({"kept_KiB": 256, "A_runs": float("nan"), "B_runs": 1},
         'prediction["A_runs"] should be a whole number'),
        ({"kept_KiB": 0.25, "A_runs": 1, "B_runs": 1}, "looks like MiB"),
        ({"kept_KiB": -256, "A_runs": 1, "B_runs": 1}, "kept_KiB cannot be negative"),
        ({"kept_KiB": 256, "A_runs": True, "B_runs": True}, "whole number"),
        ({"kept_KiB": 256, "A_runs": 1, "B_runs": 1, "C_runs": 1},
         '"kept_KiB", "A_runs" and "B_runs"'),
    ],
)
def test_1_1_malformed_predictions(prediction, fragment):
    assert_verdict(
        l1.check_region_before_b_prediction.verdict(prediction), WRONG, fragment
    )


def test_1_1_not_done_yet():
    verdict = l1.check_region_before_b_prediction.verdict(
        {"kept_KiB": ..., "A_runs": ..., "B_runs": ...}
    )
    assert_verdict(verdict, NOT_DONE, "`...`")


# --- 1.2: a colleague's switch, fixed
# ------------------------------------------------------------------

NON_REENTRANT_NO_STASH = {"use_reentrant": False, "preserve_rng_state": False}


@pytest.mark.parametrize(
    "switch",
    [
        lambda m: m.activation_checkpointing_enable(
            activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH
        ),
        lambda m: m.activation_checkpointing_enable(
            {"preserve_rng_state": False, "use_reentrant": False}, every_n_layers=1
        ),
        lambda m: m.activation_checkpointing_enable(
            dict(use_reentrant=False, preserve_rng_state=False), offload=False
        ),
    ],
)
def test_1_2_accepts_the_fixed_switch(switch):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), CORRECT,
                   "2 of 2 layers checkpointed", "never copied", "no dropout")


@pytest.mark.parametrize(
    "switch, fragments",
    [
        # the near miss: the right switch, but not every layer
        (
            lambda m: m.activation_checkpointing_enable(
                activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH, every_n_layers=2
            ),
            ["1 of the 2 layers (distilbert.transformer.layer.1) ran "
             "without a checkpoint", "every layer",
             "every_n_layers=2 checkpoints only every second layer"],
        ),
        (lambda m: m.activation_checkpointing_enable(every_n_layers=2),
         ["1 of the 2 layers", "random-number state"]),
        # the deprecated name, otherwise right: the exercise asks for today's name
        (
            lambda m: m.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=NON_REENTRANT_NO_STASH
            ),
            ["deprecated name", "activation_checkpointing_enable"],
        ),
        # the colleague's line as given: deprecated, and its dict replaces the default
        # use_reentrant=False
        (
            lambda m: m.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"preserve_rng_state": False}
            ),
            ["2 things to fix", "deprecated name",
             "replaced Transformers' default {'use_reentrant': False}"],
        ),
        # today's name, but the same dict: PyTorch falls back to the reentrant
        # checkpoint
        (
            lambda m: m.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"preserve_rng_state": False}
            ),
            ["the reentrant checkpoint ran", "replaced Transformers' default",
             "incompatible with .grad()"],
        ),
        (
            lambda m: m.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": True,
                                                 "preserve_rng_state": False}
            ),
            ["the reentrant checkpoint ran", "asked for the reentrant checkpoint"],
        ),
        # the lesson's line: right in every way but the random-number state
        (lambda m: m.activation_checkpointing_enable(),
         ["random-number state", "preserve_rng_state"]),
        (lambda m: setattr(m, "gradient_checkpointing", True), ["nothing changed"]),
        (lambda m: setattr(m.config, "gradient_checkpointing", True),
         ["nothing changed"]),
        (lambda m: m.enable_checkpointing(), ["AttributeError"]),
        (
            lambda m: None,
            ["nothing changed",
             "called neither activation_checkpointing_enable nor its old name"],
        ),
    ],
)
def test_1_2_near_misses_are_not_quite_and_say_why(switch, fragments):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), WRONG, *fragments)


# the reviewer's: the learner silences the FutureWarning
def deprecated_name_warning_silenced(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=dict(NON_REENTRANT_NO_STASH)
        )


def enable_then_disable(model):
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH
    )
    model.activation_checkpointing_disable()


def a_generator(model):
    yield model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH
    )


def with_dropout_on(model):
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH
    )
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1


@pytest.mark.parametrize(
    "switch, fragments",
    [
        (
            deprecated_name_warning_silenced,
            ["1 thing to fix",
             "you called gradient_checkpointing_enable, the deprecated"],
        ),
        # a misleading hint before: "Setting an attribute ... does not switch
        # checkpointing on"
        (
            enable_then_disable,
            ["nothing changed", "switched checkpointing on "
             "(activation_checkpointing_enable), then "
             "off again (activation_checkpointing_disable)"],
        ),
        (
            a_generator,
            ["nothing changed", "returned a generator, so its body never ran",
             "remove the yield"],
        ),
        # a misleading hint before: "some layers kept their activations ...
        # every_n_layers must stay 1"
        (
            with_dropout_on,
            ["switched dropout on in 6 layers", "p=0.1", "preserve_rng_state=False",
             "leave dropout at 0.0"],
        ),
        (
            lambda m: m.activation_checkpointing_enable(
                activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH, every_n_layers=0
            ),
            ["ZeroDivisionError", "every_n_layers=0"],
        ),
    ],
)
def test_1_2_the_reviewers_near_misses_are_not_quite_and_say_why(switch, fragments):
    verdict = l1.check_switch_on_checkpointing.verdict(switch)
    assert_verdict(verdict, WRONG, *fragments)
    assert ("Setting an attribute" not in verdict.message
            and ("every_n_layers must stay 1") not in verdict.message)


# the reviewer's: a global filter, set inside the answer
def deprecated_name_future_warnings_filtered(model):
    warnings.filterwarnings("ignore", category=FutureWarning)
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs=dict(NON_REENTRANT_NO_STASH)
    )


@pytest.mark.parametrize(
    "switch",
    [
        lambda m: m.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=dict(NON_REENTRANT_NO_STASH)
        ),
        deprecated_name_future_warnings_filtered,
    ],
)
def test_1_2_the_deprecated_name_is_found_when_the_learner_ignores_every_warning(
    switch,
):
    with warnings.catch_warnings():  # restores the filters the learner's code changes
        warnings.simplefilter("ignore")  # as a notebook's first cell might
        verdict = l1.check_switch_on_checkpointing.verdict(switch)
    assert_verdict(verdict, WRONG, "deprecated name", "activation_checkpointing_enable")


OFFLOADING_SWITCHES = [
    lambda m: m.activation_checkpointing_enable(
        activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH, offload=True),
    lambda m: m.activation_checkpointing_enable(NON_REENTRANT_NO_STASH, 1, True),
    lambda m: m.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs=NON_REENTRANT_NO_STASH, offload=True)]
# Transformers' offload pins memory through torch.autograd.graph.save_on_cpu, for the
# build's accelerator: a CPU build has none, and pinning raises; a CUDA build without a
# GPU skips the pinning and runs.
NO_ACCELERATOR_BACKEND = torch.accelerator.current_accelerator() is None


@pytest.mark.parametrize("switch", OFFLOADING_SWITCHES)
def test_1_2_offload_is_not_quite_on_every_build(switch):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), WRONG,
                   "leave offload at False")


@pytest.mark.skipif(not NO_ACCELERATOR_BACKEND,
                    reason="this torch build has an accelerator backend "
                    "(a CUDA build): offload runs, and the check judges the switch's "
                    "arguments")
def test_1_2_offload_that_raises_on_a_cpu_build_is_explained():
    assert_verdict(l1.check_switch_on_checkpointing.verdict(OFFLOADING_SWITCHES[0]),
                   WRONG, "raised RuntimeError",
                   "pin_memory", "cannot pin memory", "leave offload at False")


@pytest.mark.skipif(NO_ACCELERATOR_BACKEND,
                    reason="a CPU build of torch cannot pin memory: offload raises, "
                    "checked in the test above")
def test_1_2_offload_that_runs_on_a_build_with_an_accelerator_backend_is_named():
    assert_verdict(l1.check_switch_on_checkpointing.verdict(OFFLOADING_SWITCHES[0]),
                   WRONG, "you passed offload=True", "leave offload at False")


def test_1_2_not_done_yet():
    def switch_on_checkpointing(model):
        ...

    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch_on_checkpointing),
                   NOT_DONE, "`...`")


# --- 1.3: a policy for the gated block
# ---------------------------------------------------------------

def keep_hidden_wide_matmuls(ctx, op, *args, **kwargs):
    if op == aten.addmm.default and ctx.op_output.shape[-1] == 256:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize(
    "policy",
    [
        keep_hidden_wide_matmuls,
        l1.keep_gate_and_up,
        # by the bias's length, with booleans (PyTorch accepts them)
        lambda ctx, op, *args, **kwargs: (
            op.overloadpacket == aten.addmm and args[0].shape[0] == 256
        ),
        # by the weight's shape; PREFER_SAVE and MUST_RECOMPUTE
        lambda ctx, op, *args, **kwargs: (
            CheckpointPolicy.PREFER_SAVE
            if op == aten.addmm.default and args[2].shape == (64, 256)
            else CheckpointPolicy.MUST_RECOMPUTE
        ),
        # saving the weight views too costs nothing: they are views of weights that
        # exist anyway
        lambda ctx, op, *args, **kwargs: (
            op == aten.t.default
            or (op == aten.addmm.default and ctx.op_output.shape[-1] == 256)
        ),
    ],
)
def test_1_3_accepts_policies_that_keep_gate_and_up(policy):
    assert_verdict(l1.check_gated_block_policy.verdict(policy), CORRECT, "256 KiB kept",
                   "no matmul run again")


def saving_addmm_number(*numbers, also=None):
    """A policy that saves the forward's addmm number 0 (gate), 1 (up) or 2 (down), and
    the op ``also``."""
    addmm_calls = []

    def policy(ctx, op, *args, **kwargs):
        if op == aten.addmm.default:
            addmm_calls.append(op)
            # the block runs 3 addmm per forward
            return (len(addmm_calls) - 1) % 3 in numbers
        return op == also

    return policy


def keep_matmuls(ctx, op, *args, **kwargs):  # lesson 1's policy, copied
    if op in (aten.addmm.default, aten.mm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize(
    "policy, fragments",
    [
        (
            keep_matmuls,
            ["288 KiB stayed", "also saved down_proj's output",
             "no backward reads down_proj's output"],
        ),
        # the near misses: addmm AND mul; everything but the cheap element-wise
        # op
        (
            lambda ctx, op, *args, **kwargs: (
                op in (aten.addmm.default, aten.mul.Tensor)
            ),
            ["416 KiB stayed", "also saved silu(gate) * up and down_proj's output"],
        ),
        (
            lambda ctx, op, *args, **kwargs: op != aten.silu.default,
            ["448 KiB stayed",
             "silu(gate) * up, down_proj's output and the block's output"],
        ),
        (
            lambda ctx, op, *args, **kwargs: (op == aten.addmm.default
                                              and ctx.op_output.shape[-1] == 256
                                              or op == aten.silu.default),
            ["384 KiB stayed", "also saved silu(gate)", "cheap to recompute"],
        ),
        # saves one of the two: the other's matmul runs again
        (saving_addmm_number(0),
         ["ran 1 matmul again", "saved gate", "up must be saved"]),
        # the bytes of gate and up, but silu's output instead of gate: gate's matmul
        # runs again
        (saving_addmm_number(1, also=aten.silu.default),
         ["ran 1 matmul again", "saved up and silu(gate)", "gate must be saved"]),
        (lambda ctx, op, *args, **kwargs: CheckpointPolicy.PREFER_RECOMPUTE,
         ["ran 2 matmuls again", "saved no tensor"]),
        (lambda ctx, op, *args, **kwargs: op is torch.addmm,
         ["ran 2 matmuls again", "torch.ops.aten.addmm.default"]),
        (
            lambda ctx, op, *args, **kwargs: (
                CheckpointPolicy.MUST_SAVE if op == aten.addmm.default else None
            ),
            ["return on every path"],
        ),
    ],
)
def test_1_3_near_misses_are_not_quite_and_say_why(policy, fragments):
    assert_verdict(l1.check_gated_block_policy.verdict(policy), WRONG, *fragments)


def first_two_matmuls_ever():
    """The reviewer's: a counter never reset saves gate and up in the first forward
    only."""
    seen = []

    def policy(ctx, op, *args, **kwargs):
        if op == aten.addmm.default:
            seen.append(op)
            return len(seen) <= 2
        return False

    return policy


@pytest.mark.parametrize(
    "policy, fragments",
    [
        # made the check fail inside itself before (IndexError)
        (
            first_two_matmuls_ever(),
            ["decided differently each time the block ran forward",
             "saved gate and up in the first forward, then no tensor",
             "a counter that is never reset"],
        ),
        # misleading before: "compare op with aten.addmm.default, not torch.addmm"
        (
            lambda ctx, op, *args, **kwargs: op in (aten.silu.default, aten.mul.Tensor),
            ["ran 2 matmuls again", "saved silu(gate) and silu(gate) * up",
             "does not replace them"],
        ),
        (lambda ctx, op, *args, **kwargs: op == aten.silu.default,
         ["ran 2 matmuls again", "saved silu(gate)", "does not replace them"]),
        (
            lambda ctx, op, *args, **kwargs: (
                CheckpointPolicy.MUST_CPU_OFFLOAD
                if op == aten.addmm.default and ctx.op_output.shape[-1] == 256
                else CheckpointPolicy.PREFER_RECOMPUTE
            ),
            ["ran 2 matmuls again", "returned MUST_CPU_OFFLOAD for gate and up",
             "offload included", "return MUST_SAVE"],
        ),
    ],
)
def test_1_3_the_reviewers_near_misses_are_not_quite_and_say_why(policy, fragments):
    verdict = l1.check_gated_block_policy.verdict(policy)
    assert_verdict(verdict, WRONG, *fragments)
    assert "torch.addmm)" not in verdict.message


def test_1_3_not_done_yet():
    def keep_what_backward_reads(ctx, op, *args, **kwargs):
        ...

    assert_verdict(
        l1.check_gated_block_policy.verdict(keep_what_backward_reads), NOT_DONE, "`...`"
    )


# --- 1.4: a stack of gated blocks in balanced checkpointed segments
# ---------------------------------------

def run(segment, h):
    for block in segment:
        h = block(h)
    return h


# torch.tensor_split's sizes: 3, 2, 2 for 7 in 3
def longest_first(blocks, h, segments):
    for indices in torch.tensor_split(torch.arange(len(blocks)), segments):
        h = checkpoint(run, blocks[indices[0]:indices[-1] + 1], h, use_reentrant=False)
    return h


def by_rounded_bounds(blocks, h, segments):  # 2, 3, 2 for 7 in 3
    bounds = [round(i * len(blocks) / segments) for i in range(segments + 1)]
    for start, end in zip(bounds, bounds[1:]):
        h = checkpoint(
            lambda x, part=blocks[start:end]: run(part, x), h, use_reentrant=False
        )
    return h


# nn.Sequential segments, longest last: 2, 2, 3
def as_sequentials(blocks, h, segments):
    size, extra = divmod(len(blocks), segments)
    start = 0
    for i in range(segments):
        end = start + size + (i >= segments - extra)
        h = checkpoint(torch.nn.Sequential(*blocks[start:end]), h, use_reentrant=False)
        start = end
    return h


def by_array_split(blocks, h, segments):  # numpy's sizes, each segment an nn.Sequential
    for indices in np.array_split(np.arange(len(blocks)), segments):
        h = checkpoint(torch.nn.Sequential(*[blocks[int(i)] for i in indices]), h,
                       use_reentrant=False)
    return h


def by_floor_bounds(blocks, h, segments):
    bounds = [i * len(blocks) // segments for i in range(segments + 1)]
    for start, end in zip(bounds, bounds[1:]):
        h = checkpoint(run, blocks[start:end], h, use_reentrant=False)
    return h


@pytest.mark.parametrize(
    "forward",
    [l1.every_segment_checkpointed, longest_first, by_rounded_bounds, as_sequentials,
     by_array_split, by_floor_bounds],
)
def test_1_4_accepts_balanced_checkpointed_segments(forward):
    assert_verdict(l1.check_checkpointed_segments.verdict(forward), CORRECT,
                   "with 6 blocks in 4 segments, as with 8 in 4 and 7 in 3",
                   "256 KiB kept", "identical gradients")


# the lesson's `range(0, N_BLOCKS, SEGMENT)`: 2, 2, 2, 1 for 7 in 3
def lesson_segments(blocks, h, segments):
    size = len(blocks) // segments
    for start in range(0, len(blocks), size):
        h = checkpoint(run, blocks[start:start + size], h, use_reentrant=False)
    return h


def first_two_unwrapped(blocks, h, segments):
    h = run(blocks[:2], h)
    return l1.every_segment_checkpointed(blocks[2:], h, segments)


def every_block(blocks, h, segments):
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False)
    return h


# 5, 1, 1, 1 for 8 in 4: the right count, unbalanced
def one_long_and_short_ones(blocks, h, segments):
    sizes = [len(blocks) - segments + 1] + [1] * (segments - 1)
    start = 0
    for size in sizes:
        h = checkpoint(run, blocks[start:start + size], h, use_reentrant=False)
        start += size
    return h


def reentrant_default(blocks, h, segments):
    # no use_reentrant: the old reentrant path
    return checkpoint_sequential(blocks, segments, h)


def under_no_grad(blocks, h, segments):
    with torch.no_grad():
        return run(blocks, h)


@pytest.mark.parametrize(
    "forward, fragments",
    [
        # the near miss: its last segment (here the last block) is not
        # checkpointed
        (
            lambda blocks, h, segments: checkpoint_sequential(
                blocks, len(blocks), h, use_reentrant=False
            ),
            ["8 blocks", "block 7 ran outside any checkpoint", "1536 KiB kept",
             "against 256 KiB", "checkpoint_sequential leaves its last segment"],
        ),
        (
            lambda blocks, h, segments: checkpoint_sequential(
                blocks, segments, h, use_reentrant=False
            ),
            ["blocks 6 and 7 ran outside any checkpoint",
             "checkpoint_sequential leaves its last segment"],
        ),
        # the other one: the first two blocks left unwrapped
        (first_two_unwrapped,
         ["blocks 0 and 1 ran outside any checkpoint", "start wrapping at block 0"]),
        (every_block, ["8 checkpointed regions", "not 4", "more regions keep more"]),
        (lambda blocks, h, segments: checkpoint(run, blocks, h, use_reentrant=False),
         ["1 checkpointed region of 8 blocks", "recomputed all at once"]),
        # right for 8 in 4, but 7 in 3 makes 4 segments
        (
            lesson_segments,
            ["7 blocks and segments=3", "4 checkpointed regions of 2, 2, 2 and 1",
             "leaves 1 over"],
        ),
        (
            one_long_and_short_ones,
            ["5, 1, 1 and 1 blocks", "the longest (5 blocks) sets the peak",
             "none longer than 2"],
        ),
        (reentrant_default, ["use_reentrant=False"]),
        (under_no_grad, ["torch.no_grad()"]),
        (lambda blocks, h, segments: run(blocks[:-1], h),
         ["differs from running the blocks"]),
    ],
)
def test_1_4_near_misses_are_not_quite_and_say_why(forward, fragments):
    assert_verdict(l1.check_checkpointed_segments.verdict(forward), WRONG, *fragments)


# the reviewer's: torch.chunk makes 3, 3, 1 of 7 in 3 (and 3 chunks of 6 in 4)
def by_chunk(blocks, h, segments):
    for indices in torch.chunk(torch.arange(len(blocks)), segments):
        h = checkpoint(
            run, blocks[int(indices[0]) : int(indices[-1]) + 1], h, use_reentrant=False
        )
    return h


# the reviewer's: pieces of ceil(n / segments), 3, 3, 1 of 7 in 3
def by_ceil(blocks, h, segments):
    size = math.ceil(len(blocks) / segments)
    for start in range(0, len(blocks), size):
        h = checkpoint(run, blocks[start:start + size], h, use_reentrant=False)
    return h


# 2, 2, 3 of 7 in 3 and 2, 2, 2, 2 of 8 in 4, but 1, 1, 1, 3 of 6 in 4
def last_takes_the_rest(blocks, h, segments):
    size = len(blocks) // segments
    for i in range(segments):
        end = len(blocks) if i == segments - 1 else (i + 1) * size
        h = checkpoint(run, blocks[i * size:end], h, use_reentrant=False)
    return h


# the reviewer's: backward runs blocks[end:end], nothing
def late_binding_after_the_loop(blocks, h, segments):
    start = 0
    for size in l1.balanced_sizes(len(blocks), segments):
        end = start + size
        # the late binding is this wrong answer's mistake, on purpose
        h = checkpoint(lambda x: run(blocks[start:end], x), h,  # noqa: B023
                       use_reentrant=False)
        start = end
    return h


# backward runs the last segment's blocks, every time
def late_binding_in_zip(blocks, h, segments):
    bounds = [i * len(blocks) // segments for i in range(segments + 1)]
    for start, end in zip(bounds, bounds[1:]):
        # the late binding is this wrong answer's mistake, on purpose
        h = checkpoint(lambda x: run(blocks[start:end], x), h,  # noqa: B023
                       use_reentrant=False)
    return h


# the reviewer's: nested checkpoints
def per_block_inside_segments(blocks, h, segments):
    def segment_of_checkpoints(part, x):
        for block in part:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    start = 0
    for size in l1.balanced_sizes(len(blocks), segments):
        h = checkpoint(
            segment_of_checkpoints, blocks[start : start + size], h, use_reentrant=False
        )
        start += size
    return h


def reentrant_with_h_requiring_grad(blocks, h, segments):
    """The reviewer's: changes the caller's h."""
    h.requires_grad_()
    start = 0
    for size in l1.balanced_sizes(len(blocks), segments):
        h = checkpoint(run, blocks[start:start + size], h, use_reentrant=True)
        start += size
    return h


def reentrant_on_a_leaf_copy(blocks, h, segments):
    h = h.detach().requires_grad_()
    start = 0
    for size in l1.balanced_sizes(len(blocks), segments):
        h = checkpoint(run, blocks[start:start + size], h, use_reentrant=True)
        start += size
    return h


# "a one-block segment is not worth a checkpoint"
def one_block_segments_unwrapped(blocks, h, segments):
    start = 0
    for size in l1.balanced_sizes(len(blocks), segments):
        part = blocks[start:start + size]
        h = run(part, h) if size == 1 else checkpoint(run, part, h, use_reentrant=False)
        start += size
    return h


@pytest.mark.parametrize(
    "forward, fragments",
    [
        # fooled the check before (correct): unbalanced, the right count of segments
        (
            by_chunk,
            ["7 blocks and segments=3", "your segments have 3, 3 and 1 blocks",
             "differ by at most one", "2, 2 and 3, in any order",
             "Pieces of ceil(7 / 3) = 3 blocks leave the last one short"],
        ),
        (by_ceil,
         ["7 blocks and segments=3", "3, 3 and 1 blocks", "differ by at most one"]),
        (
            last_takes_the_rest,
            ["6 blocks and segments=4", "1, 1, 1 and 3 blocks",
             "the longest (3 blocks) sets the peak",
             "none longer than 2 blocks (1, 1, 2 and 2, in any order)"],
        ),
        # fooled the check before (correct): every block recomputed twice, or some
        (
            per_block_inside_segments,
            ["8 blocks and segments=4", "not each block once",
             "A checkpoint inside another checkpoint's region"],
        ),
        (
            lambda blocks, h, segments: checkpoint(
                l1.every_segment_checkpointed, blocks, h, segments, use_reentrant=False
            ),
            ["8 blocks and segments=4", "not each block once", "none around them all"],
        ),
        # misleading before: "the longest (2 blocks) sets the peak; balance them"
        (
            reentrant_with_h_requiring_grad,
            ["8 blocks and segments=4", "made the check's h require a gradient",
             "The reentrant checkpoint you ran", "pass use_reentrant=False"],
        ),
        (
            reentrant_on_a_leaf_copy,
            ["8 blocks and segments=4",
             "ran the reentrant checkpoint (use_reentrant=True)",
             "pass use_reentrant=False"],
        ),
        # misleading before: "run it on its own", with no case; or "do not detach h"
        (
            late_binding_after_the_loop,
            ["with 8 blocks and segments=4, calling checkpointed_forward",
             "CheckpointError", "A lambda or def made inside the loop",
             "part=blocks[start:end]"],
        ),
        (
            late_binding_in_zip,
            ["8 blocks and segments=4", "gradients differ", "recomputed " "blocks 6 "
             "and 7 4 " "times each " "and blocks 0, 1, 2, 3, 4 and 5 never",
             "A lambda or def made inside the loop"],
        ),
        (
            lambda blocks, h, segments: run(blocks, h.T),
            ["with 8 blocks and segments=4, " "calling checkpointed_forward "
             "raised RuntimeError"],
        ),
        (
            one_block_segments_unwrapped,
            ["6 blocks and segments=4", "blocks 0 and 1 ran outside any checkpoint",
             "each needs its checkpoint too"],
        ),
    ],
)
def test_1_4_the_reviewers_near_misses_are_not_quite_and_say_why(forward, fragments):
    assert_verdict(l1.check_checkpointed_segments.verdict(forward), WRONG, *fragments)


@pytest.mark.parametrize("n_blocks, segments, fragments", [
    (6, 4, ["3 checkpointed regions of 2, 2 and 2 blocks, not 4", "1 block per "
                                                                  "segment leaves 2 "
                                                                  "over",
            "pieces of ceil(6 / 4) = 2 blocks make only 3"]),
    (9, 4, ["3 checkpointed regions of 3, 3 and 3 blocks, not 4", "pieces of ceil(9 / "
                                                                  "4) = 3 blocks make "
                                                                  "only 3"]),
])
@l1.on_one_thread
def test_1_4_chunks_that_make_too_few_segments_are_told_so(
    n_blocks, segments, fragments
):
    """The reviewer's cases: torch.chunk makes fewer segments; no longer region is
    blamed, none is longer."""
    with pytest.raises(Wrong) as wrong:
        l1.judge_stack_case(by_chunk, n_blocks, segments)
    assert all(fragment in str(wrong.value) for fragment in fragments), str(wrong.value)
    assert "a longer region" not in str(wrong.value)


# misleading before: "do not run the blocks under torch.no_grad()"
def test_1_4_a_detached_output_is_called_detached():
    verdict = l1.check_checkpointed_segments.verdict(
        lambda blocks, h, segments: l1.every_segment_checkpointed(
            blocks, h, segments
        ).detach()
    )
    assert_verdict(verdict, WRONG, "does not require a gradient",
                   "ran with autograd on", "output.detach()")
    assert "no_grad" not in verdict.message


def test_1_4_not_done_yet():
    def checkpointed_forward(blocks, h, segments):
        return ...

    assert_verdict(
        l1.check_checkpointed_segments.verdict(checkpointed_forward), NOT_DONE, "`...`"
    )


@pytest.mark.parametrize("n_blocks, segments", l1.STACK_CASES)
@l1.on_one_thread
def test_1_4_the_reference_peaks_highest_of_the_balanced_orders(n_blocks, segments):
    """The tolerance on the peak is measured against the balanced order with the highest
    peak."""
    blocks, h = l1.stack_case(n_blocks)
    peaks = {
        forward.__name__: l1.stack_measurements(forward, blocks, h, segments)[
            0
        ].peak_activation_bytes
        for forward in (l1.every_segment_checkpointed, longest_first, by_rounded_bounds,
                        by_array_split)
    }
    assert peaks["every_segment_checkpointed"] == max(peaks.values())



# --- all checks
# --------------------------------------------------------------------------------------

def test_a_check_that_fails_itself_says_so(monkeypatch):
    # a check that misreads the block
    monkeypatch.setattr(l1, "GATED_TENSORS", l1.GATED_TENSORS[:-1])
    verdict = l1.check_gated_block_policy.verdict(l1.keep_gate_and_up)
    assert_verdict(
        verdict, CHECK_FAILED, "helpers/practice/check_gradient_checkpointing.py, line"
    )


@pytest.mark.parametrize("check", [
    # checkpoints with preserve_rng_state
    lambda: l1.check_region_before_b_prediction.verdict(RIGHT),
    # builds a model
    lambda: l1.check_switch_on_checkpointing.verdict(l1.intended_switch),
    lambda: l1.check_gated_block_policy.verdict(l1.keep_gate_and_up),  # builds a block
    # builds blocks
    lambda: l1.check_checkpointed_segments.verdict(l1.every_segment_checkpointed),
])
def test_a_check_that_builds_or_trains_leaves_the_learners_random_numbers_alone(check):
    assert draws_after_seeding(check) == draws_after_seeding()


def test_a_check_runs_on_one_thread_and_gives_the_learner_their_thread_count_back():
    threads = torch.get_num_threads()
    seen = []

    def policy(ctx, op, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return l1.keep_gate_and_up(ctx, op, *args, **kwargs)

    torch.set_num_threads(2)
    try:
        assert_verdict(l1.check_gated_block_policy.verdict(policy), CORRECT)
        assert set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
