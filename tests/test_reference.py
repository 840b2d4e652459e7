"""Lesson 05's reference figures: what tools/record_reference.py reads and writes, and
the files it wrote."""
import json

import pytest
from tool_scripts import load_tool

from helpers.paths import REPO_ROOT

REFERENCE_DIR = REPO_ROOT / "data" / "reference"
RECORDED = sorted(REFERENCE_DIR.glob("*.json"))
KEYS = {"device", "device_name", "capability", "bfloat16_kernel", "torch", "python",
        "date", "figures", "verdicts"}
# what the lesson's speed figure reads
record_reference = load_tool("record_reference")
PLOTTED = {"bf16_large_matmul_time_ratio", "bf16_step_time_ratio"}


def test_the_summary_lines_become_numbers_and_verdicts():
    values, verdicts = record_reference.figures({
        "bf16_kept_bytes_ratio_small_batch": "0.3957  (expected <= 0.99): in range",
        "bf16_weight_copies_mib": "82.13",
        "float16_zero_share": "5e-05  (expected 0.0001 to 0.01): OUT OF RANGE"})
    assert values == {"bf16_kept_bytes_ratio_small_batch": 0.3957,
                      "bf16_weight_copies_mib": 82.13, "float16_zero_share": 5e-05}
    assert verdicts == {"bf16_kept_bytes_ratio_small_batch": "in range",
                        "bf16_weight_copies_mib": "exact",
                        "float16_zero_share": "OUT OF RANGE"}


def test_a_summary_line_without_a_number_is_refused():
    with pytest.raises(ValueError, match="holds no number"):
        record_reference.figures({"reference_step_matches_torch": "True"})


def test_one_file_per_kind_of_machine_named_without_odd_characters():
    name = record_reference.file_name({"device_name": "NVIDIA H200",
                                  "bfloat16_kernel": "a GPU's tensor cores"})
    assert name == "nvidia-h200-a-gpu-s-tensor-cores.json"


def test_this_machine_is_described_without_host_or_user_names():
    import getpass
    import socket

    described = json.dumps(record_reference.machine())
    assert socket.gethostname() not in described and getpass.getuser() not in described


def test_at_least_one_machine_is_recorded():
    assert RECORDED, "no data/reference/*.json: run `make reference` on this machine"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_each_recorded_machine_says_what_it_was_and_holds_the_plotted_figures(path):
    record = json.loads(path.read_text())
    assert KEYS <= set(record), f"{path.name} lacks {sorted(KEYS - set(record))}"
    assert record["device"] in ("cpu", "cuda")
    assert PLOTTED <= set(record["figures"]), (
        f"{path.name} lacks {sorted(PLOTTED - set(record['figures']))}")
    assert all(value > 0 for name, value in record["figures"].items()
               if name in PLOTTED)
    assert path.name == record_reference.file_name(record)
