"""Wall-clock timing that is fair on CPU and GPU (introduced in lesson 01).

``median_seconds`` times one function; ``interleaved_seconds`` times several in turns,
one run of each per round, so that a busy machine slows them alike (lessons 01, 02 and
05 compare two or more steps that way).
"""
import statistics
import time

import torch


def _check_counts(repeats, warmup, unit):
    """A clear error unless ``repeats`` >= 1 and ``warmup`` >= 0 are integers (numbers
    of ``unit``)."""
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least} (a number of "
                             f"{unit}), got {value!r}")


def median_seconds(step_fn, repeats=5, warmup=1):
    """Median wall time of ``step_fn()`` over ``repeats`` runs, after ``warmup`` untimed
    runs."""
    _check_counts(repeats, warmup, "runs")
    if not callable(step_fn):
        raise TypeError("step_fn must be a function to call, like lambda: model(x), "
                        f"got {step_fn!r}")
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            # GPU work is asynchronous: wait before reading the clock
            torch.cuda.synchronize()
        start = time.perf_counter()
        step_fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_seconds(step_fns, repeats=5, warmup=1, threads=None):
    """The seconds of each function in ``step_fns`` (name -> function), one run of each
    per round.

    Returns {name: [seconds in round 1, round 2, ...]}. ``warmup`` untimed rounds come
    first; ``threads`` sets PyTorch's CPU threads while it runs (None: as many as
    PyTorch uses now).
    """
    if (not isinstance(step_fns, dict) or not step_fns
        or not all(callable(f) for f in step_fns.values())):
        raise TypeError("step_fns must be a dict of name -> function to call, like "
                        "{'off': lambda: step(False), 'on': lambda: step(True)}, "
                        f"got {step_fns!r}")
    _check_counts(repeats, warmup, "rounds")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads or threads_before)
    try:
        for _ in range(warmup):
            for step_fn in step_fns.values():
                step_fn()
        seconds = {name: [] for name in step_fns}
        # one run of each per round: load hits all of them alike
        for _ in range(repeats):
            for name, step_fn in step_fns.items():
                seconds[name].append(median_seconds(step_fn, repeats=1, warmup=0))
    finally:
        torch.set_num_threads(threads_before)
    return seconds


def interleaved_median_seconds(step_fns, repeats=5, warmup=1, threads=None):
    """The median of each function's seconds, timed in turns
    (``interleaved_seconds``)."""
    rounds = interleaved_seconds(
        step_fns, repeats=repeats, warmup=warmup, threads=threads
    )
    return {name: statistics.median(times) for name, times in rounds.items()}
