"""`make bench`: run each notebook once; print wall seconds, peak RSS and its measured lines.

It fails when a notebook cell raises or when a lesson measured a value outside the range it declares
(helpers/ranges.py); `make test-gpu` runs it with --require-gpu, so every lesson runs on the GPU.

Writes the same table as JSON to build/bench/bench.json (git-ignored).
"""
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from helpers.paths import REPO_ROOT
from helpers.ranges import OUT_OF_RANGE

OUT_DIR = REPO_ROOT / "build" / "bench"
SUMMARY_HEADER = "Measured in this lesson"


def measured_lines(notebook):
    """The `name: value` lines that a lesson's summary cell printed."""
    for cell in reversed(notebook.cells):
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        if SUMMARY_HEADER in text:
            lines = text.split(SUMMARY_HEADER, 1)[1].strip().splitlines()
            return dict(line.split(": ", 1) for line in lines if ": " in line)
    return {}


def run_one(path):
    """Execute one notebook (not in place) in this process's child kernel; print a JSON row."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(Path(path).parent)}}).execute()
    wall_s = time.perf_counter() - start
    # ru_maxrss of waited-for children: the kernel and every process it started (KiB on Linux)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"notebook": str(path), "wall_s": round(wall_s, 1),
                      "peak_rss_mib": round(peak_rss_mib), "measured": measured_lines(notebook)}))


def main(paths, require_gpu=False):
    """Run each notebook in a fresh process, print the table and write build/bench/bench.json."""
    if require_gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("test-gpu: PyTorch sees no CUDA GPU here (torch.cuda.is_available() is False)")
    rows = []
    for path in paths:
        # a fresh process per notebook, so that each peak RSS belongs to one notebook alone
        result = subprocess.run([sys.executable, __file__, "--one", path], capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stderr, file=sys.stderr)
            raise SystemExit(f"bench: {path} failed to run")
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        print(f"ran {path}", file=sys.stderr, flush=True)
    width = max(len(r["notebook"]) for r in rows)
    print(f"{'notebook':<{width}}  {'wall s':>7}  {'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['notebook']:<{width}}  {r['wall_s']:>7.1f}  {r['peak_rss_mib']:>12}")
    for r in rows:
        for name, value in r["measured"].items():
            print(f"  {Path(r['notebook']).stem}  {name}: {value}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {OUT_DIR.relative_to(REPO_ROOT)}/bench.json")
    outside = [f"{Path(r['notebook']).stem} {name}" for r in rows for name, value in r["measured"].items()
               if value.endswith(OUT_OF_RANGE)]
    if outside:
        raise SystemExit(f"bench: measured values outside the lessons' ranges: {', '.join(outside)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        run_one(sys.argv[2])
    else:
        arguments = sys.argv[1:]
        main([a for a in arguments if a != "--require-gpu"], require_gpu="--require-gpu" in arguments)
