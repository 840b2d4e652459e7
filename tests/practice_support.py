"""What the practice tests share: asserting a verdict, judging an exercise, and a
learner's random numbers after a check."""
import itertools
import random

import numpy as np
import torch

from helpers.practice.core import CORRECT, WRONG, Verdict, agree, cached_outcome, check


def assert_verdict(verdict, status, *fragments):
    assert isinstance(verdict, Verdict)
    assert verdict.status == status, str(verdict)
    for fragment in fragments:
        assert fragment in verdict.message, f"{fragment!r} not in: {verdict.message}"
    assert "Traceback" not in verdict.message


def draws_after_seeding(run_check=None):
    """What a learner draws from the global generators after seeding them (and running a
    check)."""
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    if run_check is not None:
        assert_verdict(run_check(), CORRECT)
    return torch.rand(4).tolist(), random.random(), np.random.rand()


def assert_judged(exercise, *right_answers):
    """The intended answer and ``right_answers`` pass; each mistake gets its own hint,
    and differs from every other mistake on some configuration."""
    for answer in (exercise.intended, *right_answers):
        assert_verdict(check(exercise, answer), CORRECT)
    for hint, wrong in exercise.mistakes:
        assert_verdict(check(exercise, wrong), WRONG, hint)
    for first, second in itertools.combinations(range(len(exercise.mistakes)), 2):
        assert not all(agree(exercise, cached_outcome(exercise, first, i),
                             cached_outcome(exercise, second, i))
                       for i in range(len(exercise.configs))), (first, second)
