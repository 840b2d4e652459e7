"""Sharding the training state across processes: DDP, ZeroRedundancyOptimizer and
FSDP2, measured on 2 real processes (lesson 06 and its lab).

``launch(stages, model)`` trains a DistilBERT for a few steps on 2 processes started by
the course's launcher (``helpers.launcher``), with plain ``torch.distributed`` on a CPU
device mesh whose group is gloo's on any machine, once for each of ``stages`` (one
launch, the stages one after the other), from ``STAGES``:

- ``"DDP"``: ``DistributedDataParallel``, every rank keeps everything;
- ``"ZeroRedundancyOptimizer"``: DDP plus PyTorch's ZeRO-1 optimizer, the optimizer
  state split (its communication is not the paper's ZeRO-1: DDP's all-reduce, then
  broadcasts);
- ``"FSDP2"``: ``fully_shard`` with ``reshard_after_forward=True`` on every group, the
  root included (the weights freed after each group's forward and gathered again for
  backward, as ZeRO-3); left out, the option is True for the layers and False for the
  root, whose weights stay whole from forward to backward;
- ``"FSDP2, reshard_after_forward=False"``: the whole weights kept from forward to
  backward (ZeRO-2 during the step; between steps FSDP2 still holds only slices).

Each rank reports what it holds between steps (weights, gradients, optimizer state,
counted from the tensors it holds, local shards included), its peak during one step,
the collectives it issued in that step, the backend of the group they ran on, and the
losses. ``ring_bytes`` turns the collectives into the bytes each process sends over a
ring.
"""
import contextlib
import copy
import weakref

import psutil
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils._pytree import tree_leaves

from helpers.collectives import CollectiveCounter, count_ddp
from helpers.launcher import LAUNCH_TIMEOUT_S, run_in_processes
from helpers.memory import LiveTensorTracker, storage_key

STAGES = {  # name -> what it keeps whole on every rank
    "DDP": "everything",
    "ZeroRedundancyOptimizer": "weights and gradients",
    "FSDP2": "nothing between steps; one group's weights at a time",
    "FSDP2, reshard_after_forward=False":
        "nothing between steps; the weights from forward to backward",
}
KINDS = ("weights", "gradients", "optimizer state")
SETTINGS = {  # one launch of one stage
    "steps": 2,  # the first makes the optimizer state, the second is measured
    "measured_step": 2,
    "micro_batch_size": 2,  # sequences per process
    "sequence_length": 16,  # tokens: parameters, not activations, dominate
    "learning_rate": 1e-4,
    "seed": 0,
}


def _check_stage(stage):
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are: "
                         f"{', '.join(map(repr, STAGES))}")


def local_tensor(tensor):
    """The part of ``tensor`` this rank holds: a DTensor's local shard, else itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def bytes_held(tensors):
    """Bytes of the memory blocks behind ``tensors``, each block once (views share)."""
    blocks = {}
    for tensor in tensors:
        storage = local_tensor(tensor).untyped_storage()
        blocks[storage._cdata] = storage.nbytes()
    return sum(blocks.values())


def state_tensors(optimizer):
    """The tensors of this rank's optimizer state (ZeRO-1's: its own partition's)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own one
    return [value for state in inner.state.values() for value in state.values()
            if torch.is_tensor(value)]


def rank_bytes(model, optimizer):
    """{kind: bytes} this rank holds: weights, gradients and optimizer state."""
    parameters = list(model.parameters())
    return {"weights": bytes_held(parameters),
            "gradients": bytes_held([p.grad for p in parameters if p.grad is not None]),
            "optimizer state": bytes_held(state_tensors(optimizer))}


