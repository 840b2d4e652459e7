"""Evaluation shared by the training lessons (introduced in lesson 02, used again in 03 and 04)."""
import numpy as np
import torch
from sklearn.metrics import accuracy_score, f1_score


def compute_metrics(eval_prediction):
    """Trainer's ``compute_metrics``: accuracy and F1 (of the paraphrase class) with scikit-learn."""
    logits, labels = eval_prediction.predictions, eval_prediction.label_ids
    predictions = np.argmax(logits, axis=-1)
    return {"accuracy": accuracy_score(labels, predictions), "f1": f1_score(labels, predictions)}


@torch.no_grad()
def evaluate(model, dataloader, device=None):
    """Mean loss, accuracy and F1 of ``model`` over ``dataloader``, in evaluation mode."""
    was_training = model.training
    model.eval()
    losses, predictions, labels = [], [], []
    for batch in dataloader:
        batch = {key: value.to(device) for key, value in batch.items()} if device is not None else batch
        outputs = model(**batch)
        losses.append(outputs.loss.item() * len(batch["labels"]))
        predictions.append(outputs.logits.argmax(-1).cpu())
        labels.append(batch["labels"].cpu())
    model.train(was_training)
    predictions, labels = torch.cat(predictions).numpy(), torch.cat(labels).numpy()
    return {"loss": sum(losses) / len(labels), "accuracy": accuracy_score(labels, predictions),
            "f1": f1_score(labels, predictions)}
