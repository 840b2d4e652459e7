"""Under `make test`, the lessons' timings and the launches of several processes take
turns (introduced for lesson 01's timings; used by the root conftest.py, ``launcher``).

`make test` runs two workers on two cores, one thread each (the root conftest.py): each
has a core, and a time ratio measured in one is what the lesson says, whatever the other
worker computes on its own core, another timing included. A launch in the other worker
starts two busy processes: three on two cores. Timed beside two busy processes on the
2-core Xeon, lesson 1's checkpointing time ratio moved far more than beside one, and in
CI it once left its range. A learner's machine runs one notebook; ``make bench`` runs
each alone. (``tests/test_timing_lock.py`` shows the turns.)

So the lock has two kinds of holder: ``TIMING`` (the root conftest.py holds it for each
notebook cell that times steps) and ``LAUNCH`` (``launcher.run_in_processes``). Holders
of one kind run side by side (two timings, one a core; two launches); a holder of one
kind waits while any of the other kind holds it. The processes a holder starts inherit
``HELD_ENV`` and take no lock of their own (a launched worker that times a step would
otherwise wait for its own launch). No one waits longer than ``WAIT_S``. Without
``LOCK_ENV``, as on a learner's machine, nothing waits.

How: each kind has a file beside the one ``LOCK_ENV`` names. A holder keeps a shared
lock on its own kind's file, taken before it checks, without waiting, that no one holds
the other kind's file. Two of different kinds that ask at once both see the other, let
go and ask again after a random pause, so one of them gets it.
"""
import contextlib
import os
import random
import time

try:
    import fcntl
except ImportError:  # Windows: no flock; the tests run on Linux and macOS
    fcntl = None

LOCK_ENV = "COURSE_TIMING_LOCK"
HELD_ENV = "COURSE_TIMING_LOCK_HELD"
TIMING, LAUNCH = "timing", "launch"
# far above any timing cell or launch of the course; past it the block runs anyway (a
# cell that timed steps and launched processes would otherwise wait for itself)
WAIT_S = 120


@contextlib.contextmanager
def held(kind):
    """Hold the test run's timing lock as a ``TIMING`` or a ``LAUNCH`` while the block
    runs: beside other holders of the same kind, never beside one of the other kind.
    Nothing happens outside `make test`, or where this process or its parent holds it
    already."""
    if kind not in (TIMING, LAUNCH):
        raise ValueError(f"kind must be {TIMING!r} or {LAUNCH!r}, got {kind!r}")
    path = os.environ.get(LOCK_ENV)
    if not path or fcntl is None or os.environ.get(HELD_ENV):
        yield
        return
    other = LAUNCH if kind == TIMING else TIMING
    deadline = time.monotonic() + WAIT_S
    with open(f"{path}.{kind}", "a") as mine, open(f"{path}.{other}", "a") as theirs:
        while not _took(mine, theirs):
            if time.monotonic() > deadline:  # better a noisy timing than a hang
                yield
                return
            time.sleep(random.uniform(0.02, 0.08))  # not in step with the other asker
        os.environ[HELD_ENV] = "1"
        try:
            yield
        finally:
            os.environ.pop(HELD_ENV, None)
            fcntl.flock(mine, fcntl.LOCK_UN)


def _took(mine, theirs):
    """Whether this holder's kind now holds the lock: a shared lock on ``mine`` (kept),
    and no holder of the other kind on ``theirs`` (checked with an exclusive lock,
    let go at once)."""
    try:
        fcntl.flock(mine, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # the other kind is checking for holders of this one
        return False
    try:
        fcntl.flock(theirs, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # the other kind holds it
        fcntl.flock(mine, fcntl.LOCK_UN)
        return False
    fcntl.flock(theirs, fcntl.LOCK_UN)
    return True
