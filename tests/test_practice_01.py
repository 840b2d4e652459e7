"""Practice 1 (gradient checkpointing): right answers written several ways pass, each
listed mistake gets its own hint, answers in the wrong form are named."""
from fractions import Fraction

import numpy as np
import pytest
import torch
from practice_support import assert_judged, assert_verdict, draws_after_seeding
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

from helpers.practice import check_gradient_checkpointing as l1
from helpers.practice.core import NOT_DONE, WRONG, check

# --- 1.1: a region that ends before B -----------------------------------------------


def test_1_1_judges_predictions_by_what_the_graph_did():
    assert l1.region_measurements() == {"kept_KiB": 256, "A_runs": 1, "B_runs": 1}
    two_tensors = np.sum([128, 128])
    assert_judged(l1.REGION,
                  {"kept_KiB": 256.0, "A_runs": np.int64(1), "B_runs": torch.tensor(1)},
                  {"B_runs": 1, "A_runs": Fraction(2, 2), "kept_KiB": two_tensors})


def test_1_1_two_runs_of_sin_is_what_the_graph_does_without_early_stop():
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        assert l1.region_measurements.__wrapped__()["A_runs"] == 2


@pytest.mark.parametrize("prediction, fragment", [
    ({"kept_KiB": 256, "A_runs": 1}, 'should be {"kept_KiB": n, "A_runs": n'),
    ({"kept_KiB": 256, "A_runs": 1.5, "B_runs": 1}, "rounds up"),
    ({"kept_KiB": 100, "A_runs": 3, "B_runs": 1}, "kept_KiB 100 and A_runs 3"),
])
def test_1_1_names_an_answer_in_the_wrong_form(prediction, fragment):
    assert_verdict(l1.check_region_before_b_prediction.verdict(prediction), WRONG,
                   fragment)


# --- 1.2: the switch in Transformers ------------------------------------------------

def switch_in_two_steps(model):
    options = dict(use_reentrant=False)
    options["preserve_rng_state"] = False
    model.activation_checkpointing_enable(options, every_n_layers=1)


def switch_with_dict_keywords(model):
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(
        preserve_rng_state=False, use_reentrant=False))


def test_1_2_judges_switches_by_what_the_model_then_does():
    assert_judged(l1.SWITCH, switch_in_two_steps, switch_with_dict_keywords)


# --- 1.3: a policy for a gated block ------------------------------------------------

def save_the_wide_ones(ctx, op, *args, **kwargs):  # True saves, as PyTorch allows
    return bool(op == torch.ops.aten.addmm.default and ctx.op_output.shape[-1] > 64)


def save_by_name(ctx, op, *args, **kwargs):
    wide = op is torch.ops.aten.addmm.default and ctx.op_output.shape[1] == 256
    return CheckpointPolicy.PREFER_SAVE if wide else CheckpointPolicy.MUST_RECOMPUTE


def test_1_3_judges_policies_by_what_they_kept_and_ran_again():
    assert_judged(l1.POLICY, save_the_wide_ones, save_by_name)


# --- 1.4: balanced segments, every one checkpointed ---------------------------------

def segments_by_divmod(blocks, h, segments):
    size, extra = divmod(len(blocks), segments)
    start = 0
    for i in range(segments):
        end = start + size + (i < extra)  # the longest first
        h = checkpoint(l1.run_blocks, blocks[start:end], h, use_reentrant=False)
        start = end
    return h


def segments_by_linspace(blocks, h, segments):
    bounds = np.linspace(0, len(blocks), segments + 1).round().astype(int)
    for start, end in zip(bounds[:-1], bounds[1:]):
        h = checkpoint(lambda x, part=blocks[start:end]: l1.run_blocks(part, x), h,
                       use_reentrant=False)
    return h


def test_1_4_judges_forwards_by_what_backward_recomputed_and_kept():
    assert_judged(l1.SEGMENTS, segments_by_divmod, segments_by_linspace)
    assert_verdict(check(l1.SEGMENTS, lambda blocks, h, segments: segments_by_divmod(
        blocks[1:], h, segments)), WRONG, "the output of the blocks run in order False")
    assert_verdict(check(l1.SEGMENTS, lambda blocks, h, segments: None), WRONG,
                   "should return Tensor")


def test_unfinished_answers_are_not_done_and_random_numbers_stay():
    def switch_on_checkpointing(model):
        model.activation_checkpointing_enable(...)

    def checkpointed_forward(blocks, h, segments):
        ...

    for verdict, name in [
            (l1.check_region_before_b_prediction.verdict(
                {"kept_KiB": ..., "A_runs": 1, "B_runs": 1}), "prediction"),
            (l1.check_switch_on_checkpointing.verdict(switch_on_checkpointing),
             "switch_on_checkpointing"),
            (l1.check_checkpointed_segments.verdict(checkpointed_forward),
             "checkpointed_forward")]:
        assert_verdict(verdict, NOT_DONE, f"`...` in {name}")
    assert draws_after_seeding(lambda: check(l1.SEGMENTS, segments_by_divmod)) \
        == draws_after_seeding()
