"""Wall-clock timing that is fair on CPU and GPU (introduced in lesson 01)."""
import statistics
import time

import torch


def median_seconds(step_fn, repeats=5, warmup=1):
    """Median wall time of ``step_fn()`` over ``repeats`` runs, after ``warmup`` untimed runs."""
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least} (a number of runs), got {value!r}")
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a function to call, like lambda: model(x), got {step_fn!r}")
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
