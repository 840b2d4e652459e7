"""How well the paraphrase classifier does: accuracy and F1, for Trainer and for a
hand-written loop (introduced in lesson 02, used again in lessons 03 to 05)."""
import numpy as np
import torch


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
