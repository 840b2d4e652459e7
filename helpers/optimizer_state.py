"""What an optimizer keeps between steps, weighed (introduced in lesson 04, used again
by its practice checks)."""
import torch


def stored_tensors(tensor):
    """The plain tensors that hold ``tensor``'s bytes: itself, or the inner tensors of a
    tensor subclass.

    Quantized states in some libraries are tensor subclasses whose element size
    describes the logical values, not the bytes stored; their inner tensors hold the
    real bytes.
    """
    # a subclass: unpack it
    if hasattr(tensor, "__tensor_flatten__") and type(tensor) is not torch.Tensor:
        inner_names, _ = tensor.__tensor_flatten__()
        return [inner for name in inner_names
                for inner in stored_tensors(getattr(tensor, name))]
    return [tensor]


def memory_key(tensor):
    """One key per block of memory, its device and address: a tensor and its views share
    one."""
    return tensor.device, tensor.untyped_storage().data_ptr()


def optimizer_state_size(optimizer):
    """(elements, bytes) of the tensors in ``optimizer.state``, each memory block once.

    Entries that are not tensors (a step counter kept as a Python int) are skipped.
    A tensor that several parameters' states share (bitsandbytes' lookup tables) is
    counted once, at its first entry; bytes are those of the memory block each tensor
    lives in, without copying anything.
    """
    seen, elements, n_bytes = set(), 0, 0
    for state in optimizer.state.values():
        for value in state.values():
            if not isinstance(value, torch.Tensor):
                continue
            new = [t for t in stored_tensors(value) if memory_key(t) not in seen]
            if not new:
                continue  # the same memory as an entry already counted
            elements += value.numel()
            n_bytes += sum(t.untyped_storage().nbytes() for t in new)
            seen.update(memory_key(t) for t in new)
    return elements, n_bytes
