"""Practice 1 (gradient checkpointing): right answers written several ways pass; near misses are "not quite",
each with a hint that names what the answer did."""
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, checkpoint_sequential

from helpers.practice.verdicts import CHECK_FAILED, CORRECT, NOT_DONE, WRONG
from helpers.practice import gradient_checkpointing as l1

from practice_support import assert_verdict, draws_after_seeding

aten = torch.ops.aten

# --- 1.1: predict what a region that ends before B keeps and runs ---------------------------------------

RIGHT = {"kept_KiB": 256, "A_runs": 1, "B_runs": 1}


@pytest.mark.parametrize("prediction", [RIGHT, {"kept_KiB": 256.0, "A_runs": 1.0, "B_runs": 1},
                                        {"B_runs": 1, "A_runs": 1, "kept_KiB": 2 * 128}])
def test_1_1_accepts_the_measured_values(prediction):
    assert_verdict(l1.check_region_before_b_prediction.verdict(prediction), CORRECT,
                   "256 KiB kept", "sin 1x", "addmm 1x", "early stop", "same bytes as without checkpointing")


def test_1_1_the_right_answer_is_what_the_graph_does():
    measured = l1.region_before_b_measurements()
    assert {key: measured[key] for key in RIGHT} == RIGHT
    assert measured["kept_without_checkpointing_KiB"] == RIGHT["kept_KiB"]
    assert measured["A_runs_without_early_stop"] == 2  # what the early-stop hint relies on


@pytest.mark.parametrize("prediction, off, fragments", [
    # believes checkpoint drops everything, as in the lesson's full region
    ({"kept_KiB": 0, "A_runs": 2, "B_runs": 2}, "kept_KiB, A_runs and B_runs",
     ["nothing stays", "region's output", "without early stop", "outside the region"]),
    # believes only B is kept, as when B came in from outside in the lesson, and A recomputed
    ({"kept_KiB": 128, "A_runs": 2, "B_runs": 1}, "kept_KiB and A_runs",
     ["one tensor of 128 KiB", "mul, outside it, saves both", "without early stop", "before or after it runs"]),
    # right bytes, but A recomputed: early stop forgotten
    ({"kept_KiB": 256, "A_runs": 2, "B_runs": 1}, "A_runs", ["without early stop"]),
    # C counted as kept
    ({"kept_KiB": 384, "A_runs": 1, "B_runs": 1}, "kept_KiB", ["less stays", "save C"]),
    # B recomputed although it is outside the region
    ({"kept_KiB": 256, "A_runs": 1, "B_runs": 2}, "B_runs", ["computed outside the region"]),
])
def test_1_1_near_misses_are_not_quite_and_say_why(prediction, off, fragments):
    verdict = l1.check_region_before_b_prediction.verdict(prediction)
    assert_verdict(verdict, WRONG, f"off: {off}.", *fragments)
    assert "256" not in verdict.message  # a hint explains; it does not give the measured value away


@pytest.mark.parametrize("prediction, fragment", [
    ([256, 1, 1], '"kept_KiB", "A_runs" and "B_runs"'),
    ({"kept": 256, "A_runs": 1, "B_runs": 1}, '"kept_KiB", "A_runs" and "B_runs"'),
    ({"kept_KiB": "256", "A_runs": 1, "B_runs": 1}, "whole number"),
    ({"kept_KiB": 256.5, "A_runs": 1, "B_runs": 1}, "whole number"),
])
def test_1_1_malformed_predictions(prediction, fragment):
    assert_verdict(l1.check_region_before_b_prediction.verdict(prediction), WRONG, fragment)


def test_1_1_not_done_yet():
    verdict = l1.check_region_before_b_prediction.verdict({"kept_KiB": ..., "A_runs": ..., "B_runs": ...})
    assert_verdict(verdict, NOT_DONE, "`...`")


# --- 1.2: a colleague's switch, fixed ------------------------------------------------------------------

NON_REENTRANT_NO_STASH = {"use_reentrant": False, "preserve_rng_state": False}


