"""helpers/metrics.py: accuracy and F1 (lesson 02), checked on cases worked out by
hand."""
import numpy as np
import pytest

from helpers.metrics import accuracy_and_f1, compute_metrics


def test_accuracy_and_f1_of_the_paraphrase_class():
    # true positives 2 (indices 0, 1), a false positive (2), a false negative (3), a
    # true negative (4)
    labels = [1, 1, 0, 1, 0]
    predictions = [1, 1, 1, 0, 0]
    metrics = accuracy_and_f1(labels, predictions)
    assert metrics["accuracy"] == pytest.approx(3 / 5)
    # precision 2/3, recall 2/3
    assert metrics["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))


def test_f1_counts_the_paraphrase_class_only():
    # every negative right, every positive wrong: accuracy 0.5, F1 of class 1 is 0
    assert accuracy_and_f1([0, 0, 1, 1], [0, 0, 0, 0]) == {"accuracy": 0.5, "f1": 0.0}
    # no positive anywhere, nothing wrong: F1 is 0 (scikit-learn's zero_division
    # default), not a division error
    assert accuracy_and_f1([0, 0], [0, 0]) == {"accuracy": 1.0, "f1": 0.0}
    assert accuracy_and_f1([1, 0], [1, 0]) == {"accuracy": 1.0, "f1": 1.0}


def test_compute_metrics_takes_the_argmax_of_the_logits():
    class EvalPrediction:  # what Trainer passes: predictions (logits) and label_ids
        predictions = np.array([[0.1, 2.0], [3.0, -1.0], [0.0, 0.5]])
        label_ids = np.array([1, 0, 0])

    assert compute_metrics(EvalPrediction()) == accuracy_and_f1([1, 0, 0], [1, 0, 1])


def test_logits_instead_of_classes_get_a_clear_error():
    with pytest.raises(ValueError, match="argmax"):
        accuracy_and_f1([1, 0], np.array([[0.1, 2.0], [3.0, -1.0]]))


def test_anything_but_two_classes_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"0 or 1 \(two classes\), got \[0, 1, 2\]"):
        accuracy_and_f1([1, 0, 2], [1, 2, 0])
    with pytest.raises(ValueError, match="one class per example"):
        accuracy_and_f1([], [])
