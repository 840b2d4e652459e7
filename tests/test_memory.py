"""The memory meter and op counter, on cases with known answers."""
from functools import partial

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from helpers.memory import LiveTensorTracker, count_ops, measure_memory, storage_key


def test_a_single_matmul_keeps_exactly_its_two_inputs():
    shapes = {}

    def forward():
        x = torch.randn(64, 32, requires_grad=True)  # created inside: counted
        w = torch.randn(32, 16, requires_grad=True)
        shapes["bytes"] = x.nbytes + w.nbytes
        return x @ w

    report = measure_memory(forward)
    assert report.saved_bytes == shapes["bytes"]
    assert len(report.saved_by_autograd) == 2


def block(t):
    return (t.tanh() * t.sin()).exp()


def test_a_checkpointed_region_keeps_only_its_input():
    sizes = {}

    def forward(use_checkpoint):
        h = torch.randn(128, 64, requires_grad=True)
        sizes["input"] = h.nbytes
        return checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)

    with_checkpoint = measure_memory(partial(forward, True))
    without = measure_memory(partial(forward, False))
    assert with_checkpoint.saved_bytes == sizes["input"]
    # tanh keeps its output, sin its input (h), mul both factors; exp keeps its output, which is
    # the region's output and so not counted: 3 distinct tensors of the input's size
    assert without.saved_bytes == 3 * sizes["input"]


def test_saved_bytes_match_what_autograd_packs_without_checkpointing():
    # Reference: PyTorch's own saved_tensors_hooks, summed over distinct storages, plus the
    # leaf h, which the graph holds (in its AccumulateGrad node) to give it a .grad.
    leaf = {}

    def forward():
        h = leaf["h"] = torch.randn(32, 16, requires_grad=True)
        return block(h.relu() @ torch.randn(16, 8)).sum()

    packed = {}
    def pack(t):
        packed[storage_key(t)] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    assert storage_key(leaf["h"]) not in packed  # relu keeps its output, not h
    assert measure_memory(forward).saved_bytes == sum(packed.values()) + leaf["h"].nbytes


def test_selective_checkpointing_keeps_the_must_save_output_outside_autograds_hooks():
    def must_save_mm(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    w = torch.randn(64, 64, requires_grad=True)

    def forward():
        h = torch.randn(32, 64, requires_grad=True)
        region = lambda t: torch.sin(t) * (t @ w)
        return checkpoint(region, h, use_reentrant=False,
                          context_fn=partial(create_selective_checkpoint_contexts, must_save_mm)).sum()

    report = measure_memory(forward)
    assert report.kept("mm") and not report.kept("sin")
    mm_output = next(alloc for name, alloc, _ in report.created_in_forward if name == "mm")
    assert mm_output not in report.saved_by_autograd  # the cache bypasses saved_tensors_hooks
    assert report.saved_bytes == 2 * 32 * 64 * 4  # the region's input and the mm output
    _, backward_ops = count_ops(forward)
    assert backward_ops.get("sin", 0) == 1  # recomputed
    assert backward_ops.get("mm", 0) == 2  # only the two gradient matmuls: no recompute of the cached one


def test_peak_activation_leaves_out_gradients_that_outlive_the_step():
    w = torch.randn(256, 256, requires_grad=True)
    report = measure_memory(lambda: (torch.randn(8, 256) @ w).tanh().sum())
    assert report.peak_bytes >= w.nbytes  # w.grad, created in backward, alive at the end
    assert report.saved_bytes <= report.peak_activation_bytes < w.nbytes  # activations are 8 x 256


def test_output_without_gradient_gets_a_clear_error():
    with pytest.raises(ValueError, match="requires grad"):
        measure_memory(lambda: torch.randn(3, 3).sum())
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad(), pytest.raises(ValueError, match="no_grad"):
        measure_memory(lambda: x.sin().sum())


def test_kept_asks_for_an_op_that_ran():
    report = measure_memory(lambda: torch.randn(4, requires_grad=True).sin().sum())
    with pytest.raises(ValueError, match="ran 'cos' 0 time"):
        report.kept("cos")


def test_views_of_memory_made_before_are_not_counted():
    outside = torch.randn(1000, 1000)
    with LiveTensorTracker() as tracker:
        view = outside.t()[:10]
    assert tracker.peak_bytes == 0 and view.shape == (10, 1000)


def test_count_ops_separates_forward_and_backward():
    forward_ops, backward_ops = count_ops(lambda: torch.randn(4, requires_grad=True).sin().sum())
    assert forward_ops["sin"] == 1 and "sin" not in backward_ops
    assert backward_ops["cos"] == 1  # d sin / dx = cos
