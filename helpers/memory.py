"""A memory meter for forward + backward, measured from the tensors that really exist.

Introduced in lesson 01 (gradient checkpointing), used again in lesson 02.
It watches every tensor that PyTorch's dispatcher creates while a function runs forward
and backward, and frees it from the count when the tensor is really gone. So it
measures, on the CPU as on a GPU, what autograd, checkpointing or selective
checkpointing keep alive, instead of computing it from shapes.
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
    (a view shares its base's id, so does a block that resize_ grows; memory reused
    after a free gets a new id).
    """
    # created in forward and still alive after it (output excluded): kept for backward
    saved_bytes: int
    # most bytes alive at once among tensors created in forward + backward: the step's
    # peak
    peak_bytes: int
    # the same peak, leaving out what outlives the step (the gradients)
    peak_activation_bytes: int
    # The CUDA caching allocator's own peak during the run, above what was allocated
    # before it (torch.cuda.max_memory_allocated minus memory_allocated at the start);
    # None without a GPU. It can differ from peak_bytes: the allocator rounds sizes up,
    # and it also holds memory that kernels allocate for themselves (workspaces), which
    # the meter never sees as a tensor.
    cuda_peak_bytes: int | None
    # allocation ids that the meter's saved_tensors_hooks packed: never a tensor saved
    # inside a checkpoint, which installs hooks of its own there (only the innermost
    # pair applies, torch/autograd/graph.py)
    saved_by_autograd: set
    alive_after_forward: set  # allocation ids created in forward and alive after it
    # (op name, allocation id, bytes) for each new allocation, in order
    created_in_forward: list
    # (allocation id, change in bytes: + when created or grown, - when freed), in order,
    # forward then backward: their running sum is the bytes alive at each moment, its
    # maximum peak_bytes
    events: list

    def kept(self, op_name, occurrence=0):
        """Whether the output of the ``occurrence``-th forward call of ``op_name`` was
        kept for backward."""
        ids = [alloc for name, alloc, _ in self.created_in_forward if name == op_name]
        if occurrence >= len(ids):
            raise ValueError(f"the forward pass ran {op_name!r} {len(ids)} time(s); "
                             f"no occurrence {occurrence}")
        return ids[occurrence] in self.alive_after_forward


def storage_key(tensor):
    """One key per memory block, shared by a tensor and all its views, and kept when
    resize_ grows it.

    It is the address of the storage object (``_cdata``), the identity PyTorch itself
    gives a storage (``_StorageBase.__deepcopy__`` in torch/storage.py), not the address
    of the data: resize_ moves the data of a block it grows to a new address, but keeps
    the storage object.
    """
    return tensor.untyped_storage()._cdata


def _has_memory(tensor):
    """Whether ``tensor`` has one plain storage with real memory to count (not meta, not
    sparse)."""
    if tensor.device.type == "meta":
        return False
    try:
        tensor.untyped_storage()
    # sparse layouts and others hold several storages, or none
    except (RuntimeError, NotImplementedError):
        return False
    return True


