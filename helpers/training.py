"""Training settings, a short Trainer run and evaluation, shared by the training lessons
(introduced in lesson 02, used again in 03 and 04) and their practice checks."""
import contextlib
import random
import tempfile

import numpy as np
import torch

# The tiny DistilBERT's training settings, shared by lessons 02 and 03 and their
# practice checks.
LEARNING_RATE = 3e-3  # high, as a tiny model trained from scratch likes it
WARMUP_SHARE = 0.1  # share of the optimizer steps with a rising learning rate
# Trainer's default, which the hand-written loops copy (torch's AdamW defaults to 0.01)
WEIGHT_DECAY = 0.0
# Trainer's default gradient clipping, which the hand-written loops copy
MAX_GRAD_NORM = 1.0
# Lesson 02's Trainer batches (the slide's): 64 examples per optimizer step, which
# exercise 2.1 keeps.
MICRO_BATCH_SIZE = 16  # examples in one forward + backward
# micro-batches per optimizer step (gradient_accumulation_steps)
TRAINER_ACCUMULATION = 4


def accuracy_and_f1(labels, predictions):
    """Accuracy, and F1 of the paraphrase class (label 1): 2 TP / (2 TP + FP + FN).

    F1 is 0 when no label and no prediction is 1 (scikit-learn's default).
    """
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape or labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape}: "
                         "give one class per example, the argmax of the logits")
    if not np.isin(labels, (0, 1)).all() or not np.isin(predictions, (0, 1)).all():
        raise ValueError("labels and predictions must be 0 or 1 (two classes), got "
                         f"{sorted(set(labels.tolist()) | set(predictions.tolist()))}")
    true_positives = int(np.sum((predictions == 1) & (labels == 1)))
    wrong = int(np.sum(predictions != labels))  # false positives + false negatives
    f1 = (2 * true_positives / (2 * true_positives + wrong)
          if true_positives + wrong else 0.0)
    return {"accuracy": float(np.mean(predictions == labels)), "f1": f1}


def compute_metrics(eval_prediction):
    """Trainer's ``compute_metrics``: accuracy and F1, from the logits."""
    logits, labels = eval_prediction.predictions, eval_prediction.label_ids
    return accuracy_and_f1(labels, np.argmax(logits, axis=-1))


@torch.no_grad()
def evaluate(model, dataloader, device=None):
    """Mean loss, accuracy and F1 of ``model`` over ``dataloader``, in evaluation
    mode."""
    was_training = model.training
    model.eval()
    losses, predictions, labels = [], [], []
    for batch in dataloader:
        batch = ({key: value.to(device) for key, value in batch.items()}
                 if device is not None else batch)
        outputs = model(**batch)
        losses.append(outputs.loss.item() * len(batch["labels"]))
        predictions.append(outputs.logits.argmax(-1).cpu())
        labels.append(batch["labels"].cpu())
    model.train(was_training)
    predictions, labels = torch.cat(predictions).numpy(), torch.cat(labels).numpy()
    return {"loss": sum(losses) / len(labels), **accuracy_and_f1(labels, predictions)}


def first_logged_losses(model, train_dataset, tokenizer, steps, micro_batch_size,
                        accumulation, **arguments):
    """Train ``model`` with Trainer for ``steps`` optimizer steps; the losses it logged.

    Each optimizer step accumulates ``accumulation`` micro-batches of
    ``micro_batch_size`` examples; ``arguments`` are further TrainingArguments
    (learning_rate, seed, use_cpu, ...). Trainer shows no progress bar and prints no
    logs: the caller prints what it needs.
    """
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    # save_strategy="no": nothing is written, and the folder goes when the run ends
    with tempfile.TemporaryDirectory() as output_dir, global_random_state_kept():
        # Trainer seeds the global generators; the caller's random numbers stay theirs
        args = TrainingArguments(
            output_dir=output_dir, max_steps=steps, logging_steps=1,
            per_device_train_batch_size=micro_batch_size,
            gradient_accumulation_steps=accumulation, save_strategy="no",
            report_to="none", disable_tqdm=True, **arguments)
        trainer = Trainer(model=model, args=args, train_dataset=train_dataset,
                          data_collator=DataCollatorWithPadding(tokenizer))
        # without a progress bar, Trainer would print every log
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@contextlib.contextmanager
def global_random_state_kept():
    """Put the global random generators (Python's, NumPy's, PyTorch's on CPU and GPU)
    back when the block ends."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    # named, so that fork_rng does not warn about several GPUs
    gpus = list(range(torch.cuda.device_count()))
    try:
        with torch.random.fork_rng(devices=gpus):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
