"""What the test modules share: reading a stored notebook.

Each test worker's port and thread count are set in the repository's root conftest.py,
which pytest loads for notebooks/ too (`make test-other-cpu` collects notebooks/ alone).

The repository root is ``helpers.paths.REPO_ROOT``: import it from there.
"""
import json

import pytest

from helpers.paths import REPO_ROOT


def _read_notebook(path):
    return json.loads((REPO_ROOT / path).read_text())


@pytest.fixture(scope="session")
def read_notebook():
    """A function: the notebook at ``path`` (absolute, or relative to the repository
    root) as a dict."""
    return _read_notebook
