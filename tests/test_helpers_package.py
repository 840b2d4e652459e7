"""Importing any module of the helpers package changes nothing: no seeds, no settings,
no network; and each module's docstring names the lesson that introduces it."""
import ast
import json
import re
import subprocess
import sys

import pytest

from helpers.paths import REPO_ROOT

# Run in a fresh interpreter: in this one, other tests have imported helpers long ago.
IMPORT_EVERY_MODULE = r"""
import importlib, json, pkgutil, random, socket
import matplotlib, numpy, torch

attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args))
    raise OSError("network blocked by the test")
socket.socket.connect = socket.socket.connect_ex = socket.create_connection = refuse

def cannot_import(name):
    raise ImportError(f"cannot import {name}")

def state():
    numpy_state = [v.tolist() if isinstance(v, numpy.ndarray) else v
                   for v in numpy.random.get_state()]
    return {"torch RNG": torch.get_rng_state().tolist(), "numpy RNG": numpy_state,
            "python random": random.getstate(),
            "matplotlib rcParams": repr(sorted(matplotlib.rcParams.items())),
            "torch default dtype": str(torch.get_default_dtype())}

before = state()
import helpers
imported = [m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers.",
                                                  onerror=cannot_import)]
for name in imported:
    importlib.import_module(name)
after = state()
changed = [k for k in before if before[k] != after[k]]
print(json.dumps({"imported": imported, "attempts": attempts, "changed": changed}))
"""


def test_importing_every_helpers_module_has_no_side_effects():
    result = subprocess.run([sys.executable, "-c", IMPORT_EVERY_MODULE],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert {"helpers.models", "helpers.plots", "helpers.practice.check_adamw"} <= set(
        report["imported"]
    ), report["imported"]
    assert report["changed"] == [], f"importing helpers changed: {report['changed']}"
    assert report["attempts"] == [], ("importing helpers tried to connect: "
                                      f"{report['attempts']}")


LESSON = re.compile(r"\b(?:lessons? 0\d|00_start_here)")


# helpers/__init__.py aside: the package's docstring says what importing it does
MODULES = sorted(set((REPO_ROOT / "helpers").rglob("*.py"))
                 - {REPO_ROOT / "helpers" / "__init__.py"})


@pytest.mark.parametrize("path", MODULES,
                         ids=lambda path: path.relative_to(REPO_ROOT).as_posix())
def test_every_helpers_module_says_which_lesson_introduces_it(path):
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert LESSON.search(" ".join(docstring.split())), (
        f"{path.name}'s docstring names no lesson: {docstring[:80]!r}")
