"""Lesson 02's finding: with gradient accumulation, what Trainer logs for DistilBERT.

One optimizer step over exactly 32 examples (4 micro-batches of 8, learning rate 0)
has a true mean loss that does not depend on the order of the examples. Trainer runs
through helpers.trainer_losses.first_logged_losses, the function lesson 02 and its
practice check use; the true mean loss is computed here directly, in one forward
pass, as an independent reference.
"""
import math

import pytest
import torch
from transformers import DataCollatorWithPadding

from helpers.data import load_tokenized
from helpers.models import build_model
from helpers.trainer_losses import first_logged_losses

ACCUMULATION, MICRO_BATCH = 4, 8


@pytest.fixture(scope="module")
def data():
    tokenized, tokenizer = load_tokenized()
    return tokenized["train"].select(range(ACCUMULATION * MICRO_BATCH)), tokenizer


def first_logged_loss(model, data):
    examples, tokenizer = data
    losses = first_logged_losses(model, examples, tokenizer, steps=1,
                                 micro_batch_size=MICRO_BATCH,
                                 accumulation=ACCUMULATION, learning_rate=0.0,
                                 use_cpu=True, seed=0)
    return losses[0]


def true_mean_loss(model, data):
    examples, tokenizer = data
    batch = DataCollatorWithPadding(tokenizer)(
        [examples[i] for i in range(len(examples))]
    )
    with torch.no_grad():
        return model(**batch).loss.item()


def test_the_lessons_fix_logs_the_mean_loss_per_example(data):
    model = build_model("tiny", seed=0)
    model.accepts_loss_kwargs = False  # the fix lesson 02 teaches
    expected = true_mean_loss(model, data)
    assert first_logged_loss(model, data) == pytest.approx(expected, rel=1e-4)
    assert expected < math.log(2) * 1.2  # an untrained 2-class model: about ln 2


def test_without_the_fix_trainer_logs_the_sum_over_micro_batches(data):
    # If this starts failing, Transformers changed how it scales the loss: update lesson
    # 02's explanation.
    model = build_model("tiny", seed=0)
    expected = true_mean_loss(model, data)
    assert first_logged_loss(model, data) == pytest.approx(
        ACCUMULATION * expected, rel=1e-4
    )


def test_one_logged_loss_per_optimizer_step(data):
    examples, tokenizer = data
    model = build_model("tiny", seed=0)
    losses = first_logged_losses(model, examples.select(range(2 * MICRO_BATCH)),
                                 tokenizer, steps=3, micro_batch_size=MICRO_BATCH,
                                 accumulation=1, learning_rate=0.0, use_cpu=True)
    # 2 micro-batches per epoch: the third step starts a second epoch
    assert len(losses) == 3
