"""The timing lock of `make test`: timings together, launches together, never a timing
beside a launch, and nothing at all outside the tests."""
import fcntl
import importlib.util
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from helpers.paths import REPO_ROOT
from helpers.timing_lock import HELD_ENV, LAUNCH, LOCK_ENV, TIMING, held

# Another process asks for the lock and prints how long it waited for it.
ASK = """
import sys, time
from helpers.timing_lock import held
start = time.perf_counter()
with held(sys.argv[1]):
    print(f"{time.perf_counter() - start:.2f}")
"""
# Another process asks for the lock, holds it 0.3 s and prints when it held it.
HOLD_A_WHILE = """
import sys, time
from helpers.timing_lock import held
with held(sys.argv[1]):
    print(f"{time.time():.3f}")
    time.sleep(0.3)
    print(f"{time.time():.3f}")
"""
HOLD_S = 1.0


@pytest.fixture
def lock_file(tmp_path, monkeypatch):
    path = tmp_path / "timing.lock"
    monkeypatch.setenv(LOCK_ENV, str(path))
    monkeypatch.delenv(HELD_ENV, raising=False)
    return path


def seconds_waited_by_another_process(kind, holding):
    """Hold the lock for HOLD_S as a ``holding`` (TIMING or LAUNCH), while another
    process (the other test worker: not one this one started) asks for it as a
    ``kind``; the seconds that process waited."""
    with held(holding):
        environment = {k: v for k, v in os.environ.items() if k != HELD_ENV}
        process = subprocess.Popen([sys.executable, "-c", ASK, kind], env=environment,
                                   stdout=subprocess.PIPE, text=True)
        time.sleep(HOLD_S)
    return float(process.communicate(timeout=60)[0])


def test_a_launch_waits_while_a_step_is_timed(lock_file):
    assert seconds_waited_by_another_process(LAUNCH, holding=TIMING) > HOLD_S / 2


def test_a_timing_waits_while_a_launch_runs(lock_file):
    assert seconds_waited_by_another_process(TIMING, holding=LAUNCH) > HOLD_S / 2


def test_two_launches_run_side_by_side(lock_file):
    assert seconds_waited_by_another_process(LAUNCH, holding=LAUNCH) < HOLD_S / 2


def test_two_timings_run_side_by_side(lock_file):
    # one thread each, a core each: neither crowds the other's core
    assert seconds_waited_by_another_process(TIMING, holding=TIMING) < HOLD_S / 2


def test_a_timing_and_a_launch_that_ask_at_once_take_turns(lock_file):
    # each asker holds its own kind while it checks for the other: never both at once
    environment = {k: v for k, v in os.environ.items() if k != HELD_ENV}
    for _ in range(2):
        askers = [subprocess.Popen([sys.executable, "-c", HOLD_A_WHILE, kind],
                                   env=environment, stdout=subprocess.PIPE, text=True)
                  for kind in (TIMING, LAUNCH)]
        (start_a, end_a), (start_b, end_b) = (
            map(float, asker.communicate(timeout=60)[0].split()) for asker in askers)
        assert end_a <= start_b or end_b <= start_a, "a timing ran beside a launch"


def test_a_launched_worker_that_times_a_step_does_not_wait_for_its_launch(lock_file):
    # the holder's processes inherit HELD_ENV: a worker that asks as a timing goes on
    with held(LAUNCH):
        assert os.environ[HELD_ENV] == "1"
        inherited = subprocess.run([sys.executable, "-c", ASK, TIMING], timeout=60,
                                   capture_output=True, text=True, check=True)
    assert float(inherited.stdout) < HOLD_S / 2
    assert HELD_ENV not in os.environ, "the mark outlived the block"


def test_outside_the_tests_nothing_is_locked(tmp_path, monkeypatch):
    monkeypatch.delenv(LOCK_ENV, raising=False)
    monkeypatch.delenv(HELD_ENV, raising=False)
    with held(TIMING):
        assert HELD_ENV not in os.environ
    assert not list(tmp_path.iterdir())


def root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest",
                                                  REPO_ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("source, holds", [
    ("seconds = interleaved_median_seconds(steps, repeats=3)", True),
    ("seconds = interleaved_seconds(steps)", True),
    ("from helpers.timing import interleaved_seconds", False),
    ("print(report.peak_bytes)", False),
])
def test_a_notebook_cell_that_times_steps_holds_the_lock(lock_file, source, holds):
    item = SimpleNamespace(cell=SimpleNamespace(source=source))  # as nbval's cells
    call = root_conftest().pytest_runtest_call(item)
    next(call)  # the cell runs now
    try:
        assert (os.environ.get(HELD_ENV) == "1") == holds
    finally:
        call.close()
    assert HELD_ENV not in os.environ


def test_a_holder_that_waits_too_long_runs_unlocked(lock_file, monkeypatch):
    monkeypatch.setattr("helpers.timing_lock.WAIT_S", 0.2)
    with open(f"{lock_file}.{TIMING}", "a") as other:  # another process's timing
        fcntl.flock(other, fcntl.LOCK_SH)
        start = time.perf_counter()
        with held(LAUNCH):
            waited = time.perf_counter() - start
            assert HELD_ENV not in os.environ  # it runs, but holds nothing
    assert 0.2 <= waited < 5
