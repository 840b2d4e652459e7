"""`make reference`: record this machine's figures for lesson 05 in data/reference/,
beside the recorded ones.

Runs notebooks/05_mixed_precision.ipynb and its lab, 05_mixed_precision_lab.ipynb, once
each, top to bottom, on the device the lesson picks (the first CUDA GPU, else the CPU),
in copies (the stored outputs stay as they are), reads the values their summaries
printed, and writes them with a description of the
machine to ``data/reference/<machine>.json``: device type and name, what it offers
bfloat16 (``helpers.mixed_precision.bfloat16_matmul_kernel``), PyTorch's CPU kernels or
the GPU's compute capability, the torch and Python versions, the date, and each figure
with its verdict. The lesson plots its learner's speed ratios beside every file there,
so a figure from another machine reaches the text only this way. A second run on the
same kind of machine replaces that machine's file. ``--out DIR`` writes elsewhere.
"""
import argparse
import datetime
import json
import platform
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench.py, beside this file

# the summary's `name: value` lines, as make bench reads them
from bench import measured_lines  # noqa: E402

from helpers.paths import REPO_ROOT  # noqa: E402
from helpers.ranges import SUMMARY_HEADERS, parse_value  # noqa: E402

LESSON = REPO_ROOT / "notebooks" / "05_mixed_precision.ipynb"
LAB = REPO_ROOT / "notebooks" / "05_mixed_precision_lab.ipynb"
NUMBER = re.compile(r"^-?\d+(\.\d+)?(e-?\d+)?")


def machine():
    """The device the lesson runs on, described without host or user names."""
    import torch

    from helpers.device import device_name
    from helpers.mixed_precision import bfloat16_matmul_kernel

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        device_type, name, capability = ("cuda", device_name("cuda"),
                                         f"compute capability {major}.{minor}")
    else:
        flags = torch.cpu.get_capabilities()
        bfloat16 = [f for f in ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16",
                                "sve_bf16") if flags.get(f)]
        device_type, name = "cpu", device_name("cpu")
        capability = ("PyTorch's CPU kernels "
                      f"{torch.backends.cpu.get_cpu_capability()}; "
                      "bfloat16 instructions: "
                      f"{', '.join(bfloat16) or 'none'}; "
                      f"{flags.get('num_physical_cores')} cores")
    return {"device": device_type, "device_name": name, "capability": capability,
            "bfloat16_kernel": bfloat16_matmul_kernel(device_type),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def figures(lines):
    """{name: number} and {name: verdict} from the summary's lines
    ('0.3957  (expected <= 0.99): in range')."""
    values, verdicts = {}, {}
    for name, text in lines.items():
        value, _, verdict = parse_value(text)
        match = NUMBER.match(value)
        if match is None:
            raise ValueError(f"the summary line {name!r} holds no number: {text!r}")
        values[name] = float(match.group(0))
        verdicts[name] = verdict or "exact"
    return values, verdicts


def file_name(record):
    """'intel-xeon-onednn-s-avx512-bf16-kernel.json': one file per kind of machine."""
    words = f"{record['device_name']} {record['bfloat16_kernel']}".lower()
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") + ".json"


def main(out_dir):
    import nbformat
    from nbclient import NotebookClient

    lines = {}
    for path in (LESSON, LAB):
        notebook = nbformat.read(path, as_version=4)
        print(f"running {path.relative_to(REPO_ROOT)} (about a minute on 2 CPU cores)",
              flush=True)
        NotebookClient(notebook, timeout=600,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        printed = measured_lines(notebook)
        if not printed:
            raise SystemExit(f"record_reference: {path.name} printed no summary "
                             f"({' or '.join(map(repr, SUMMARY_HEADERS))})")
        lines.update(printed)
    record = machine()
    record["figures"], record["verdicts"] = figures(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / file_name(record)
    path.write_text(json.dumps(record, indent=2) + "\n")
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    print(f"wrote {shown}")
    for name, value in record["figures"].items():
        print(f"  {name}: {value}  ({record['verdicts'][name]})")


if __name__ == "__main__":
    # the docstring's first paragraph (its first sentence, wrapped)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "reference",
                        help="the folder to write the machine's JSON file into "
                        "(default: data/reference)")
    main(parser.parse_args().out)
