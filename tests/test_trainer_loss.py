"""Lesson 02's finding: with gradient accumulation, what Trainer logs for DistilBERT.

One optimizer step over exactly 32 examples (4 micro-batches of 8, learning rate 0)
has a true mean loss that does not depend on the order of the examples.
"""
import math

import pytest
import torch
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

from helpers.data import load_tokenized
from helpers.models import build_model

ACCUMULATION, MICRO_BATCH = 4, 8


@pytest.fixture(scope="module")
def data():
    tokenized, tokenizer = load_tokenized()
    return tokenized["train"].select(range(ACCUMULATION * MICRO_BATCH)), tokenizer


def first_logged_loss(model, data, tmp_path):
    examples, tokenizer = data
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, logging_steps=1, learning_rate=0.0,
                             gradient_accumulation_steps=ACCUMULATION, per_device_train_batch_size=MICRO_BATCH,
                             report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=examples,
                      data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    return next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)


def true_mean_loss(model, data):
    examples, tokenizer = data
    batch = DataCollatorWithPadding(tokenizer)([examples[i] for i in range(len(examples))])
    with torch.no_grad():
        return model(**batch).loss.item()


def test_the_lessons_fix_logs_the_mean_loss_per_example(data, tmp_path):
    model = build_model("tiny", seed=0)
    model.accepts_loss_kwargs = False  # the fix lesson 02 teaches
    expected = true_mean_loss(model, data)
    assert first_logged_loss(model, data, tmp_path) == pytest.approx(expected, rel=1e-4)
    assert expected < math.log(2) * 1.2  # an untrained 2-class model: about ln 2


def test_without_the_fix_trainer_logs_the_sum_over_micro_batches(data, tmp_path):
    # If this starts failing, Transformers changed how it scales the loss: update lesson 02's explanation.
    model = build_model("tiny", seed=0)
    expected = true_mean_loss(model, data)
    assert first_logged_loss(model, data, tmp_path) == pytest.approx(ACCUMULATION * expected, rel=1e-4)