@pytest.mark.parametrize("switch", [
    lambda m: m.activation_checkpointing_enable(activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH),
    lambda m: m.activation_checkpointing_enable({"preserve_rng_state": False, "use_reentrant": False},
                                                every_n_layers=1),
    lambda m: m.activation_checkpointing_enable(dict(use_reentrant=False, preserve_rng_state=False), offload=False),
])
def test_1_2_accepts_the_fixed_switch(switch):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), CORRECT,
                   "2 of 2 layers checkpointed", "never copied", "no dropout")


@pytest.mark.parametrize("switch, fragments", [
    # the near miss: the right switch, but not every layer
    (lambda m: m.activation_checkpointing_enable(activation_checkpointing_kwargs=NON_REENTRANT_NO_STASH,
                                                 every_n_layers=2),
     ["1 of the 2 layers (distilbert.transformer.layer.1) ran without a checkpoint", "every layer",
      "every_n_layers=2 checkpoints only every second layer"]),
    (lambda m: m.activation_checkpointing_enable(every_n_layers=2), ["1 of the 2 layers", "random-number state"]),
    # the deprecated name, otherwise right: the exercise asks for today's name
    (lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=NON_REENTRANT_NO_STASH),
     ["deprecated name", "activation_checkpointing_enable"]),
    # the colleague's line as given: deprecated, and its dict replaces the default use_reentrant=False
    (lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"preserve_rng_state": False}),
     ["2 things to fix", "deprecated name", "replaced Transformers' default {'use_reentrant': False}"]),
    # today's name, but the same dict: PyTorch falls back to the reentrant checkpoint
    (lambda m: m.activation_checkpointing_enable(activation_checkpointing_kwargs={"preserve_rng_state": False}),
     ["the reentrant checkpoint ran", "replaced Transformers' default", "incompatible with .grad()"]),
    (lambda m: m.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": True, "preserve_rng_state": False}),
     ["the reentrant checkpoint ran", "asked for the reentrant checkpoint"]),
    # the lesson's line: right in every way but the random-number state
    (lambda m: m.activation_checkpointing_enable(), ["random-number state", "preserve_rng_state"]),
    (lambda m: setattr(m, "gradient_checkpointing", True), ["nothing changed"]),
    (lambda m: setattr(m.config, "gradient_checkpointing", True), ["nothing changed"]),
    (lambda m: m.enable_checkpointing(), ["AttributeError"]),
])
def test_1_2_near_misses_are_not_quite_and_say_why(switch, fragments):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), WRONG, *fragments)


def test_1_2_not_done_yet():
    def switch_on_checkpointing(model):
        ...

    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch_on_checkpointing), NOT_DONE, "`...`")


# --- 1.3: a policy for the gated block ---------------------------------------------------------------

def keep_hidden_wide_matmuls(ctx, op, *args, **kwargs):
    if op == aten.addmm.default and ctx.op_output.shape[-1] == 256:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy", [
    keep_hidden_wide_matmuls,
    l1.keep_gate_and_up,
    # by the bias's length, with booleans (PyTorch accepts them)
    lambda ctx, op, *args, **kwargs: op.overloadpacket == aten.addmm and args[0].shape[0] == 256,
    # by the weight's shape; PREFER_SAVE and MUST_RECOMPUTE
    lambda ctx, op, *args, **kwargs: (CheckpointPolicy.PREFER_SAVE
                                      if op == aten.addmm.default and args[2].shape == (64, 256)
                                      else CheckpointPolicy.MUST_RECOMPUTE),
    # saving the weight views too costs nothing: they are views of weights that exist anyway
    lambda ctx, op, *args, **kwargs: op == aten.t.default or (op == aten.addmm.default
                                                               and ctx.op_output.shape[-1] == 256),
])
def test_1_3_accepts_policies_that_keep_gate_and_up(policy):
    assert_verdict(l1.check_gated_block_policy.verdict(policy), CORRECT, "256 KiB kept", "no matmul run again")


def saving_addmm_number(*numbers, also=None):
    """A policy that saves the forward's addmm number 0 (gate), 1 (up) or 2 (down), and the op ``also``."""
    addmm_calls = []

    def policy(ctx, op, *args, **kwargs):
        if op == aten.addmm.default:
            addmm_calls.append(op)
            return (len(addmm_calls) - 1) % 3 in numbers  # the block runs 3 addmm per forward
        return op == also

    return policy


