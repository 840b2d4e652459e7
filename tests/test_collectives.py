"""The collective counter of lesson 03: every collective it wraps, on 2 real processes,
with known byte counts.

Each process sends a float32 tensor of SENT elements (4 bytes each) into buffers of
other sizes, so that counting an output buffer, or a tensor passed by keyword as
nothing, gives another number.
"""
import warnings

import pytest
import torch
import torch.distributed as dist

from helpers.collectives import SENT_ARGUMENT, CollectiveCounter
from helpers.launcher import run_in_processes

SENT = 10  # elements each process sends
PROCESSES = 2


def calls():
    """(label, collective, call) for every wrapped collective, positional and by
    keyword."""
    sent = torch.ones(SENT)
    gathered, scattered = torch.empty(SENT * PROCESSES), torch.empty(SENT // PROCESSES)
    return [
        ("all_reduce", "all_reduce", lambda: dist.all_reduce(sent.clone())),
        ("all_reduce by keyword", "all_reduce",
         lambda: dist.all_reduce(tensor=sent.clone())),
        ("broadcast from 0", "broadcast", lambda: dist.broadcast(sent.clone(), 0)),
        ("broadcast from 1 by keyword", "broadcast",
         lambda: dist.broadcast(tensor=sent.clone(), src=1)),
        (
            "all_gather",
            "all_gather",
            lambda: dist.all_gather(
                [torch.empty(SENT) for _ in range(PROCESSES)], sent
            ),
        ),
        (
            "all_gather by keyword",
            "all_gather",
            lambda: dist.all_gather(
                tensor_list=[torch.empty(SENT) for _ in range(PROCESSES)], tensor=sent
            ),
        ),
        ("all_gather_into_tensor", "all_gather_into_tensor",
         lambda: dist.all_gather_into_tensor(gathered, sent)),
        (
            "all_gather_into_tensor by keyword",
            "all_gather_into_tensor",
            lambda: dist.all_gather_into_tensor(
                output_tensor=gathered, input_tensor=sent
            ),
        ),
        ("all_gather_single", "all_gather_single",
         lambda: dist.all_gather_single(gathered, sent)),
        ("reduce_scatter_tensor", "reduce_scatter_tensor",
         lambda: dist.reduce_scatter_tensor(scattered, sent)),
        ("reduce_scatter_tensor by keyword", "reduce_scatter_tensor",
         lambda: dist.reduce_scatter_tensor(output=scattered, input=sent)),
        ("reduce_scatter_single", "reduce_scatter_single",
         lambda: dist.reduce_scatter_single(scattered, sent)),
        ("barrier", "barrier", lambda: dist.barrier()),
        # two tensors, as DDP broadcasts a module's buffers
        (
            "DDP's buffers from 0",
            "_broadcast_coalesced",
            lambda: dist._broadcast_coalesced(
                dist.group.WORLD, [sent.clone(), sent.clone()], 2**20, 0
            ),
        ),
    ]


def issues_every_collective(accelerator):
    """Each call under its own counter; returns, per process, {label: (collectives
    logged, bytes)}."""
    logged = {}
    with warnings.catch_warnings():
        # torch 2.13 renames some of these; both names are counted
        warnings.simplefilter("ignore", FutureWarning)
        for label, _, call in calls():
            with CollectiveCounter() as counter:
                call()
            logged[label] = ([event["collective"] for event in counter.events],
                             counter.totals()["bytes"])
        with CollectiveCounter() as counter, counter.paused():
            dist.all_reduce(torch.ones(SENT))
        logged["paused"] = ([event["collective"] for event in counter.events],
                            counter.totals()["bytes"])
    return accelerator.gather_for_metrics([logged], use_gather_object=True)


@pytest.fixture(scope="module")
def logged_by_rank():
    return run_in_processes(
        issues_every_collective, (), num_processes=PROCESSES, timeout_s=120
    )


def expected_bytes(label, rank):
    if label == "DDP's buffers from 0":
        return 2 * SENT * 4 if rank == 0 else 0
    if label.startswith("broadcast from"):
        return SENT * 4 if rank == int(label.split()[2]) else 0  # only the source sends
    return 0 if label == "barrier" else SENT * 4  # the input, never the output buffer


@pytest.mark.parametrize(
    "label, collective", [(label, collective) for label, collective, _ in calls()]
)
@pytest.mark.parametrize("rank", range(PROCESSES))
def test_each_collective_counts_the_bytes_this_process_sends(
    logged_by_rank, label, collective, rank
):
    assert logged_by_rank[rank][label] == [[collective], expected_bytes(label, rank)]


def test_every_wrapped_collective_is_tested():
    assert {collective for _, collective, _ in calls()} == set(SENT_ARGUMENT)


def test_paused_collectives_are_not_logged(logged_by_rank):
    assert logged_by_rank[0]["paused"] == [[], 0]


def test_the_counter_restores_torch_distributed_on_exit():
    original = dist.all_reduce
    with CollectiveCounter():
        assert dist.all_reduce is not original
    assert dist.all_reduce is original
