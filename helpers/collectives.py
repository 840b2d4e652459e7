"""Counting what data-parallel training communicates, and comparing the workers' weights
(lesson 03).

``CollectiveCounter`` wraps torch.distributed's collectives while it is active and logs,
for each call, the bytes this process *sends*: the tensor the collective's signature
names as its input (never the output buffer of a gather), and for a broadcast only on
the process that is its source. It sees calls made through the ``torch.distributed``
namespace: DDP's gradient all-reduce once ``count_ddp`` routes it through a Python hook,
DDP's broadcast of the model's buffers before each forward (``_broadcast_coalesced``,
while ``forward_sync_buffers`` is on: its default; torch 2.13's name for the deprecated
``broadcast_buffers``), Accelerate's ``LocalSGD``, ``reduce`` and ``gather``. Calls
that PyTorch makes internally, between its own functions, are not seen.
"""
import contextlib
import inspect
import time

import torch
import torch.distributed as dist

from helpers.models import flat_parameters

# collective -> the argument that holds what this process sends (None: nothing but a
# signal)
SENT_ARGUMENT = {
    "all_reduce": "tensor",
    "broadcast": "tensor",  # sent only by its source; the others receive into it
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    # torch 2.13's new name of all_gather_into_tensor
    "all_gather_single": "input_tensor",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",
    "barrier": None,
    # DDP's buffers, from process ``src``; a C++ function, read by position
    "_broadcast_coalesced": "tensors",
}


def sent_bytes(name, function, args, kwargs):
    """Bytes that one call ``function(*args, **kwargs)`` of the collective ``name``
    sends from this process."""
    argument = SENT_ARGUMENT[name]
    if argument is None:
        return 0
    # (process_group, tensors, buffer_size, src=0): no Python signature
    if name == "_broadcast_coalesced":
        tensors, src = args[1], (args[3] if len(args) > 3 else kwargs.get("src", 0))
        group_rank = dist.get_rank(args[0])
        return (sum(t.numel() * t.element_size() for t in tensors) if group_rank == src
                else 0)
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    tensor = bound.arguments[argument]
    if name == "broadcast" and dist.get_rank() != broadcast_source(bound.arguments):
        return 0
    return tensor.numel() * tensor.element_size()


def broadcast_source(arguments):
    """The global rank that a broadcast's arguments name as its source (``src`` or
    ``group_src``)."""
    if arguments.get("src") is not None:
        return arguments["src"]
    return dist.get_global_rank(
        arguments.get("group") or dist.group.WORLD, arguments["group_src"]
    )


class CollectiveCounter:
    """Logs every collective that this process issues while the counter is active, with
    the bytes it sent.

    ``events`` holds one dict per call: ``step`` (set ``counter.step`` to label calls,
    e.g. with the optimizer step in progress), ``seconds`` since the counter was made,
    ``collective`` and ``bytes``. ``paused()`` hides the lesson's own measurements, such
    as gathering weights to compare them.
    """

    def __init__(self):
        self.events = []
        self.step = 0
        self._originals = {}
        self._paused = False
        self._start = time.perf_counter()

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            if not self._paused:
                self.events.append(
                    {"step": self.step, "seconds": time.perf_counter() - self._start,
                     "collective": name,
                     "bytes": sent_bytes(name, original, args, kwargs)}
                )
            return original(*args, **kwargs)
        return counted

    def __enter__(self):
        for name in SENT_ARGUMENT:
            if hasattr(dist, name):
                self._originals[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self._originals[name]))
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}

    @contextlib.contextmanager
    def paused(self):
        """Collectives issued inside this block are not logged."""
        self._paused, was = True, self._paused
        try:
            yield
        finally:
            self._paused = was

    def totals(self):
        """Number of collectives and bytes sent by this process, over every logged
        call."""
        return {"collectives": len(self.events),
                "bytes": sum(event["bytes"] for event in self.events)}


def count_ddp(model):
    """Route DDP's gradient all-reduce through PyTorch's Python default hook, so it can
    be counted."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(state=None, hook=allreduce_hook)


def weight_gap(accelerator, model, counter):
    """Largest absolute difference between the workers' weights (the gather is not
    counted as training traffic)."""
    with counter.paused():
        # (processes, parameters)
        gathered = accelerator.gather(flat_parameters(model).unsqueeze(0))
    return (gathered.max(dim=0).values - gathered.min(dim=0).values).max().item()
