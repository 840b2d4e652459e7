"""Set up each pytest-xdist worker before any test or notebook runs, for `make test` and
`make test-other-cpu`.

It lives at the repository root, not in tests/, because pytest loads a conftest.py only
for the folders it collects from: `make test-other-cpu` collects notebooks/ alone, and
its notebook kernels must get the same settings (without them, two kernels of two
threads each on two cores spin-waited for each other, and that target took 13 minutes
instead of 3).
"""
import contextlib
import os
import re
import tempfile

import pytest

from helpers.language import LANGUAGES
from helpers.timing_lock import LOCK_ENV, TIMING, held

# The Hindi and Turkish notebooks (`make translations`) run the English notebooks' code
# byte for byte, as tests/test_translations.py proves: nbval runs the English ones only.
collect_ignore = [f"notebooks/{language}" for language in LANGUAGES]

# `make test` runs on two workers (pytest-xdist). Each worker's notebooks compute on one
# thread: two workers of two threads each on two cores would make the time ratios the
# lessons check depend on what the other worker happens to run (`make bench` runs each
# notebook alone, on every thread). (Their launches need no port of their own: each
# launch takes one free at that moment, helpers.launcher.default_port.)
# "gw0", "gw1", ... in a worker; unset otherwise
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    # A step timed in one worker waits for the launches of several processes in the
    # other to end, and they for it (helpers/timing_lock.py): both name this path.
    os.environ.setdefault(LOCK_ENV, os.path.join(tempfile.gettempdir(),
                                                 "efficient-training-timing.lock"))

# A notebook cell that times steps (helpers/timing.py) holds the lock as a timing: the
# other worker's launches wait for it to end (its own cells, timings included, run on,
# one thread on the other core).
TIMED_CELL = re.compile(
    r"\b(?:median_seconds|interleaved_seconds|interleaved_median_seconds)\(")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    source = getattr(getattr(item, "cell", None), "source", "")  # nbval's cells only
    timed = TIMED_CELL.search(source)
    with held(TIMING) if timed else contextlib.nullcontext():
        yield
