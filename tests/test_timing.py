"""median_seconds and the interleaved timing of lesson 01, on a clock the test
controls."""
from types import SimpleNamespace

import pytest

from helpers import timing


def test_warmup_runs_are_not_timed_and_the_median_is_taken(monkeypatch):
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    # the first is the warmup run: slow, as first runs are
    durations = iter([100.0, 9.0, 1.0, 2.0])

    def step():
        clock.now += next(durations)

    assert timing.median_seconds(step, repeats=3, warmup=1) == 2.0
    assert next(durations, None) is None, ("it ran the step another number of times "
                                           "than warmup + repeats")


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


def test_interleaved_timing_runs_one_of_each_per_round_after_the_warmup(monkeypatch):
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    order = []
    cost = {"a": 1.0, "b": 3.0}

    def step(name):
        order.append(name)
        # the warmup round is slow
        clock.now += cost[name] * (10 if len(order) <= 2 else 1)

    rounds = timing.interleaved_seconds(
        {"a": lambda: step("a"), "b": lambda: step("b")}, repeats=3, warmup=1
    )
    assert order == ["a", "b"] * 4
    assert rounds == {"a": [1.0] * 3, "b": [3.0] * 3}
    assert timing.interleaved_median_seconds(
        {"a": lambda: step("a")}, repeats=2, warmup=0
    ) == {"a": 1.0}


def test_interleaved_timing_puts_the_thread_count_back_and_names_bad_input():
    import torch

    before = torch.get_num_threads()
    seen = []
    timing.interleaved_seconds({"a": lambda: seen.append(torch.get_num_threads())},
                               repeats=1, warmup=0, threads=before + 1)
    assert seen == [before + 1] and torch.get_num_threads() == before

    def failing_step():
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        timing.interleaved_seconds({"a": failing_step}, threads=before + 1)
    assert torch.get_num_threads() == before
    with pytest.raises(TypeError, match="dict of name -> function"):
        timing.interleaved_seconds([lambda: None])
    with pytest.raises(TypeError, match="dict of name -> function"):
        timing.interleaved_seconds({"a": 42})
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        timing.interleaved_seconds({"a": lambda: None}, repeats=0)
