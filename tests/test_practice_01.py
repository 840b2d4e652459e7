"""Practice 1 (gradient checkpointing): right answers pass; near misses and typical mistakes get the intended message."""
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, checkpoint_sequential

from helpers.practice.verdicts import CORRECT, NOT_DONE, WRONG
from helpers.practice import gradient_checkpointing as l1

from practice_support import assert_verdict, draws_after_seeding


@pytest.mark.parametrize("prediction", [{"A": 2, "B": 2, "C": 1}, {"A": 2.0, "B": 2, "C": 1}])
def test_1_1_accepts_the_measured_counts(prediction):
    assert_verdict(l1.check_recompute_prediction.verdict(prediction), CORRECT, "A 2x, B 2x, C 1x")


@pytest.mark.parametrize("prediction, fragment", [
    ({"A": 2, "B": 2, "C": 2}, "C is not"),                    # believes everything is recomputed
    ({"A": 1, "B": 1, "C": 1}, "how many times must each"),    # believes nothing is recomputed
    ([2, 2, 1], 'keys "A", "B" and "C"'),
    ({"A": "two", "B": 2, "C": 1}, "whole number"),
])
def test_1_1_rejects_typical_predictions(prediction, fragment):
    assert_verdict(l1.check_recompute_prediction.verdict(prediction), WRONG, fragment)


def test_1_1_not_done_yet():
    assert_verdict(l1.check_recompute_prediction.verdict({"A": ..., "B": ..., "C": ...}), NOT_DONE, "`...`")


@pytest.mark.parametrize("switch", [
    lambda m: m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}),
    lambda m: m.activation_checkpointing_enable(),
])
def test_1_2_accepts_the_switch(switch):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), CORRECT, "x less")


def test_1_2_accepts_the_deprecated_name_with_a_note():
    verdict = l1.check_switch_on_checkpointing.verdict(lambda m: m.gradient_checkpointing_enable())
    assert_verdict(verdict, CORRECT, "deprecated name")


@pytest.mark.parametrize("switch, fragment", [
    (lambda m: setattr(m, "gradient_checkpointing", True), "nothing changed"),
    (lambda m: setattr(m.config, "gradient_checkpointing", True), "nothing changed"),
    (lambda m: m.enable_checkpointing(), "AttributeError"),
])
def test_1_2_rejects_attributes_and_wrong_names(switch, fragment):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), WRONG, fragment)


def keep_addmm(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.addmm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy", [
    keep_addmm,
    lambda ctx, op, *a, **k: op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default),  # bools are allowed
    lambda ctx, op, *a, **k: (CheckpointPolicy.PREFER_SAVE if op.overloadpacket == torch.ops.aten.addmm
                              else CheckpointPolicy.MUST_RECOMPUTE),
])
def test_1_3_accepts_policies_that_keep_the_matrix_multiply(policy):
    assert_verdict(l1.check_keep_expensive_policy.verdict(policy), CORRECT, "addmm 0x")


@pytest.mark.parametrize("policy, fragment", [
    (lambda ctx, op, *a, **k: op is torch.addmm, "torch.ops.aten.addmm.default"),  # the Python function, never seen
    (lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE, "nothing was recomputed"),
    (lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.addmm.default else None,
     "return on every path"),
])
def test_1_3_rejects_typical_policies(policy, fragment):
    assert_verdict(l1.check_keep_expensive_policy.verdict(policy), WRONG, fragment)


def reentrant_default(blocks, h):
    for block in blocks:
        h = checkpoint(block, h)  # no use_reentrant: the old reentrant path
    return h


def under_no_grad(blocks, h):
    with torch.no_grad():
        return l1.plain_forward(blocks, h)


@pytest.mark.parametrize("forward", [
    l1.every_block_checkpointed,
    lambda blocks, h: checkpoint_sequential(blocks, len(blocks), h, use_reentrant=False),
])
def test_1_4_accepts_one_checkpoint_per_block(forward):
    assert_verdict(l1.check_checkpointed_forward.verdict(forward), CORRECT, "only the blocks' inputs")


@pytest.mark.parametrize("forward, fragment", [
    (l1.plain_forward, "as much as without checkpointing"),
    (lambda blocks, h: checkpoint(l1.plain_forward, blocks, h, use_reentrant=False), "recomputed all at once"),
    (reentrant_default, "use_reentrant=False"),
    (under_no_grad, "torch.no_grad()"),
    (lambda blocks, h: blocks[0](h), "differs from running the blocks"),
])
def test_1_4_rejects_typical_forwards(forward, fragment):
    assert_verdict(l1.check_checkpointed_forward.verdict(forward), WRONG, fragment)


def test_a_check_that_builds_or_trains_leaves_the_learners_random_numbers_alone():
    check = lambda: l1.check_checkpointed_forward.verdict(l1.every_block_checkpointed)  # "1.4 (builds blocks)"
    assert draws_after_seeding(check) == draws_after_seeding()
