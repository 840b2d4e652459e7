"""median_seconds of lesson 01, on a clock the test controls."""
from types import SimpleNamespace

import pytest

from helpers import timing


def test_warmup_runs_are_not_timed_and_the_median_is_taken(monkeypatch):
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    durations = iter([100.0, 9.0, 1.0, 2.0])  # the first is the warmup run: slow, as first runs are

    def step():
        clock.now += next(durations)

    assert timing.median_seconds(step, repeats=3, warmup=1) == 2.0
    assert next(durations, None) is None, "it ran the step another number of times than warmup + repeats"


@pytest.mark.parametrize("arguments, message", [
    (dict(repeats=0), "repeats must be an integer >= 1 .*, got 0"),
    (dict(repeats=2.5), "repeats must be an integer >= 1 .*, got 2.5"),
    (dict(warmup=-1), "warmup must be an integer >= 0 .*, got -1"),
])
def test_bad_counts_say_what_is_valid(arguments, message):
    with pytest.raises(ValueError, match=message):
        timing.median_seconds(lambda: None, **arguments)


def test_a_step_that_is_not_a_function_is_named():
    with pytest.raises(TypeError, match="step_fn must be a function to call"):
        timing.median_seconds(42)
