"""Practice 4 (AdamW): right answers pass; near misses and typical mistakes get the intended message."""
import math

import pytest
import torch

from helpers.practice.verdicts import CORRECT, WRONG
from helpers.practice import adamw as l4

from practice_support import assert_verdict, draws_after_seeding


@pytest.fixture(scope="module")
def tiny():
    from helpers.models import build_model

    model = build_model("tiny")
    return model, sum(p.numel() for p in model.parameters())


def test_4_1_accepts_the_estimate(tiny):
    model, n = tiny
    assert_verdict(l4.check_adamw_estimate.verdict(model, 8 * n), CORRECT, "ratio")
    assert_verdict(l4.check_adamw_estimate.verdict(model, float(n * 2 * 4)), CORRECT)


@pytest.mark.parametrize("bytes_per_parameter, fragment", [
    (4, "one state per parameter"), (16, "weights + gradients + state"), (12, "adds the gradient"),
    (8 / 2**20, "MiB"),
])
def test_4_1_rejects_typical_estimates(tiny, bytes_per_parameter, fragment):
    model, n = tiny
    assert_verdict(l4.check_adamw_estimate.verdict(model, n * bytes_per_parameter), WRONG, fragment)


def adamw_step_torch_style(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denominator = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    param.addcdiv_(exp_avg, denominator, value=-step_size)


@pytest.mark.parametrize("step_fn", [l4.variant_step(), adamw_step_torch_style])
def test_4_2_accepts_adamw_written_two_ways(step_fn):
    assert_verdict(l4.check_adamw_step.verdict(step_fn), CORRECT, "match torch.optim.AdamW")


def rebinds_exp_avg(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay):
    exp_avg = betas[0] * exp_avg + (1 - betas[0]) * grad  # a new tensor: the caller's exp_avg stays 0


@pytest.mark.parametrize("mistake, fragment", [
    ("no_bias_correction", "bias correction"), ("coupled_decay", "L2 penalty"),
    ("no_decay", "weight decay is missing"), ("eps_inside", "belongs outside"),
])
def test_4_2_names_the_typical_mistakes(mistake, fragment):
    assert_verdict(l4.check_adamw_step.verdict(l4.variant_step(**{mistake: True})), WRONG, fragment)


def test_4_2_catches_rebinding_instead_of_updating_in_place():
    assert_verdict(l4.check_adamw_step.verdict(rebinds_exp_avg), WRONG, "in place")


def weigh_with_loops(optimizer):
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.nbytes
    return total


@pytest.mark.parametrize("size_fn", [
    weigh_with_loops,
    lambda o: sum(v.numel() * v.element_size() for s in o.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
])
def test_4_3_accepts_state_weighers(size_fn):
    assert_verdict(l4.check_optimizer_state_size.verdict(size_fn), CORRECT, "Adafactor")


@pytest.mark.parametrize("size_fn, fragment", [
    (lambda o: sum(v.numel() for s in o.state.values() for v in s.values() if torch.is_tensor(v)), "number of elements"),
    (lambda o: sum(v.numel() * v.element_size() for s in o.state.values() for v in s.values()), "not tensors"),
    (lambda o: sum(v.numel() * 4 for s in o.state.values() for v in s.values() if torch.is_tensor(v)), "element_size()"),
    (lambda o: sum(p.numel() * p.element_size() for g in o.param_groups for p in g["params"]), "parameters themselves"),
    (lambda o: sum(v.numel() for s in o.state.values() for v in s), "state.values()"),
])
def test_4_3_rejects_typical_weighers(size_fn, fragment):
    assert_verdict(l4.check_optimizer_state_size.verdict(size_fn), WRONG, fragment)


def parameters_by_parts(config):
    return sum(part(config) for part in l4.DISTILBERT_PARTS.values())


def parameters_spelled_out(config):
    d, h, layers = config.dim, config.hidden_dim, config.n_layers
    per_layer = 4 * (d * d + d) + (d * h + h) + (h * d + d) + 4 * d
    return (config.vocab_size + config.max_position_embeddings) * d + 2 * d + layers * per_layer + \
        d * d + d + d * config.num_labels + config.num_labels


@pytest.mark.parametrize("count_fn", [parameters_by_parts, parameters_spelled_out])
def test_4_4_accepts_formulas_that_match_the_built_models(count_fn):
    verdict = l4.check_parameters_from_config.verdict(count_fn)
    assert_verdict(verdict, CORRECT, "65,783,042", "501.9 MiB")


@pytest.mark.parametrize("count_fn, fragment", [
    (lambda c: parameters_by_parts(c) - c.max_position_embeddings * c.dim, "position embeddings: missing"),
    (lambda c: parameters_by_parts(c) - c.dim * c.dim - c.dim, "pre_classifier: missing"),
    (lambda c: parameters_by_parts(c) - c.n_layers * 4 * c.dim, "attention biases: missing"),
    (lambda c: parameters_by_parts(c) - l4.DISTILBERT_PARTS["the classifier"](c), "classifier: missing"),
    (lambda c: c.intermediate_size * c.n_layers, "names its sizes"),  # BERT's name, not DistilBERT's
])
def test_4_4_rejects_typical_formulas(count_fn, fragment):
    assert_verdict(l4.check_parameters_from_config.verdict(count_fn), WRONG, fragment)


def test_4_4_hard_coded_two_labels_fails_on_the_three_label_configuration():
    def two_labels_always(config):
        return parameters_by_parts(config) - config.dim * config.num_labels - config.num_labels + config.dim * 2 + 2

    assert_verdict(l4.check_parameters_from_config.verdict(two_labels_always), WRONG, "3 labels")


def test_a_check_that_builds_or_trains_leaves_the_learners_random_numbers_alone():
    check = lambda: l4.check_optimizer_state_size.verdict(weigh_with_loops)  # "4.3 (builds a model, steps optimizers)"
    assert draws_after_seeding(check) == draws_after_seeding()
