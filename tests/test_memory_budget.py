"""The training-memory calculator of lesson 04."""
import pytest

from helpers.memory_budget import describe_training_memory, training_memory


def test_adamw_on_distilbert_matches_the_slides_figure():
    memory = training_memory(65_783_042, state_bytes_per_parameter=8)
    assert memory["optimizer state"] == 65_783_042 * 8
    assert round(memory["optimizer state"] / 2**20) == 502  # the slide's "502 MB"
    assert memory["total"] == 65_783_042 * 16  # weights 4 + gradients 4 + state 8


def test_activations_and_half_precision_weights_add_up():
    memory = training_memory(1000, 2, weight_bytes=2, gradient_bytes=2, activation_bytes=500)
    assert memory == {"weights": 2000, "gradients": 2000, "optimizer state": 2000, "activations": 500,
                      "total": 6500}


@pytest.mark.parametrize("bad", [-1, "many", None, True])
def test_bad_input_names_the_argument(bad):
    with pytest.raises(ValueError, match="n_parameters must be a number >= 0"):
        training_memory(bad, 8)


def test_description_lists_every_part_in_mib():
    text = describe_training_memory(training_memory(2**20, 8))
    assert "optimizer state:        8.0 MiB" in text and "total:       16.0 MiB" in text