class LiveTensorTracker(TorchDispatchMode):
    """Counts the bytes of tensor storages created under it that are still alive, and
    the peak.

    An op's output is new memory when its storage is neither tracked already nor one of
    the op's inputs, whatever the op's schema declares: aten._unsafe_view returns its
    input's memory with no alias in its schema. A storage can grow after its creation
    (resize_, an out= op writing into an empty tensor): the size of every tracked
    storage an op touches is read again after the op. Not counted: growth of memory made
    before the measurement, tensors without one plain storage (meta, sparse), and the
    scratch memory a kernel frees before it returns.
    """

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        # storage key -> [allocation id (None while the storage is empty), live tensors,
        # bytes]; the entry dies with the last tensor that views the storage
        self.live = {}
        # (op name, allocation id, bytes: the most the block held) of each new
        # allocation
        self.created = []
        # (allocation id, change in bytes: + when created or grown, - when freed), in
        # order
        self.events = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and _has_memory(t)]
        input_keys = {storage_key(t) for t in inputs}
        out = func(*args, **kwargs)
        outputs = [t for t in tree_leaves(out)
                   if isinstance(t, torch.Tensor) and _has_memory(t)]
        # torch.tensor(data) fills a fresh tensor with every mode off, then hands it to
        # lift_fresh, which returns it (torch/fx/experimental/proxy_tensor.py, at "When
        # we trace through a torch.tensor"): that memory is new although lift_fresh's
        # schema says its output aliases its input.
        fresh = func is torch.ops.aten.lift_fresh.default
        declared_alias = any(r.alias_info is not None for r in func._schema.returns)
        name = func.overloadpacket.__name__
        for tensor in outputs:
            key = storage_key(tensor)
            if key not in self.live:
                if not fresh and (declared_alias or key in input_keys):
                    # memory made before the measurement, returned again (a view, in
                    # place, _unsafe_view)
                    continue
                self.live[key] = [None, 0, 0]
            self.live[key][1] += 1
            weakref.finalize(tensor, self._release, key)
        # resize_ and out= ops grow storages that exist already
        for tensor in inputs + outputs:
            key = storage_key(tensor)
            if key in self.live:
                self._set_size(key, tensor.untyped_storage().nbytes(), name)
        return out

    def _set_size(self, key, nbytes, op_name):
        """Record that the storage ``key`` now holds ``nbytes`` (``op_name`` gave it its
        size)."""
        entry = self.live[key]
        change = nbytes - entry[2]
        if change == 0:
            return
        if entry[0] is None:  # its first bytes: from now on, an allocation of its own
            entry[0] = len(self.created)
            self.created.append((op_name, entry[0], nbytes))
        else:
            first_op, alloc, most = self.created[entry[0]]
            self.created[alloc] = (first_op, alloc, max(most, nbytes))
        entry[2] = nbytes
        self.live_bytes += change
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.events.append((entry[0], change))

    def _release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            alloc, _, nbytes = self.live.pop(key)
            if nbytes:
                self.live_bytes -= nbytes
                self.events.append((alloc, -nbytes))

    def allocation_id(self, tensor):
        """The allocation id of a live tensor created under this tracker, else None."""
        entry = self.live.get(storage_key(tensor)) if _has_memory(tensor) else None
        return entry[0] if entry else None

    def _entries(self):
        # a copy: a tensor freed by the garbage collector meanwhile would change the
        # dict under the loop
        return [entry for entry in list(self.live.values()) if entry[0] is not None]

    def alive_ids(self):
        return {alloc for alloc, _, _ in self._entries()}

    def alive_bytes(self, ids):
        """The bytes the live allocations in ``ids`` hold now."""
        return sum(nbytes for alloc, _, nbytes in self._entries() if alloc in ids)

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
    call (inputs, parameters) are not counted; everything created during it is, with the
    limits that ``LiveTensorTracker`` lists. ``backward=False`` measures the forward
    pass only.
    """
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_before = torch.cuda.memory_allocated()
    tracker = LiveTensorTracker()
    packed = set()

    def pack(tensor):
        packed.add(tracker.allocation_id(tensor))
        # A detached alias, not the tensor: an op that saves its own output (exp, tanh)
        # would hold it, and so itself through its grad_fn, in a reference cycle that is
        # never freed, as the warning in saved_tensors_hooks' docstring
        # (torch/autograd/graph.py) says. detach() runs under the tracker, so the alias
        # keeps the memory in the count for as long as the graph holds it.
        return tensor.detach()

    with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = forward_fn()
    if not isinstance(output, torch.Tensor) or not output.requires_grad:
        raise ValueError(
            "measure_memory: forward_fn must return a tensor that requires grad, so "
            "that there is a "
            "backward pass to measure; give its inputs or parameters "
            "requires_grad=True, and do not "
            "run it under torch.no_grad()")
    alive = tracker.alive_ids() - {tracker.allocation_id(output)}
    created_in_forward = list(tracker.created)
    saved_bytes = tracker.alive_bytes(alive)
    if backward:
        with tracker:
            output.backward(torch.ones_like(output))
    del output
    # What is still alive now outlives the step: the gradients (and anything the caller
    # keeps).
    peak_activation_bytes = tracker.peak_bytes_excluding(tracker.alive_ids())
    cuda_peak = None
    if on_cuda:
        torch.cuda.synchronize()
        cuda_peak = torch.cuda.max_memory_allocated() - cuda_before
    return MemoryReport(saved_bytes=saved_bytes, peak_bytes=tracker.peak_bytes,
                        peak_activation_bytes=peak_activation_bytes,
                        cuda_peak_bytes=cuda_peak, saved_by_autograd=packed & alive,
                        alive_after_forward=alive,
                        created_in_forward=created_in_forward,
                        events=list(tracker.events))


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
    """(forward op counts, backward op counts) for ``forward_fn()`` and backward on its
    output."""
    with OpCounter() as forward_counter:
        output = forward_fn()
    with OpCounter() as backward_counter:
        output.backward(torch.ones_like(output))
    return forward_counter.counts, backward_counter.counts
