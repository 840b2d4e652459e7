"""`make practice`: each practice notebook made from its solution notebook (issue 47).

The solution notebook, ``notebooks/practice/NN_<lesson>_solution.ipynb``, is the one
source; ``NN_<lesson>_practice.ipynb`` is written from it, the same cells in the same
order (their ids too: the translation catalogs' keys), except:
- a cell whose metadata holds ``practice`` (the intro, each exercise cell's version
  with `...` to fill in) has that text as its source, and loses that key;
- a cell tagged ``explanation`` (a solution's "Why this works") is left out.
Outputs come only from ``make execute``: a code cell keeps the stored practice
notebook's outputs while its source is unchanged, and has none until it is run again.

    python tools/make_practice.py           # write every practice notebook
    python tools/make_practice.py --check   # list the ones out of date; exit status 1
    python tools/make_practice.py --adopt NN_x_solution.ipynb  # once, for a practice
        # written by hand: its texts into the solution's metadata, its cell ids (and its
        # catalogs' keys in locales/*/practice) made the solution's, then written
"""
import argparse
import copy
import sys
from pathlib import Path

import nbformat

from helpers.paths import REPO_ROOT

PRACTICE_DIR = REPO_ROOT / "notebooks" / "practice"
LOCALES_DIR = REPO_ROOT / "locales"
STUB = "practice"  # a solution cell's metadata key: its text in the practice notebook
SOLUTION_ONLY = "explanation"  # the tag of a cell left out of the practice notebook


def practice_from(solution, stored=None):
    """The practice notebook made from ``solution``; outputs from ``stored`` ones."""
    kept = {cell.id: cell for cell in (stored or {}).get("cells", [])}
    made = copy.deepcopy(solution)
    made.cells = [cell for cell in made.cells
                  if SOLUTION_ONLY not in cell.metadata.get("tags", [])]
    for cell in made.cells:
        if STUB in cell.metadata:  # a list of lines, as a source is stored, or a text
            stub = cell.metadata.pop(STUB)
            cell.source = "".join(stub) if isinstance(stub, list) else stub
        if cell.cell_type == "code":
            old = kept.get(cell.id)
            same = old is not None and old.source == cell.source
            cell.outputs = old.outputs if same else []
            cell.execution_count = old.execution_count if same else None
    return made


def practice_path(solution_path):
    return solution_path.with_name(solution_path.name.replace("_solution", "_practice"))


def made_text(solution_path):
    """(the practice notebook's path, the text make_practice writes there)."""
    path = practice_path(solution_path)
    stored = nbformat.read(path, as_version=4) if path.exists() else None
    made = practice_from(nbformat.read(solution_path, as_version=4), stored)
    return path, nbformat.writes(made) + "\n"


def adopt(solution_path):
    """Make a hand-written practice notebook one that ``practice_from`` writes."""
    path = practice_path(solution_path)
    solution, practice = (nbformat.read(p, as_version=4) for p in (solution_path, path))
    shared = [cell for cell in solution.cells
              if SOLUTION_ONLY not in cell.metadata.get("tags", [])]
    if [(c.cell_type, c.metadata) for c in shared] != [
            (c.cell_type, c.metadata) for c in practice.cells]:
        sys.exit(f"{path.name}: its cells are not the solution's, but for the "
                 f"{SOLUTION_ONLY} cells: align them by hand first")
    renamed = {}
    for mine, theirs in zip(practice.cells, shared):
        if mine.source != theirs.source:
            theirs.metadata[STUB] = mine.source.splitlines(keepends=True)
        if mine.id != theirs.id:
            renamed[mine.id], mine.id = theirs.id, theirs.id  # its outputs carry over
    for catalog in sorted(LOCALES_DIR.glob(f"*/practice/{path.stem}.po")):
        text = catalog.read_text(encoding="utf-8")
        for old, new in renamed.items():
            text = text.replace(f'msgctxt "{old}"\n', f'msgctxt "{new}"\n')
        catalog.write_text(text, encoding="utf-8")
    nbformat.write(solution, solution_path)
    nbformat.write(practice_from(solution, practice), path)
    print(f"{path.name}: {len(renamed)} cell ids renamed; run `make translations`")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("solutions", nargs="*", type=Path,
                        help="solution notebooks (default: all of notebooks/practice)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; list the practice notebooks out of date")
    parser.add_argument("--adopt", action="store_true",
                        help="once, for practice notebooks written by hand (see above)")
    args = parser.parse_args(argv)
    if args.adopt:
        return [adopt(solution.resolve()) for solution in args.solutions] and 0
    stale = []
    for solution in args.solutions or sorted(PRACTICE_DIR.glob("*_solution.ipynb")):
        path, text = made_text(solution.resolve())
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO_ROOT)}: `make execute NB=...` it if "
                  "a code cell changed")
    if args.check and stale:
        print("out of date (run `make practice`):",
              *(p.relative_to(REPO_ROOT).as_posix() for p in stale), sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
