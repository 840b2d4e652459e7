"""Wall-clock timing that is fair on CPU and GPU (introduced in lesson 01)."""
import statistics
import time

import torch


def median_seconds(step_fn, repeats=5, warmup=1):
    """Median wall time of ``step_fn()`` over ``repeats`` runs, after ``warmup`` untimed runs."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats!r}")
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # GPU work is asynchronous: wait before reading the clock
        start = time.perf_counter()
        step_fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
