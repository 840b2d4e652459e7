"""The memory meter and op counter, on cases with known answers."""
import itertools
import weakref
from functools import partial

import pytest
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

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
    # tanh keeps its output, sin its input (h), mul both factors; exp keeps its output,
    # which is the region's output and so not counted: 3 distinct tensors of the input's
    # size
    assert without.saved_bytes == 3 * sizes["input"]


def test_saved_bytes_match_what_autograd_packs_without_checkpointing():
    # Reference: PyTorch's own saved_tensors_hooks, summed over distinct storages, plus
    # the leaf h, which the graph holds (in its AccumulateGrad node) to give it a .grad.
    leaf = {}

    def forward():
        h = leaf["h"] = torch.randn(32, 16, requires_grad=True)
        return block(h.relu() @ torch.randn(16, 8)).sum()

    packed = {}
    def pack(t):
        packed[storage_key(t)] = t.untyped_storage().nbytes()
        # not t: a tensor that saves itself would never be freed (saved_tensors_hooks'
        # warning)
        return t.detach()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    assert storage_key(leaf["h"]) not in packed  # relu keeps its output, not h
    assert (
        measure_memory(forward).saved_bytes == sum(packed.values()) + leaf["h"].nbytes
    )


def must_save_mm(ctx, op, *args, **kwargs):
    return (CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default
            else CheckpointPolicy.PREFER_RECOMPUTE)


SAC_WEIGHT = torch.randn(64, 64, requires_grad=True)


def sin_times_mm(t):
    return torch.sin(t) * (t @ SAC_WEIGHT)


def sin_times_mm_loss(how):
    """The loss of sin(h) * (h @ w) for a fresh h (allocation 0), without checkpoint or
    with one."""
    h = torch.randn(32, 64, requires_grad=True)
    if how == "none":
        return sin_times_mm(h).sum()
    context_fn = (partial(create_selective_checkpoint_contexts, must_save_mm)
                  if how == "selective" else None)
    kwargs = {"context_fn": context_fn} if context_fn else {}
    return checkpoint(sin_times_mm, h, use_reentrant=False, **kwargs).sum()


def test_autograds_hooks_see_every_saved_tensor_without_checkpointing():
    report = measure_memory(partial(sin_times_mm_loss, "none"))
    ids = {name: alloc for name, alloc, _ in report.created_in_forward}
    # sin and mm save h; mul saves both of its factors, sin(h) and h @ w
    assert report.saved_by_autograd == {ids["randn"], ids["sin"], ids["mm"]}
    assert report.saved_bytes == 3 * 32 * 64 * 4


@pytest.mark.parametrize("how", ["plain", "selective"])
def test_inside_a_checkpoint_autograds_hooks_see_only_the_regions_input(how):
    # Every checkpoint enters saved_tensors_hooks of its own around the region's
    # forward, and only the innermost pair applies (torch/autograd/graph.py,
    # saved_tensors_hooks' warning; _checkpoint_hook in torch/utils/checkpoint.py): the
    # meter's pack never sees a tensor saved inside the region. It sees the region's
    # input, which checkpoint saves before entering its hooks. So that count says
    # nothing of what the region keeps: plain checkpointing shows only the input too.
    report = measure_memory(partial(sin_times_mm_loss, how))
    assert report.saved_by_autograd == {0}  # h, the randn
    if how == "plain":
        assert report.alive_after_forward == {0} and report.saved_bytes == 32 * 64 * 4
    else:  # the selective cache keeps the mm output, out of autograd's sight
        assert report.kept("mm") and not report.kept("sin")
        # the region's input and the mm output
        assert report.saved_bytes == 2 * 32 * 64 * 4
        _, backward_ops = count_ops(partial(sin_times_mm_loss, how))
        assert backward_ops.get("sin", 0) == 1  # recomputed
        # only the two gradient matmuls: no recompute of the cached one
        assert backward_ops.get("mm", 0) == 2


def test_peak_activation_leaves_out_gradients_that_outlive_the_step():
    w = torch.randn(256, 256, requires_grad=True)
    report = measure_memory(lambda: (torch.randn(8, 256) @ w).tanh().sum())
    # w.grad, created in backward, alive at the end
    assert report.peak_bytes >= w.nbytes
    # activations are 8 x 256
    assert report.saved_bytes <= report.peak_activation_bytes < w.nbytes


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
    forward_ops, backward_ops = count_ops(
        lambda: torch.randn(4, requires_grad=True).sin().sum()
    )
    assert forward_ops["sin"] == 1 and "sin" not in backward_ops
    assert backward_ops["cos"] == 1  # d sin / dx = cos


N = 1000  # elements of float32: one unit of 4000 bytes
UNIT = 4 * N


def test_the_peak_of_two_ops_by_hand():
    x = torch.randn(N, requires_grad=True)  # made before: not counted
    report = measure_memory(lambda: x.sin().exp())
    # Forward: sin makes a, exp makes b (2 units at once); sin keeps x, exp keeps its
    # output b, so a dies and nothing but the output is left: 0 bytes kept for backward.
    assert report.saved_bytes == 0
    # Backward, with the output b alive: b and the gradient of ones g (2 units); exp's
    # backward makes g1 = g * b (3); sin's backward makes cos(x) (4), then g1 * cos(x)
    # (5), which becomes x.grad.
    assert report.peak_bytes == 5 * UNIT
    assert report.peak_activation_bytes == 4 * UNIT  # x.grad outlives the step
    assert torch.equal(x.grad, x.detach().cos() * x.detach().sin().exp())


