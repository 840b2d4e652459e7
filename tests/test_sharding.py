"""Lesson 06's sharding helpers (helpers/sharding.py): the ring formulas, the byte
count, the meter's resized blocks, and two stages on 2 real processes against DDP."""
import time

import pytest
import torch

from helpers.launcher import WorkerFailedError
from helpers.models import build_model
from helpers.sharding import StepMemoryMeter, bytes_held, launch, ring_bytes


def events(collective, sent):
    return [{"step": 2, "collective": collective, "bytes": sent}]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_bytes_follow_the_textbook_formulas(n):
    full = 1000 * n  # bytes of the full tensor
    per_process = {  # each process's log -> bytes each process sends over a ring
        "all_reduce": (events("all_reduce", full), 2 * (n - 1) / n * full),
        "all-gather": (events("all_gather_single", full // n), (n - 1) / n * full),
        "reduce-scatter": (events("reduce_scatter_single", full), (n - 1) / n * full),
    }
    for name, (log, expected) in per_process.items():
        assert ring_bytes([log] * n) == pytest.approx(expected), name
    # ZeroRedundancyOptimizer: each process broadcasts its own share, once
    shares = [events("broadcast", full // n)] * n
    assert ring_bytes(shares) == pytest.approx((n - 1) / n * full)
    assert ring_bytes([events("barrier", 0)] * n) == 0


def test_bytes_held_counts_each_block_once():
    weight = torch.zeros(10, 4)  # 160 bytes
    assert bytes_held([weight, weight[0], weight.t(), torch.zeros(3)]) == 160 + 12


def test_the_meter_counts_a_block_that_resize_grows_and_frees():
    gathered = torch.empty(1000)  # made before the step, as FSDP2's buffers are
    gathered.untyped_storage().resize_(0)
    original = torch.UntypedStorage.resize_
    with StepMemoryMeter() as meter:
        gathered.untyped_storage().resize_(4000)  # bytes: FSDP2 gathers into it
        extra = torch.ones(10)  # 40 bytes, a new tensor
        gathered.untyped_storage().resize_(0)  # and frees it
    assert (meter.peak_bytes, meter.live_bytes) == (4040, 40)
    assert torch.UntypedStorage.resize_ is original  # PyTorch's own again
    assert extra.sum() == 10


def test_an_unknown_stage_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="unknown stage 'ZeRO-2'; the stages are: "):
        launch("ZeRO-2", torch.nn.Linear(2, 2))


def test_a_failing_worker_shows_its_traceback_within_seconds():
    start = time.perf_counter()
    with pytest.raises(WorkerFailedError, match="has no attribute 'config'"):
        launch("DDP", torch.nn.Linear(2, 2))  # not a DistilBERT: no config
    assert time.perf_counter() - start < 60


def test_fsdp2_holds_half_of_ddp_and_trains_the_same():
    model = build_model("tiny", seed=0)  # every first dimension even: no padding
    ddp, zero3 = (launch(stage, model) for stage in ("DDP", "FSDP2, reshard"))
    for ddp_rank, zero3_rank in zip(ddp["ranks"], zero3["ranks"]):
        ddp_rest, zero3_rest = ddp_rank["rest_bytes"], zero3_rank["rest_bytes"]
        assert zero3_rest["weights"] * 2 == ddp_rest["weights"]
        assert zero3_rest["gradients"] * 2 == ddp_rest["gradients"]
        steps = len(list(model.parameters())) * 4  # AdamW's step counters, whole
        assert (zero3_rest["optimizer state"] - steps) * 2 == (
            ddp_rest["optimizer state"] - steps)
        assert zero3_rank["whole_weights_after_forward"] == 0  # resharded after forward
        assert ddp_rank["whole_weights_after_forward"] == ddp_rest["weights"]
        assert zero3_rank["peak_bytes"] < ddp_rank["peak_bytes"]
    assert zero3["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert ring_bytes([r["events"] for r in zero3["ranks"]]) == pytest.approx(
        1.5 * ring_bytes([r["events"] for r in ddp["ranks"]]), rel=0.01)
