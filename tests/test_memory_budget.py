"""The training-memory calculator of lesson 04, against the bytes of a real training
step."""
import pytest
import torch

from helpers.memory_budget import describe_training_memory, training_memory
from helpers.models import build_model
from helpers.units import MiB


def tensor_bytes(tensors):
    return sum(t.nbytes for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_parts_are_the_bytes_of_a_real_adamw_step(dtype):
    model = build_model("tiny").to(dtype)
    model(
        input_ids=torch.arange(16).reshape(2, 8), labels=torch.tensor([0, 1])
    ).loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    parameters = list(model.parameters())
    states = list(optimizer.state.values())
    # AdamW keeps exp_avg and exp_avg_sq per parameter, in the parameter's dtype: 2
    # values each
    itemsize = dtype.itemsize
    memory = training_memory(sum(p.numel() for p in parameters),
                             state_bytes_per_parameter=2 * itemsize,
                             weight_bytes=itemsize, gradient_bytes=itemsize,
                             activation_bytes=1000)
    # besides them, one `step` counter per parameter tensor: a known small extra the
    # calculator leaves out
    step_bytes = tensor_bytes(state["step"] for state in states)
    assert step_bytes == 4 * len(parameters)
    real = {
        "weights": tensor_bytes(parameters),
        "gradients": tensor_bytes(p.grad for p in parameters),
        "optimizer state": tensor_bytes(v for state in states for v in state.values())
        - step_bytes,
        "activations": 1000,
    }
    assert memory == {**real, "total": sum(real.values())}


def test_adamw_on_distilbert_matches_the_slides_figure():
    memory = training_memory(65_783_042, state_bytes_per_parameter=8)
    # the slide's "502 MB": 65,783,042 x 8 bytes
    assert round(memory["optimizer state"] / MiB) == 502


@pytest.mark.parametrize("bad", [-1, "many", None, True])
def test_bad_input_names_the_argument(bad):
    with pytest.raises(ValueError, match="n_parameters must be a number >= 0"):
        training_memory(bad, 8)


def test_description_lists_every_part_in_mib():
    text = describe_training_memory(training_memory(2**20, 8))
    assert "optimizer state:        8.0 MiB" in text and "total:       16.0 MiB" in text