def test_the_peak_with_one_checkpoint_by_hand():
    x = torch.randn(N, requires_grad=True)

    def first_half(t):
        return t.exp().exp()

    plain = measure_memory(lambda: first_half(x).exp().exp().sum())
    checkpointed = measure_memory(
        lambda: checkpoint(first_half, x, use_reentrant=False).exp().exp().sum()
    )
    scalars = 2 * 4  # the loss and its gradient of ones, alive through backward
    # Without: each exp keeps its output, 4 units; the first backward mul makes a fifth.
    assert plain.saved_bytes == 4 * UNIT
    assert plain.peak_bytes == plain.peak_activation_bytes == 5 * UNIT + scalars
    # With: the region keeps nothing (its input x was made before); the two exps after
    # it keep theirs. Backward through those two (3 units at most) leaves only the
    # gradient g of the region's output (1 unit); then the region runs again, its two
    # outputs (3), and g times the second makes a fourth.
    assert checkpointed.saved_bytes == 2 * UNIT
    assert (checkpointed.peak_bytes == checkpointed.peak_activation_bytes
            == 4 * UNIT + scalars)


def test_a_tensor_that_saves_itself_is_freed_when_dropped():
    x = torch.randn(N, requires_grad=True)
    dropped = {}

    def forward():
        # exp keeps its own output for backward: y's grad_fn holds y's memory
        y = x.exp()
        dropped["y"] = weakref.ref(y)
        return x.sin().sum()

    report = measure_memory(forward)
    # gone at once, without waiting for the garbage collector
    assert dropped["y"]() is None
    # sin keeps x (made before), sum nothing
    assert not report.kept("exp") and report.saved_bytes == 0


def test_a_tensor_that_saves_itself_is_kept_while_used_and_gives_the_right_gradient():
    x = torch.randn(N, requires_grad=True)
    report = measure_memory(lambda: x.exp().sum())
    assert report.kept("exp") and report.saved_bytes == UNIT
    exp_id = next(
        alloc for name, alloc, _ in report.created_in_forward if name == "exp"
    )
    assert report.saved_by_autograd == {exp_id}
    # backward used what the meter's hooks unpacked
    assert torch.equal(x.grad, x.detach().exp())


def test_the_events_replay_the_peak_and_leave_what_outlives_the_step():
    x = torch.randn(N, requires_grad=True)
    # the two-op graph above: a peak of 5 units
    report = measure_memory(lambda: x.sin().exp())
    live = list(itertools.accumulate(change for _, change in report.events))
    assert max(live) == report.peak_bytes == 5 * UNIT
    assert live[-1] == x.grad.nbytes == UNIT  # at the end only x.grad is left
    created = [alloc for alloc, change in report.events if change > 0]
    freed = [alloc for alloc, change in report.events if change < 0]
    # ids in the order of creation, each made once
    assert created == list(range(len(created)))
    assert len(set(created) - set(freed)) == 1  # all freed but x.grad


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's answer")
def test_without_a_gpu_there_is_no_allocator_peak():
    assert (
        measure_memory(
            lambda: torch.randn(4, requires_grad=True).sin().sum()
        ).cuda_peak_bytes
        is None
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_allocators_peak_is_at_least_the_meters():
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    # cuBLAS allocates its workspace once, before the measurement
    (x @ x).sum().backward()
    x.grad = None
    report = measure_memory(lambda: (x @ x).tanh().sum())
    # the allocator rounds every block up and holds what kernels allocate for themselves
    assert report.peak_bytes <= report.cuda_peak_bytes


def test_forward_only():
    x = torch.randn(N, requires_grad=True)
    report = measure_memory(lambda: x.sin().exp(), backward=False)
    # sin's a and exp's b alive at once; then the output and its graph go, freeing
    # everything
    assert report.saved_bytes == 0 and report.peak_bytes == 2 * UNIT
    # nothing outlives the step, not even b
    assert report.peak_activation_bytes == 2 * UNIT
    assert x.grad is None


def test_memory_grown_after_creation_is_counted():
    with LiveTensorTracker() as tracker:
        empty = torch.empty(0)  # no memory yet
        empty.resize_(1000)  # 4000 bytes
        small = torch.empty(10)  # 40 bytes
        small.resize_(500)  # grown to 2000 bytes, at a new address
    assert tracker.peak_bytes == tracker.live_bytes == 4000 + 2000
    assert [(name, nbytes) for name, _, nbytes in tracker.created] == [
        ("resize_", 4000),
        ("empty", 2000),
    ]
    del empty
    assert tracker.live_bytes == 2000
    del small
    assert tracker.live_bytes == 0


def test_an_out_argument_filled_in_forward_is_counted_as_kept():
    x = torch.randn(N, requires_grad=True)

    def forward():
        buffer = torch.empty(0)
        torch.sin(x.detach(), out=buffer)  # sin grows the empty buffer to N floats
        return (buffer * x).sum()  # mul keeps buffer, the factor of x's gradient

    report = measure_memory(forward)
    assert report.saved_bytes == UNIT and report.kept("sin")


def test_unsafe_view_of_memory_made_before_is_not_new():
    outside = torch.randn(N)
    with LiveTensorTracker() as tracker:
        # _unsafe_view returns its input's memory, but its schema declares no alias
        of_outside = torch.ops.aten._unsafe_view(outside, (10, 100))
        inside = torch.randn(N)
        of_inside = torch.ops.aten._unsafe_view(inside, (10, 100))
    assert tracker.peak_bytes == UNIT and of_outside.data_ptr() == outside.data_ptr()
    del inside
    assert tracker.live_bytes == UNIT  # of_inside still holds that memory
    del of_inside
    assert tracker.live_bytes == 0


def test_torch_tensor_is_new_memory():
    with LiveTensorTracker() as tracker:
        torch.tensor([1.0, 2.0, 3.0])
    assert tracker.peak_bytes == 12 and tracker.live_bytes == 0
