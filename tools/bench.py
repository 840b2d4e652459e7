"""`make bench`: run each notebook once; print wall seconds, peak RSS, its slowest cell
and its measured lines.

It fails when a notebook cell raises or when a lesson measured a value outside the range
it declares (helpers/ranges.py); `make test-gpu` runs it with --require-gpu, so every
lesson runs on the GPU.

Issue 16's time targets (on 2 cores), as issue 42 split them: a lesson notebook, the
spine (notebooks/0N_*.ipynb), under 30 s, its lab (notebooks/0N_*_lab.ipynb) under 45
s, a practice notebook under 20 s, every cell under 15 s. A notebook that misses one is
marked OVER in the table's last column and listed at the end; that is a warning, not a
failure (times depend on the machine and its load).

Writes the same table as JSON to build/bench/bench.json (git-ignored). With
BENCH_EXECUTED_DIR set, each executed notebook (a failed one too) is also written there,
to read its outputs.
"""
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from helpers.paths import REPO_ROOT
from helpers.ranges import OUT_OF_RANGE, parse_value, summary_lines

OUT_DIR = REPO_ROOT / "build" / "bench"
# issue 16's targets, on 2 cores
LESSON_TARGET_S, LAB_TARGET_S, PRACTICE_TARGET_S, CELL_TARGET_S = 30, 45, 20, 15


def measured_lines(notebook):
    """The `name: value` lines that a lesson's summary cell printed."""
    for cell in reversed(notebook.cells):
        text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream")
        lines = summary_lines(text)
        if lines:
            return lines
    return {}


def run_one(path):
    """Execute one notebook (not in place) in this process's child kernel; print a JSON
    row.

    Each code cell is timed from the request to the kernel until its reply (its outputs
    included); a cell's index counts every cell of the notebook from 0, Markdown cells
    included.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    started, cell_s = {}, {}

    def cell_started(cell, cell_index):
        started[cell_index] = time.perf_counter()

    def cell_done(cell, cell_index, execute_reply):
        cell_s[cell_index] = time.perf_counter() - started[cell_index]

    client = NotebookClient(notebook, timeout=600,
                            resources={"metadata": {"path": str(Path(path).parent)}},
                            on_cell_execute=cell_started, on_cell_executed=cell_done)
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        wall_s = time.perf_counter() - start
        # keep each executed copy, a failed one too, to read it
        if os.environ.get("BENCH_EXECUTED_DIR"):
            kept = Path(os.environ["BENCH_EXECUTED_DIR"])
            kept.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, kept / Path(path).name)
    # ru_maxrss of waited-for children: the kernel and every process it started (KiB on
    # Linux)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    slowest = max(cell_s, key=cell_s.get, default=None)
    print(
        json.dumps(
            {
                "notebook": str(path),
                "wall_s": round(wall_s, 1),
                "peak_rss_mib": round(peak_rss_mib),
                "slowest_cell": None
                if slowest is None
                else {"index": slowest, "seconds": round(cell_s[slowest], 2),
                      "first_line": notebook.cells[slowest] .source.strip()
                      .splitlines()[0]},
                "cell_s": [
                    [index, round(seconds, 2)] for index, seconds in cell_s.items()
                ],
                "measured": measured_lines(notebook),
            }
        )
    )


def notebook_target_s(path):
    """Issue 16's wall-time target for the notebook at ``path``, or None (neither a
    lesson nor a practice)."""
    path = Path(path)
    if path.parent.name == "practice":
        return PRACTICE_TARGET_S
    if re.fullmatch(r"0\d_.*_lab\.ipynb", path.name):
        return LAB_TARGET_S
    return LESSON_TARGET_S if re.fullmatch(r"0\d_.*\.ipynb", path.name) else None


def over_targets(row):
    """What in one row misses issue 16's time targets, in words; empty when nothing
    does."""
    over = []
    target = notebook_target_s(row["notebook"])
    if target is not None and row["wall_s"] > target:
        over.append(f"notebook {row['wall_s']:.1f} s > {target} s")
    over += [f"cell {index} {seconds:.1f} s > {CELL_TARGET_S} s"
             for index, seconds in row["cell_s"] if seconds > CELL_TARGET_S]
    return over


def table(rows):
    """The printed table: one line per notebook, its slowest cell, and OVER where it
    misses a time target."""
    width = max(len(r["notebook"]) for r in rows)
    lines = [f"{'notebook':<{width}}  {'wall s':>7}  {'peak RSS MiB':>12}  "
             f"{'slowest cell':>14}  targets"]
    for r in rows:
        slowest = r["slowest_cell"]
        cell = "-" if slowest is None else (f"{slowest['seconds']:.1f} s "
                                            f"#{slowest['index']}")
        lines.append(f"{r['notebook']:<{width}}  {r['wall_s']:>7.1f}  "
                     f"{r['peak_rss_mib']:>12}  {cell:>14}  "
                     f"{'OVER' if r['over_targets'] else 'ok'}")
    return "\n".join(lines)


def main(paths, require_gpu=False):
    """Run each notebook in a fresh process, print the table and write
    build/bench/bench.json."""
    if require_gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("test-gpu: PyTorch sees no CUDA GPU here "
                             "(torch.cuda.is_available() is False)")
    rows = []
    for path in paths:
        # a fresh process per notebook, so that each peak RSS belongs to one notebook
        # alone
        result = subprocess.run(
            [sys.executable, __file__, "--one", path], capture_output=True, text=True
        )
        if result.returncode != 0:
            print(result.stderr, file=sys.stderr)
            raise SystemExit(f"bench: {path} failed to run")
        row = json.loads(result.stdout.strip().splitlines()[-1])
        row["over_targets"] = over_targets(row)
        rows.append(row)
        print(f"ran {path}", file=sys.stderr, flush=True)
    print(table(rows))
    for r in rows:
        for name, value in r["measured"].items():
            print(f"  {Path(r['notebook']).stem}  {name}: {value}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    written = OUT_DIR / "bench.json"
    written.write_text(json.dumps(rows, indent=2) + "\n")
    inside = written.is_relative_to(REPO_ROOT)
    print(f"wrote {written.relative_to(REPO_ROOT) if inside else written}")
    for r in rows:
        if r["over_targets"]:
            print(f"OVER issue 16's time targets: {Path(r['notebook']).stem}: "
                  f"{'; '.join(r['over_targets'])}")
    outside = [f"{Path(r['notebook']).stem} {name}" for r in rows
               for name, value in r["measured"].items()
               if parse_value(value)[2] == OUT_OF_RANGE]
    if outside:
        raise SystemExit("bench: measured values outside the lessons' ranges: "
                         f"{', '.join(outside)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        run_one(sys.argv[2])
    else:
        arguments = sys.argv[1:]
        main([a for a in arguments if a != "--require-gpu"],
             require_gpu="--require-gpu" in arguments)
