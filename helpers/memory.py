"""A memory meter for forward + backward, measured from the tensors that really exist.

Introduced in lesson 01 (gradient checkpointing), used again in lesson 02.
It watches every tensor that PyTorch's dispatcher creates while a function runs forward
and backward, and frees it from the count when the tensor is really gone. So it measures,
on the CPU as on a GPU, what autograd, checkpointing or selective checkpointing keep alive,
instead of computing it from shapes.
"""
import dataclasses
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclasses.dataclass
class MemoryReport:
    """What one forward + backward held, in bytes.

    Tensors are identified by allocation ids: one per block of memory the run created
    (a view shares its base's id; an address reused after a free gets a new id).
    """
    saved_bytes: int  # created in forward and still alive after it (output excluded): kept for backward
    peak_bytes: int  # most bytes alive at once among tensors created in forward + backward
    peak_activation_bytes: int  # the same peak, leaving out what outlives the step (the gradients)
    cuda_peak_bytes: int | None  # torch.cuda.max_memory_allocated during the run (None on the CPU)
    saved_by_autograd: set  # allocation ids that autograd's saved_tensors_hooks packed
    alive_after_forward: set  # allocation ids created in forward and alive after it
    created_in_forward: list  # (op name, allocation id, bytes) for each new allocation, in order

    def kept(self, op_name, occurrence=0):
        """Whether the output of the ``occurrence``-th forward call of ``op_name`` was kept for backward."""
        ids = [alloc for name, alloc, _ in self.created_in_forward if name == op_name]
        if occurrence >= len(ids):
            raise ValueError(f"the forward pass ran {op_name!r} {len(ids)} time(s); no occurrence {occurrence}")
        return ids[occurrence] in self.alive_after_forward


def storage_key(tensor):
    """One key per memory block, shared by a tensor and all its views."""
    return (tensor.device.type, tensor.untyped_storage().data_ptr())


class LiveTensorTracker(TorchDispatchMode):
    """Counts the bytes of tensor storages created under it that are still alive, and the peak."""

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.live = {}  # storage key -> [allocation id, live tensors, bytes]; dies with its last view
        self.created = []  # (op name, allocation id, bytes) of each new allocation
        self.events = []  # (allocation id, +bytes when created or -bytes when freed), in order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # A view or an in-place op returns memory that already existed: never new bytes.
        aliases_an_input = any(r.alias_info is not None for r in func._schema.returns)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor, func, aliases_an_input)
        return out

    def _track(self, tensor, func, aliases_an_input):
        key = storage_key(tensor)
        if key[1] == 0 or (aliases_an_input and key not in self.live):
            return  # an empty tensor, or a view of memory made before the measurement
        if key not in self.live:
            alloc, nbytes = len(self.created), tensor.untyped_storage().nbytes()
            self.live[key] = [alloc, 0, nbytes]
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self.created.append((func.overloadpacket.__name__, alloc, nbytes))
            self.events.append((alloc, nbytes))
        self.live[key][1] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            alloc, _, nbytes = self.live.pop(key)
            self.live_bytes -= nbytes
            self.events.append((alloc, -nbytes))

    def allocation_id(self, tensor):
        """The allocation id of a live tensor created under this tracker, else None."""
        entry = self.live.get(storage_key(tensor))
        return entry[0] if entry else None

    def alive_ids(self):
        return {alloc for alloc, _, _ in self.live.values()}

    def peak_bytes_excluding(self, ids):
        """The peak of live bytes, replayed without the allocations in ``ids``."""
        live = peak = 0
        for alloc, delta in self.events:
            if alloc not in ids:
                live += delta
                peak = max(peak, live)
        return peak


def measure_memory(forward_fn, backward=True):
    """Run ``forward_fn()`` then backward on its output, and report the bytes they held.

    ``forward_fn`` takes no argument and returns a tensor that needs a gradient (a loss,
    or any output: backward then uses a gradient of ones). Tensors that exist before the
    call (inputs, parameters) are not counted; everything created during it is.
    """
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tracker = LiveTensorTracker()
    packed = set()

    def pack(tensor):
        packed.add(tracker.allocation_id(tensor))
        return tensor

    with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = forward_fn()
    if not isinstance(output, torch.Tensor) or not output.requires_grad:
        raise ValueError(
            "measure_memory: forward_fn must return a tensor that requires grad, so that there is a "
            "backward pass to measure; give its inputs or parameters requires_grad=True, and do not "
            "run it under torch.no_grad()")
    alive = tracker.alive_ids() - {tracker.allocation_id(output)}
    created_in_forward = list(tracker.created)
    saved_bytes = sum(nbytes for _, alloc, nbytes in tracker.created if alloc in alive)
    if backward:
        with tracker:
            output.backward(torch.ones_like(output))
    del output
    # What is still alive now outlives the step: the gradients (and anything the caller keeps).
    peak_activation_bytes = tracker.peak_bytes_excluding(tracker.alive_ids())
    cuda_peak = None
    if on_cuda:
        torch.cuda.synchronize()
        cuda_peak = torch.cuda.max_memory_allocated()
    return MemoryReport(saved_bytes=saved_bytes, peak_bytes=tracker.peak_bytes,
                        peak_activation_bytes=peak_activation_bytes, cuda_peak_bytes=cuda_peak,
                        saved_by_autograd=packed & alive, alive_after_forward=alive,
                        created_in_forward=created_in_forward)


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations that run under it, by name (e.g. 'addmm', 'tanh')."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def count_ops(forward_fn):
    """(forward op counts, backward op counts) for ``forward_fn()`` and backward on its output."""
    with OpCounter() as forward_counter:
        output = forward_fn()
    with OpCounter() as backward_counter:
        output.backward(torch.ones_like(output))
    return forward_counter.counts, backward_counter.counts
