"""What the practice tests share: asserting a verdict, and a learner's random numbers
after a check."""
import random

import numpy as np
import torch

from helpers.practice.verdicts import CORRECT, Verdict


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
