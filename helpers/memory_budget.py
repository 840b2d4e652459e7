"""Training memory per parameter: weights, gradients, optimizer state, plus activations
(lesson 04)."""
from helpers.units import MiB


def training_memory(n_parameters, state_bytes_per_parameter, weight_bytes=4,
                    gradient_bytes=4, activation_bytes=0):
    """Bytes that training a model needs, by kind, and their total.

    ``state_bytes_per_parameter`` is the optimizer's (8 for AdamW in float32, measured
    in lesson 04 for the others). ``activation_bytes`` is the peak activation memory of
    one forward and backward pass, the ``peak_activation_bytes`` of
    ``helpers.memory.measure_memory`` (lesson 01): the most bytes alive at once,
    gradients left out, which must fit beside the rest (not ``saved_bytes``, what the
    forward pass keeps for backward).
    """
    for name, value in [("n_parameters", n_parameters),
                        ("state_bytes_per_parameter", state_bytes_per_parameter),
                        ("weight_bytes", weight_bytes),
                        ("gradient_bytes", gradient_bytes),
                        ("activation_bytes", activation_bytes)]:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    parts = {"weights": n_parameters * weight_bytes,
             "gradients": n_parameters * gradient_bytes,
             "optimizer state": round(n_parameters * state_bytes_per_parameter),
             "activations": activation_bytes}
    return {**parts, "total": sum(parts.values())}


def describe_training_memory(memory):
    """The dict from ``training_memory`` as aligned lines in MiB."""
    return "\n".join(f"{kind:>16}: {n / MiB:>10,.1f} MiB" for kind, n in memory.items())
