"""Lesson 06's sharding helpers (helpers/sharding.py): the ring formulas, the byte
count, the meter's resized blocks, the CPU mesh's gloo group, the lesson's FSDP2 lines,
and two stages on 2 real processes against DDP."""
import ast
import inspect
import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from helpers import sharding
from helpers.launcher import WorkerFailedError
from helpers.models import build_model
from helpers.paths import REPO_ROOT
from helpers.sharding import StepMemoryMeter, bytes_held, launch, ring_bytes


def events(collective, sent):
    return [{"step": 2, "collective": collective, "bytes": sent}]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_bytes_follow_the_textbook_formulas(n):
    full = 1000 * n  # bytes of the full tensor
    per_process = {  # each process's log -> bytes each process sends over a ring
        "all_reduce": (events("all_reduce", full), 2 * (n - 1) / n * full),
        "all-gather": (events("all_gather_single", full // n), (n - 1) / n * full),
        "reduce-scatter": (events("reduce_scatter_single", full), (n - 1) / n * full),
    }
    for name, (log, expected) in per_process.items():
        assert ring_bytes([log] * n) == pytest.approx(expected), name
    # ZeroRedundancyOptimizer: each process broadcasts its own share, once
    shares = [events("broadcast", full // n)] * n
    assert ring_bytes(shares) == pytest.approx((n - 1) / n * full)
    assert ring_bytes([events("barrier", 0)] * n) == 0


def test_bytes_held_counts_each_block_once():
    weight = torch.zeros(10, 4)  # 160 bytes
    assert bytes_held([weight, weight[0], weight.t(), torch.zeros(3)]) == 160 + 12


def test_the_meter_counts_a_block_that_resize_grows_and_frees():
    gathered = torch.empty(1000)  # made before the step, as FSDP2's buffers are
    gathered.untyped_storage().resize_(0)
    original = torch.UntypedStorage.resize_
    with StepMemoryMeter() as meter:
        gathered.untyped_storage().resize_(4000)  # bytes: FSDP2 gathers into it
        extra = torch.ones(10)  # 40 bytes, a new tensor
        gathered.untyped_storage().resize_(0)  # and frees it
    assert (meter.peak_bytes, meter.live_bytes) == (4040, 40)
    assert torch.UntypedStorage.resize_ is original  # PyTorch's own again
    assert extra.sum() == 10


def test_an_unknown_stage_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="unknown stage 'ZeRO-2'; the stages are: "):
        launch("ZeRO-2", torch.nn.Linear(2, 2))


def test_a_failing_worker_shows_its_traceback_within_seconds():
    start = time.perf_counter()
    with pytest.raises(WorkerFailedError, match="has no attribute 'config'"):
        launch("DDP", torch.nn.Linear(2, 2))  # not a DistilBERT: no config
    assert time.perf_counter() - start < 60


def test_an_empty_list_of_stages_is_refused():
    with pytest.raises(ValueError, match="at least one stage"):
        launch([], torch.nn.Linear(2, 2))


# A machine with a GPU per process: the launcher's default group is NCCL's, which has no
# CPU collectives, and a 1-D mesh reuses the default group. Faked here on a CPU: a
# default group whose only backend is for "cuda" (gloo's, so that it starts without a
# GPU), as NCCL's is. One process, in a fresh interpreter (no group left behind).
MESH_ON_A_GPU_MACHINE = textwrap.dedent("""
    import json, sys, tempfile
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from helpers.sharding import cpu_mesh
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("cuda:gloo", store=store, rank=0, world_size=1)
    def cpu_all_reduce(mesh):
        try:
            dist.all_reduce(torch.ones(1), group=mesh.get_group())
            return "ok"
        except RuntimeError as error:
            return str(error)
    plain, ours = init_device_mesh("cpu", (1,)), cpu_mesh()
    print(json.dumps({"plain": cpu_all_reduce(plain),
                      "ours": cpu_all_reduce(ours),
                      "ours_backend": dist.get_backend(ours.get_group())}))
""")


def test_the_cpu_mesh_has_a_gloo_group_where_the_default_group_has_no_cpu_backend():
    result = subprocess.run([sys.executable, "-c", MESH_ON_A_GPU_MACHINE],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # the trap is real in this torch: a plain CPU mesh reuses the default group
    assert "No backend type associated with device type cpu" in found["plain"]
    assert (found["ours"], found["ours_backend"]) == ("ok", "gloo")


def test_the_lesson_shows_the_fsdp2_lines_the_processes_run():
    # accelerate's tests/test_examples.py, in small: the notebook's cell and the module
    # define the same function, line for line
    cells = json.loads((REPO_ROOT / "notebooks" / "06_sharding.ipynb").read_text())
    shown = []
    for cell in cells["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or "def shard_with_fsdp2" not in source:
            continue  # (the set-up cell's %matplotlib is not Python)
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name == "shard_with_fsdp2":
                shown.append(ast.get_source_segment(source, node))
    assert shown == [inspect.getsource(sharding.shard_with_fsdp2).rstrip()]


def test_fsdp2_holds_half_of_ddp_and_trains_the_same():
    model = build_model("tiny", seed=0)  # every first dimension even: no padding
    runs = launch(["DDP", "FSDP2"], model)  # one launch, the stages in turn
    ddp, zero3 = runs["DDP"], runs["FSDP2"]
    for run in (ddp, zero3):  # measured in the workers, from their groups
        assert {rank["backend"] for rank in run["ranks"]} == {"gloo"}
        assert {rank["device"] for rank in run["ranks"]} == {"cpu"}
    for ddp_rank, zero3_rank in zip(ddp["ranks"], zero3["ranks"]):
        ddp_rest, zero3_rest = ddp_rank["rest_bytes"], zero3_rank["rest_bytes"]
        assert zero3_rest["weights"] * 2 == ddp_rest["weights"]
        assert zero3_rest["gradients"] * 2 == ddp_rest["gradients"]
        steps = len(list(model.parameters())) * 4  # AdamW's step counters, whole
        assert (zero3_rest["optimizer state"] - steps) * 2 == (
            ddp_rest["optimizer state"] - steps)
        assert zero3_rank["whole_weights_after_forward"] == 0  # resharded after forward
        assert ddp_rank["whole_weights_after_forward"] == ddp_rest["weights"]
        assert zero3_rank["peak_bytes"] < ddp_rank["peak_bytes"]
    assert zero3["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert ring_bytes([r["events"] for r in zero3["ranks"]]) == pytest.approx(
        1.5 * ring_bytes([r["events"] for r in ddp["ranks"]]), rel=0.01)