def keep_matmuls(ctx, op, *args, **kwargs):  # lesson 1's policy, copied
    if op in (aten.addmm.default, aten.mm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy, fragments", [
    (keep_matmuls, ["288 KiB stayed", "also saved down_proj's output", "no backward reads down_proj's output"]),
    # the near misses: addmm AND mul; everything but the cheap element-wise op
    (lambda ctx, op, *args, **kwargs: op in (aten.addmm.default, aten.mul.Tensor),
     ["416 KiB stayed", "also saved silu(gate) * up and down_proj's output"]),
    (lambda ctx, op, *args, **kwargs: op != aten.silu.default,
     ["448 KiB stayed", "silu(gate) * up, down_proj's output and the block's output"]),
    (lambda ctx, op, *args, **kwargs: op == aten.addmm.default and ctx.op_output.shape[-1] == 256
     or op == aten.silu.default, ["384 KiB stayed", "also saved silu(gate)", "cheap to recompute"]),
    # saves one of the two: the other's matmul runs again
    (saving_addmm_number(0), ["ran 1 matmul again", "saved gate", "up must be saved"]),
    # the bytes of gate and up, but silu's output instead of gate: gate's matmul runs again
    (saving_addmm_number(1, also=aten.silu.default), ["ran 1 matmul again", "saved up and silu(gate)",
                                                      "gate must be saved"]),
    (lambda ctx, op, *args, **kwargs: CheckpointPolicy.PREFER_RECOMPUTE, ["ran 2 matmuls again", "saved no tensor"]),
    (lambda ctx, op, *args, **kwargs: op is torch.addmm, ["ran 2 matmuls again", "torch.ops.aten.addmm.default"]),
    (lambda ctx, op, *args, **kwargs: CheckpointPolicy.MUST_SAVE if op == aten.addmm.default else None,
     ["return on every path"]),
])
def test_1_3_near_misses_are_not_quite_and_say_why(policy, fragments):
    assert_verdict(l1.check_gated_block_policy.verdict(policy), WRONG, *fragments)


def test_1_3_not_done_yet():
    def keep_what_backward_reads(ctx, op, *args, **kwargs):
        ...

    assert_verdict(l1.check_gated_block_policy.verdict(keep_what_backward_reads), NOT_DONE, "`...`")


# --- 1.4: a stack of gated blocks in balanced checkpointed segments ---------------------------------------

def run(segment, h):
    for block in segment:
        h = block(h)
    return h


def longest_first(blocks, h, segments):  # torch.tensor_split's sizes: 3, 2, 2 for 7 in 3
    for indices in torch.tensor_split(torch.arange(len(blocks)), segments):
        h = checkpoint(run, blocks[indices[0]:indices[-1] + 1], h, use_reentrant=False)
    return h


def by_rounded_bounds(blocks, h, segments):  # 2, 3, 2 for 7 in 3
    bounds = [round(i * len(blocks) / segments) for i in range(segments + 1)]
    for start, end in zip(bounds, bounds[1:]):
        h = checkpoint(lambda x, part=blocks[start:end]: run(part, x), h, use_reentrant=False)
    return h


def as_sequentials(blocks, h, segments):  # nn.Sequential segments, longest last: 2, 2, 3
    size, extra = divmod(len(blocks), segments)
    start = 0
    for i in range(segments):
        end = start + size + (i >= segments - extra)
        h = checkpoint(torch.nn.Sequential(*blocks[start:end]), h, use_reentrant=False)
        start = end
    return h


@pytest.mark.parametrize("forward", [l1.every_segment_checkpointed, longest_first, by_rounded_bounds, as_sequentials])
def test_1_4_accepts_balanced_checkpointed_segments(forward):
    assert_verdict(l1.check_checkpointed_segments.verdict(forward), CORRECT,
                   "with 7 blocks in 3 segments, as with 8 in 4", "192 KiB kept", "identical gradients")


def lesson_segments(blocks, h, segments):  # the lesson's `range(0, N_BLOCKS, SEGMENT)`: 2, 2, 2, 1 for 7 in 3
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


