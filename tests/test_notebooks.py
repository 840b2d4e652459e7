"""Checks on the stored notebooks that nbval itself cannot make."""
import json
import re

import nbformat
import pytest

from helpers.language import LANGUAGES
from helpers.paths import REPO_ROOT

# the English notebooks; the Hindi and Turkish ones hold their code cells and outputs
# byte for byte (tests/test_translations.py)
NOTEBOOKS = sorted(p for p in (REPO_ROOT / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts
                   and p.relative_to(REPO_ROOT / "notebooks").parts[0] not in LANGUAGES)
MACHINE_PATH = re.compile(r"(/work/|/tmp/|/root/|/home/\w+|/Users/\w+|[A-Z]:\\\\Users)")


def code_cells(notebook):
    return [c for c in notebook["cells"] if c["cell_type"] == "code" and c["source"]]


def expects_error(cell):
    return "raises-exception" in cell.get("metadata", {}).get("tags", [])


def execution_problem(notebook):
    """Why the stored outputs were not made top to bottom in one kernel, or None when
    they were."""
    counts = [cell["execution_count"] for cell in code_cells(notebook)]
    if None in counts:
        return f"{counts.count(None)} code cell(s) never executed"
    if counts != list(range(1, len(counts) + 1)):
        return f"not executed top to bottom in one kernel (execution counts {counts})"
    return None


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_code_cell_was_executed_top_to_bottom(path, read_notebook):
    # nbval compares nothing for a never-executed cell, so an unexecuted cell would pass
    # silently.
    problem = execution_problem(read_notebook(path))
    assert problem is None, (f"{problem}: run `make execute "
                             f"NB={path.relative_to(REPO_ROOT)}`")


def notebook_with_counts(*counts):
    # neither is counted
    cells = [nbformat.v4.new_markdown_cell("# A lesson"), nbformat.v4.new_code_cell("")]
    cells += [nbformat.v4.new_code_cell(f"x = {i}", execution_count=count)
              for i, count in enumerate(counts)]
    return nbformat.v4.new_notebook(cells=cells)


@pytest.mark.parametrize("counts, problem", [
    ((1, 2, 3), None),
    ((1, None, 3), "1 code cell(s) never executed"),
    ((None, None, None), "3 code cell(s) never executed"),
    ((1, 3, 2), "not executed top to bottom"),
    # the kernel ran a cell that was deleted since
    ((2, 3, 4), "not executed top to bottom"),
], ids=["in-order", "one-unexecuted", "none-executed", "out-of-order", "gap"])
def test_the_execution_guard_catches_unexecuted_and_reordered_notebooks(
    counts, problem
):
    found = execution_problem(notebook_with_counts(*counts))
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_kernelspec_is_python3(path, read_notebook):
    # JupyterLab then opens the notebook without asking for a kernel.
    assert read_notebook(path)["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_outputs_hold_no_unexpected_errors_and_no_machine_paths(path, read_notebook):
    for cell in code_cells(read_notebook(path)):
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                assert expects_error(cell), (f"error output ({output['ename']}) in a "
                                             "cell not tagged raises-exception")
            text = json.dumps(output.get("text", "")) + json.dumps(
                output.get("data", {}).get("text/plain", "")
            )
            match = MACHINE_PATH.search(text)
            assert not match, f"a machine path in a stored output: {match.group(0)}"


def test_sanitize_file_pairs_are_adjacent():
    # nbval silently ignores a regex/replace pair split by a blank line.
    lines = (REPO_ROOT / "tests" / "nbval_sanitize.cfg").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("regex: "):
            assert i + 1 < len(lines) and lines[i + 1].startswith("replace: "), (
                f"line {i + 1}: regex without replace"
            )
