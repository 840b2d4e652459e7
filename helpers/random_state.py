"""The global random generators put back after a block, so that a helper or a check
leaves the learner's random numbers alone (introduced in lesson 02, by
``first_logged_losses``; the practice checks use it too)."""
import contextlib
import random

import numpy as np
import torch


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