class StepMemoryMeter(LiveTensorTracker):
    """Lesson 1's meter, for a sharded step: it also counts the memory of a DTensor's
    local shard, and blocks that ``UntypedStorage.resize_`` grows or frees (FSDP2
    frees and re-allocates its full weights that way, not with new tensors)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        leaves = tree_leaves((args, kwargs or {}))
        shards = [t for t in leaves if hasattr(t, "to_local")]
        inputs = {storage_key(local_tensor(t)) for t in shards}
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        for tensor in tree_leaves(out):
            if not hasattr(tensor, "to_local"):  # a DTensor: its local shard's memory
                continue
            key = storage_key(local_tensor(tensor))
            if key in self.live or not (aliases or key in inputs):  # new memory
                self._track(local_tensor(tensor), func.overloadpacket.__name__)
        return out

    def _track(self, tensor, op_name):
        key = storage_key(tensor)
        if key not in self.live:
            self.live[key] = [None, 0, 0]
        self.live[key][1] += 1
        weakref.finalize(tensor, self._release, key)
        self._set_size(key, tensor.untyped_storage().nbytes(), op_name)

    def __enter__(self):
        original = self._original_resize = torch.UntypedStorage.resize_
        meter = self

        def resize_(storage, size):
            result = original(storage, size)
            key = storage._cdata
            if key not in meter.live:  # a block made before the step: count from now
                meter.live[key] = [None, 1, 0]  # never released: only resized
            meter._set_size(key, storage.nbytes(), "resize_")
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)


def make_batches(settings, rank, vocab_size):
    """Each step's batch for ``rank``: random token ids, the same on any machine."""
    generator = torch.Generator().manual_seed(settings["seed"])
    size, length = settings["micro_batch_size"], settings["sequence_length"]
    world = dist.get_world_size()
    batches = []
    for _ in range(settings["steps"]):
        input_ids = torch.randint(5, vocab_size, (world * size, length),
                                  generator=generator)  # (global batch, tokens)
        labels = torch.arange(world * size) % 2
        mine = slice(rank * size, (rank + 1) * size)  # this rank's share
        batches.append({"input_ids": input_ids[mine], "labels": labels[mine]})
    return batches


def cpu_mesh():
    """A 1-D device mesh of every process, on the CPU, whose group is gloo's on any
    machine.

    Without ``backend_override``, a 1-D mesh reuses the default process group
    (``torch/distributed/device_mesh.py``): on a machine with a GPU per process the
    launcher makes that group NCCL's, which has no CPU collectives.
    """
    world_size = dist.get_world_size()
    return init_device_mesh("cpu", (world_size,), backend_override={0: "gloo"})


# Lesson 06 shows these lines as a learner writes them; tests/test_sharding.py checks
# that the notebook's cell holds the same function.
def shard_with_fsdp2(model, **options):  # NEW: FSDP2, in each process
    world_size = dist.get_world_size()
    # gloo on any machine: with a GPU per process, the default group is NCCL's
    mesh = init_device_mesh("cpu", (world_size,), backend_override={0: "gloo"})
    for layer in model.distilbert.transformer.layer:
        fully_shard(layer, mesh=mesh, **options)  # one group per transformer layer
    fully_shard(model, mesh=mesh, **options)  # the rest: embeddings, classifier
    return model


def shard(stage, model, group, learning_rate):
    """(model, optimizer, the process group its collectives use) of ``stage``."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    if stage in ("DDP", "ZeroRedundancyOptimizer"):
        # gradients as views of DDP's buckets: no second copy of them
        model = DistributedDataParallel(model, process_group=group,
                                        gradient_as_bucket_view=True,
                                        init_sync=False)  # equal already: one parent
        count_ddp(model)  # its all-reduce, through a hook the counter sees
        if stage == "DDP":
            return model, torch.optim.AdamW(model.parameters(), lr=learning_rate,
                                            fused=True), model.process_group
        optimizer = ZeroRedundancyOptimizer(  # NEW: each rank steps its share
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=learning_rate,
            fused=True, process_group=group)
        return model, optimizer, optimizer.process_group
    model = shard_with_fsdp2(model, reshard_after_forward=stage == "FSDP2")
    mesh = next(model.parameters()).device_mesh  # the one fully_shard used
    return model, torch.optim.AdamW(model.parameters(), lr=learning_rate,
                                    fused=True), mesh.get_group()


def whole_weight_bytes(model):
    """Bytes of the weights registered on ``model`` whole (not as a DTensor shard)."""
    return bytes_held([p for p in model.parameters() if not hasattr(p, "to_local")])


def train_stage(stage, settings, model, group):
    """A few steps of ``stage`` on this process's copy of ``model``: its report."""
    torch.manual_seed(settings["seed"])  # dropout: the same masks in every run
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = make_batches(settings, rank, model.config.vocab_size)
    model, optimizer, stage_group = shard(stage, model, group,
                                          settings["learning_rate"])
    losses, report = [], {"backend": dist.get_backend(stage_group)}
    with CollectiveCounter() as counter:
        for step, batch in enumerate(batches, start=1):
            counter.step = step
            measured = step == settings["measured_step"]
            before = rank_bytes(model, optimizer) if measured else None
            with StepMemoryMeter() if measured else contextlib.nullcontext() as meter:
                loss = model(**batch).loss
                if measured:  # between forward and backward
                    report["whole_weights_after_forward"] = whole_weight_bytes(model)
                loss.backward()
                optimizer.step()
            if measured:
                report["rest_bytes"] = rank_bytes(model, optimizer)
                report["peak_bytes"] = sum(before.values()) + meter.peak_bytes
                report["rss_bytes"] = psutil.Process().memory_info().rss  # the process
            optimizer.zero_grad(set_to_none=False)  # the gradients stay, as counted
            with counter.paused():  # the lesson's own measurement
                mean = loss.detach().clone()
                dist.all_reduce(mean, group=group)
            losses.append(mean.item() / world)
    events = [e for e in counter.events if e["step"] == settings["measured_step"]]
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {
        "rank": rank, "events": events, **report,
        "device": str(next(model.parameters()).device)}, group=group)
    return {"stage": stage, "settings": settings, "losses": losses, "ranks": per_rank}