def one_long_and_short_ones(blocks, h, segments):  # 5, 1, 1, 1 for 8 in 4: the right count, unbalanced
    sizes = [len(blocks) - segments + 1] + [1] * (segments - 1)
    start = 0
    for size in sizes:
        h = checkpoint(run, blocks[start:start + size], h, use_reentrant=False)
        start += size
    return h


def reentrant_default(blocks, h, segments):
    return checkpoint_sequential(blocks, segments, h)  # no use_reentrant: the old reentrant path


def under_no_grad(blocks, h, segments):
    with torch.no_grad():
        return run(blocks, h)


@pytest.mark.parametrize("forward, fragments", [
    # the near miss: its last segment (here the last block) is not checkpointed
    (lambda blocks, h, segments: checkpoint_sequential(blocks, len(blocks), h, use_reentrant=False),
     ["8 blocks", "block 7 ran outside any checkpoint", "1536 KiB kept", "against 256 KiB",
      "checkpoint_sequential leaves its last segment"]),
    (lambda blocks, h, segments: checkpoint_sequential(blocks, segments, h, use_reentrant=False),
     ["blocks 6 and 7 ran outside any checkpoint", "checkpoint_sequential leaves its last segment"]),
    # the other one: the first two blocks left unwrapped
    (first_two_unwrapped, ["blocks 0 and 1 ran outside any checkpoint", "start wrapping at block 0"]),
    (every_block, ["8 checkpointed regions", "not 4", "more regions keep more"]),
    (lambda blocks, h, segments: checkpoint(run, blocks, h, use_reentrant=False),
     ["1 checkpointed region of 8 blocks", "recomputed all at once"]),
    # right for 8 in 4, but 7 in 3 makes 4 segments
    (lesson_segments, ["7 blocks and segments=3", "4 checkpointed regions of 2, 2, 2 and 1", "leaves 1 over"]),
    (one_long_and_short_ones, ["5, 1, 1 and 1 blocks", "the longest (5 blocks) sets the peak", "none longer than 2"]),
    (reentrant_default, ["use_reentrant=False"]),
    (under_no_grad, ["torch.no_grad()"]),
    (lambda blocks, h, segments: run(blocks[:-1], h), ["differs from running the blocks"]),
])
def test_1_4_near_misses_are_not_quite_and_say_why(forward, fragments):
    assert_verdict(l1.check_checkpointed_segments.verdict(forward), WRONG, *fragments)


def test_1_4_not_done_yet():
    def checkpointed_forward(blocks, h, segments):
        return ...

    assert_verdict(l1.check_checkpointed_segments.verdict(checkpointed_forward), NOT_DONE, "`...`")


@l1.on_one_thread
def test_1_4_the_reference_peaks_highest_of_the_balanced_orders():
    """The tolerance on the peak is measured against the balanced order with the highest peak."""
    blocks, h = l1.stack_case(7)
    peaks = {forward.__name__: l1.stack_measurements(forward, blocks, h, 3)[0].peak_activation_bytes
             for forward in (l1.every_segment_checkpointed, longest_first, by_rounded_bounds)}
    assert max(peaks, key=peaks.get) == "every_segment_checkpointed" and len(set(peaks.values())) == 3


# --- all checks ------------------------------------------------------------------------------------------

def test_a_check_that_fails_itself_says_so(monkeypatch):
    monkeypatch.setattr(l1, "GATED_TENSORS", l1.GATED_TENSORS[:-1])  # a check that misreads the block
    verdict = l1.check_gated_block_policy.verdict(l1.keep_gate_and_up)
    assert_verdict(verdict, CHECK_FAILED, "helpers/practice/gradient_checkpointing.py, line")


@pytest.mark.parametrize("check", [
    lambda: l1.check_region_before_b_prediction.verdict(RIGHT),  # checkpoints with preserve_rng_state
    lambda: l1.check_switch_on_checkpointing.verdict(l1.intended_switch),  # builds a model
    lambda: l1.check_gated_block_policy.verdict(l1.keep_gate_and_up),  # builds a block
    lambda: l1.check_checkpointed_segments.verdict(l1.every_segment_checkpointed),  # builds blocks
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
