"""Checks on the stored notebooks that nbval itself cannot make."""
import json
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for p in (REPO_ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
MACHINE_PATH = re.compile(r"(/work/|/tmp/|/root/|/home/\w+|/Users/\w+|[A-Z]:\\\\Users)")


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code" and c["source"]]


def expects_error(cell):
    return "raises-exception" in cell.get("metadata", {}).get("tags", [])


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_code_cell_was_executed_top_to_bottom(path):
    # nbval compares nothing for a never-executed cell, so an unexecuted cell would pass silently.
    counts = [cell["execution_count"] for cell in code_cells(path)]
    assert None not in counts, f"{counts.count(None)} code cell(s) never executed: run `make execute NB={path.relative_to(REPO_ROOT)}`"
    assert counts == list(range(1, len(counts) + 1)), "not executed top to bottom in one kernel: run `make execute`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_kernelspec_is_python3(path):
    # JupyterLab then opens the notebook without asking for a kernel.
    assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_outputs_hold_no_unexpected_errors_and_no_machine_paths(path):
    for cell in code_cells(path):
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                assert expects_error(cell), f"error output ({output['ename']}) in a cell not tagged raises-exception"
            text = json.dumps(output.get("text", "")) + json.dumps(output.get("data", {}).get("text/plain", ""))
            match = MACHINE_PATH.search(text)
            assert not match, f"a machine path in a stored output: {match.group(0)}"


def test_sanitize_file_pairs_are_adjacent():
    # nbval silently ignores a regex/replace pair split by a blank line.
    lines = (REPO_ROOT / "tests" / "nbval_sanitize.cfg").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("regex: "):
            assert i + 1 < len(lines) and lines[i + 1].startswith("replace: "), f"line {i + 1}: regex without replace"
