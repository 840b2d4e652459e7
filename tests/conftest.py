"""What the test modules share: reading a stored notebook, and a port of its own for each test worker.

The repository root is ``helpers.paths.REPO_ROOT``: import it from there.
"""
import json
import os

import pytest

from helpers.paths import REPO_ROOT


# `make test` runs on two workers (pytest-xdist). Each gives the processes it launches a port of its
# own (helpers.launcher.default_port reads MASTER_PORT; notebook kernels inherit it), so two launches
# at the same moment cannot both take 29500. And each worker's notebooks compute on one thread: two
# workers of two threads each on two cores would make the time ratios the lessons check depend on
# what the other worker happens to run (`make bench` runs each notebook alone, on every thread).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... in a worker; unset otherwise
if _WORKER.startswith("gw"):
    os.environ["MASTER_PORT"] = str(29500 + 100 * int(_WORKER[2:]))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _read_notebook(path):
    return json.loads((REPO_ROOT / path).read_text())


@pytest.fixture(scope="session")
def read_notebook():
    """A function: the notebook at ``path`` (absolute, or relative to the repository root) as a dict."""
    return _read_notebook
