"""Run each code cell of a notebook twice in a row; report what the second run changes.

One job: check STYLE.md rule 19, "a cell runs twice the same way" (learners press
Shift+Enter twice). In a fresh python3 kernel, started in the notebook's folder as
`make execute` does, every code cell runs and then runs again at once (cell 1, cell 1,
cell 2, cell 2, ...). Per notebook it reports:

- a cell whose run raises (on the first run a plain failure, on the second a rule 19
  break), with its index (every cell counted from 0, Markdown cells included), its id,
  and the exception's name and message;
- a cell whose second run prints text (stdout, text/plain) that differs from its first
  run's after tests/nbval_sanitize.cfg's sanitizers, unless the cell is tagged
  nbval-ignore-output; a warning printed once on stderr is no change, a new one is;
- a measured value outside its range (helpers/ranges.py), in either run.

It exits 1 when any notebook has one of these, else 0. A tool for authors (issue 26
point 8), not part of `make test`: it runs every lesson twice over.

    .venv/bin/python tools/run_twice.py [NOTEBOOK ...]  # default: notebooks/0[0-9]_*
"""
import argparse
import copy
import difflib
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from helpers.paths import REPO_ROOT
from helpers.ranges import OUT_OF_RANGE, OUTSIDE_TEXT

SANITIZER = REPO_ROOT / "tests" / "nbval_sanitize.cfg"
IGNORE_OUTPUT_TAG = "nbval-ignore-output"
CELL_TIMEOUT_S = 600  # as `make execute`


def sanitizers():
    """The sanitizer's (regex, replace) pairs; tests/test_ranges.py reads them here
    too."""
    lines = SANITIZER.read_text().splitlines()
    return [(regex[len("regex: "):], replace[len("replace: "):])
            for regex, replace in zip(lines, lines[1:])
            if regex.startswith("regex: ") and replace.startswith("replace: ")]


def sanitize(text, pairs):
    """Apply the pairs in order, as nbval does, so that what truly varies is hidden."""
    for regex, replace in pairs:
        text = re.sub(regex, replace, text)
    return text


def compared_texts(outputs, pairs):
    """What a learner reads: stdout joined (nbval coalesces streams), each text/plain.

    Each text is sanitized on its own, as nbval sanitizes each output: a pattern such as
    the Trainer progress one (``(?s)^.*<progress``) would swallow its neighbours.
    """
    stdout = "".join(o.text for o in outputs
                     if o.output_type == "stream" and o.name == "stdout")
    plain = [o.data["text/plain"] for o in outputs if "text/plain" in o.get("data", {})]
    return [sanitize(text, pairs) for text in [stdout, *plain]]


def stderr_lines(outputs, pairs):
    """The sanitized stderr lines, to find those that only the second run printed."""
    text = "".join(o.text for o in outputs
                   if o.output_type == "stream" and o.name == "stderr")
    return [sanitize(line, pairs) for line in text.splitlines()]


def out_of_range_lines(outputs):
    """Lines of any text output that say a measured value fell outside its range."""
    texts = [o.text for o in outputs if o.output_type == "stream"]
    # summary_table shows its verdicts as Markdown: every text/* form is read
    texts += [value for o in outputs for mime, value in o.get("data", {}).items()
              if mime.startswith("text/") and isinstance(value, str)]
    return [line.strip() for text in texts for line in text.splitlines()
            if OUTSIDE_TEXT in line or OUT_OF_RANGE in line]


def errors(outputs):
    """'Name: message' for each error output of one run."""
    return [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]


def first_difference(first, second):
    """The first changed lines of two texts, as '-old / +new', for the report."""
    diff = difflib.unified_diff(first.splitlines(), second.splitlines(),
                                lineterm="", n=0)
    changed = [line for line in diff
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return " / ".join(line[:100] for line in changed[:2]) or "(line breaks differ)"


def check_cell(index, cell, first, second, pairs):
    """The report lines for one cell, given the outputs of its two runs."""
    where = f"cell {index} (id {cell.get('id', '?')})"
    found = {"errors": [], "changed": [], "range": []}
    for run, outputs in (("first", first), ("second", second)):
        for error in errors(outputs):
            found["errors"].append(f"{where}: {run} run raises {error}")
        for line in dict.fromkeys(out_of_range_lines(outputs)):
            # the second run repeating a line of the first is one finding, not two
            if run == "first" or line not in out_of_range_lines(first):
                found["range"].append(f"{where}: {run} run: {line}")
    # an error is reported above on its own; an ignored cell varies by design (timings)
    ignored = IGNORE_OUTPUT_TAG in cell.metadata.get("tags", [])
    if errors(first) or errors(second) or ignored:
        return found
    before, after = compared_texts(first, pairs), compared_texts(second, pairs)
    if before != after:
        differing = [(b, a) for b, a in zip(before, after) if b != a]
        detail = (first_difference(*differing[0]) if differing
                  else "(one run shows a text/plain output more)")
        found["changed"].append(f"{where}: second run's output differs: {detail}")
    # Python and transformers print many warnings once per process: a new one matters
    new = [line for line in stderr_lines(second, pairs)
           if line not in stderr_lines(first, pairs)]
    if new:
        found["changed"].append(f"{where}: second run prints on stderr: {new[0][:100]}")
    return found


def run_twice(path, pairs):
    """Run one notebook, each code cell twice: its report lines, whether it failed."""
    notebook = nbformat.read(path, as_version=4)
    # kernel python3 and the notebook's folder as cwd, as `make execute` runs it;
    # allow_errors, so that every cell runs and every error is reported, not the first
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            allow_errors=True, record_timing=False,
                            resources={"metadata": {"path": str(Path(path).parent)}})
    found = {"errors": [], "changed": [], "range": []}
    code_cells = 0
    client.reset_execution_trackers()
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            code_cells += 1
            runs = []
            try:
                for _ in range(2):
                    # execute_cell empties cell.outputs first: keep a copy of each run's
                    client.execute_cell(cell, index,
                                        execution_count=client.code_cells_executed + 1)
                    runs.append(copy.deepcopy(cell.outputs))
            except (CellTimeoutError, DeadKernelError) as stopped:
                # the kernel is stuck or gone: the cells after would only repeat this
                found["errors"].append(
                    f"cell {index} (id {cell.get('id', '?')}): "
                    f"{'second' if runs else 'first'} run stopped: "
                    f"{type(stopped).__name__}: {str(stopped)[:200]}; "
                    "the cells after it were not run")
                break
            for kind, lines in check_cell(index, cell, *runs, pairs).items():
                found[kind] += lines
    summary = (f"{path}: {code_cells} code cells run twice, "
               f"{len(found['errors'])} errors, "
               f"{len(found['changed'])} changed outputs, "
               f"{len(found['range'])} out of range")
    details = found["errors"] + found["changed"] + found["range"]
    return [summary] + [f"  {line}" for line in details], bool(details)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: notebooks/0[0-9]_*.ipynb)")
    paths = parser.parse_args().notebooks
    if not paths:
        lessons = sorted((REPO_ROOT / "notebooks").glob("0[0-9]_*.ipynb"))
        # shown relative to the repository, as the paths that a person types
        paths = [p.relative_to(REPO_ROOT) if Path.cwd() == REPO_ROOT else p
                 for p in lessons]
    pairs = sanitizers()
    failed = False
    for path in paths:
        print(f"running {path}, each code cell twice", file=sys.stderr, flush=True)
        lines, notebook_failed = run_twice(path, pairs)
        print("\n".join(lines), flush=True)
        failed |= notebook_failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
