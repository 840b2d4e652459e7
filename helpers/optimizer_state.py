"""What an optimizer keeps between steps, weighed (introduced in lesson 04, used again by its practice checks)."""
import torch


def tensor_bytes(tensor):
    """Bytes ``tensor`` stores. A tensor subclass is unpacked into the tensors it holds.

    Quantized states in some libraries are tensor subclasses whose element size describes the logical
    values, not the bytes stored; their inner tensors hold the real bytes.
    """
    if hasattr(tensor, "__tensor_flatten__") and type(tensor) is not torch.Tensor:  # a subclass: unpack it
        inner_names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in inner_names)
    return tensor.numel() * tensor.element_size()


def optimizer_state_size(optimizer):
    """(elements, bytes) of every tensor in ``optimizer.state``; entries that are not tensors are skipped."""
    tensors = [value for state in optimizer.state.values() for value in state.values()
               if isinstance(value, torch.Tensor)]
    return sum(t.numel() for t in tensors), sum(tensor_bytes(t) for t in tensors)