def train_worker(accelerator, stages, settings, model):
    """What each process runs: each of ``stages`` in turn, on a fresh copy of
    ``model``; the launcher's default group's backend beside them."""
    # On the CPU, on any machine: a mesh of another device type would move the model
    # there.
    group = cpu_mesh().get_group()
    runs = {stage: train_stage(stage, settings, copy.deepcopy(model), group)
            for stage in stages}
    return {"default_backend": dist.get_backend(), "runs": runs}


def launch(stages, model, settings=None, timeout_s=LAUNCH_TIMEOUT_S):
    """Train each of ``stages`` (a name or a list of names) on 2 processes, in one
    launch, each on its own copy of ``model`` (forked from this process: built once, the
    same on each); process 0's report: ``{stage: run}`` for a list, the run for a name.
    Each run's ranks hold ``backend``, the backend of the group its collectives used."""
    names = [stages] if isinstance(stages, str) else list(stages)
    if not names:
        raise ValueError("launch needs at least one stage; the stages are: "
                         f"{', '.join(map(repr, STAGES))}")
    for stage in names:
        _check_stage(stage)
    settings = {**SETTINGS, **(settings or {})}
    # preload=False: the model's code came with the model; the data's is not needed
    result = run_in_processes(train_worker, (names, settings, model), num_processes=2,
                              timeout_s=timeout_s, preload=False)
    for run in result["runs"].values():
        run["default_backend"] = result["default_backend"]
    return result["runs"][stages] if isinstance(stages, str) else result["runs"]


RING_FACTOR = {  # bytes a process sends over a ring, per byte of the counted tensor
    "all_reduce": lambda n: 2 * (n - 1) / n,  # counted: the whole tensor
    "reduce_scatter_single": lambda n: (n - 1) / n,  # counted: the whole input
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_gather_single": lambda n: n - 1,  # counted: this rank's shard
    "all_gather_into_tensor": lambda n: n - 1,
    # counted on its source only: every rank's shard, together an all-gather
    "broadcast": lambda n: n - 1,
    "_broadcast_coalesced": lambda n: n - 1,
    "barrier": lambda n: 0,
}


def ring_bytes(events_by_rank):
    """Bytes each process sends over a ring in the logged collectives, averaged over
    the processes."""
    world = len(events_by_rank)
    total = 0.0
    for events in events_by_rank:
        for event in events:
            total += event["bytes"] * RING_FACTOR[event["collective"]](world)
    return total / world


def accelerate_fsdp_worker(accelerator):
    """What each process runs for the trap: an Accelerator given an FSDP plugin."""
    import warnings

    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # forget the launcher's Accelerator, keep its group
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning, if it gave one
        accelerator = Accelerator(
            cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        model = accelerator.prepare(torch.nn.Linear(4, 4))
    return {"processes": accelerator.num_processes,
            "distributed_type": accelerator.distributed_type.value,
            "wrapped_in": type(model).__name__,
            "warnings": [str(warning.message) for warning in caught]}


def try_accelerate_fsdp():
    """``Accelerator(cpu=True, fsdp_plugin=...)`` on 2 processes: what it made."""
    return run_in_processes(accelerate_fsdp_worker, preload=False)
