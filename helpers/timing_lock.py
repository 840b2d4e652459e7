"""Under `make test`, the lessons' timings and the launches of several processes take
turns (introduced for lesson 01's timings; used by the root conftest.py, ``launcher``).

`make test` runs two workers on two cores, one thread each (the root conftest.py): each
has a core, and a time ratio measured in one is what the lesson says. A launch in the
other worker starts two busy processes: three on two cores. Timed beside two busy
processes on the 2-core Xeon, lesson 1's checkpointing time ratio moved far more than
beside one, and in CI it once left its range. A learner's machine runs one notebook;
``make bench`` runs each alone. (``tests/test_timing_lock.py`` shows the turns.)

The root conftest.py names a lock file in ``LOCK_ENV`` and runs each notebook cell that
times steps holding it alone (``held(exclusive=True)``); launches share it
(``exclusive=False``: ``launcher.run_in_processes``), so that two launches still
overlap. The processes a holder starts inherit ``HELD_ENV`` and take no lock of their
own (a launched worker that asked for it alone would wait for its own launch). No one
waits longer than ``WAIT_S``. Without ``LOCK_ENV``, as on a learner's machine, nothing
waits.
"""
import contextlib
import os
import time

try:
    import fcntl
except ImportError:  # Windows: no flock; the tests run on Linux and macOS
    fcntl = None

LOCK_ENV = "COURSE_TIMING_LOCK"
HELD_ENV = "COURSE_TIMING_LOCK_HELD"
# far above any timing cell or launch of the course; past it the block runs anyway (a
# cell that timed steps and launched processes would otherwise wait for itself)
WAIT_S = 120


@contextlib.contextmanager
def held(exclusive):
    """Hold the test run's timing lock while the block runs: alone if ``exclusive``,
    else shared with other holders that do not ask for it alone. Nothing happens
    outside `make test`, or where this process or its parent holds it already."""
    path = os.environ.get(LOCK_ENV)
    if not path or fcntl is None or os.environ.get(HELD_ENV):
        yield
        return
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    deadline = time.monotonic() + WAIT_S
    with open(path, "a") as lock_file:
        while not _took(lock_file, mode):
            if time.monotonic() > deadline:  # better a noisy timing than a hang
                yield
                return
            time.sleep(0.05)
        os.environ[HELD_ENV] = "1"
        try:
            yield
        finally:
            os.environ.pop(HELD_ENV, None)
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _took(lock_file, mode):
    """Whether the lock was free and is now held (``mode`` has LOCK_NB)."""
    try:
        fcntl.flock(lock_file, mode)
        return True
    except BlockingIOError:
        return False
