"""Practice 6's checks (lesson 06), on the core: 6.1 and 6.2 against lesson 06's ZeRO
formulas; 6.3 runs the learner's save in 2 processes on a DistilBERT under FSDP2."""
import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from helpers import launcher
from helpers.models import build_model
from helpers.practice import core
from helpers.units import MiB

STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
SPLIT = {"DDP": (), "ZeRO-1": ("state",), "ZeRO-2": ("gradients", "state"),
         "ZeRO-3": ("weights", "gradients", "state")}
COLLECTIVE_TIMEOUT_S = 6  # 6.3's usual mistake, a gather one process skips, fails fast


def formula_bytes(stage, parameters, n, split=SPLIT, state_bytes=8):
    """Bytes one of ``n`` processes holds between steps, float32 AdamW (lesson 06)."""
    per_parameter = {"weights": 4, "gradients": 4, "state": state_bytes}
    return sum(b * parameters / (n if part in split[stage] else 1)
               for part, b in per_parameter.items())


BYTES = core.Exercise(  # its outcome: the bytes of each stage
    "6.1", lambda answer, config: {stage: core.as_number(core.learner(
        answer, stage, *config), f"bytes_per_process for {stage}") for stage in STAGES},
    intended=formula_bytes, name="bytes_per_process",
    configs=((65_783_042, 2), (7_000_000_000, 8), (1_200, 3)),
    label="{:,} parameters on {} processes", same=core.close(rel=1e-4),
    mistakes=(
        ("ZeRO-2 splits the gradients and the optimizer state; every process still "
         "keeps all the weights. Splitting the weights too is ZeRO-3.",
         lambda *args: formula_bytes(*args, {**SPLIT, "ZeRO-2": SPLIT["ZeRO-3"]})),
        ("AdamW keeps two float32 averages per parameter: 8 bytes of state, not 4 "
         "(lesson 4).", lambda *args: formula_bytes(*args, state_bytes=4)),
    ),
    describe="4 + 4 + 8 bytes a parameter; divide by n the parts each stage splits.",
    correct=lambda got, config: (f"DistilBERT-base on 2: {got['DDP'] / MiB:,.1f} MiB "
                                 f"with DDP, {got['ZeRO-3'] / MiB:,.1f} with ZeRO-3."),
)


@core.checker(BYTES)
def check_bytes_per_process(bytes_per_process):
    """``bytes_per_process(stage, parameters, n)``: one of ``n`` processes' bytes."""


FITS = core.Exercise(
    "6.2", lambda answer, config: core.learner(answer, *config),
    name="first_stage_that_fits",  # the first stage (the least split) that fits
    intended=lambda p, n, gpu, act: next(
        (stage for stage in STAGES if formula_bytes(stage, p, n) + act <= gpu), None),
    configs=((1.3e9, 8, 24e9, 2e9), (7e9, 8, 80e9, 10e9), (7e9, 8, 80e9, 20e9),
             (13e9, 8, 80e9, 10e9), (7e9, 64, 80e9, 20e9), (70e9, 8, 80e9, 10e9)),
    label="{:.3g} parameters on {} GPUs of {:.3g} bytes, {:.3g} of activations",
    mistakes=(
        ("the most sharded stage always fits best, but it sends the most: ZeRO-3 "
         "sends 1.5x DDP's bytes. Return the *first* stage that fits.",
         lambda p, n, gpu, act: "ZeRO-3" if formula_bytes("ZeRO-3", p, n) + act <= gpu
         else None),
        ("the activations need room too: add activation_bytes to each stage's bytes.",
         lambda p, n, gpu, act: next(
             (stage for stage in STAGES if formula_bytes(stage, p, n) <= gpu), None)),
    ),
    describe="return the first stage, 'DDP' to 'ZeRO-3', that fits, else None.",
    correct="1.3B parameters fit 24 GB with DDP; 70B fit nowhere.",
)


@core.checker(FITS)
def check_first_stage_that_fits(first_stage_that_fits):
    """``first_stage_that_fits(parameters, n, gpu_bytes, activation_bytes)``."""


def colleague_save(model, path):
    """Save a checkpoint that one process can load later; every process calls it."""
    if dist.get_rank() == 0:  # one file, written once
        torch.save(model.state_dict(), path)


def saving_worker(accelerator, saves, folder):
    """Each process, for each save: the tiny DistilBERT sharded, saved, then weighed."""
    mesh, held = init_device_mesh("cpu", (dist.get_world_size(),)), []
    full = build_model("tiny", seed=0).state_dict()  # the same weights, whole
    for index, save in enumerate(saves):
        model, path = build_model("tiny", seed=0), f"{folder}/{index}.pt"
        fully_shard(model, mesh=mesh)
        save(model, path)  # the only collectives before the barrier: the save's
        dist.barrier()
        saved = torch.load(path, weights_only=False) if os.path.exists(path) else {}
        whole = sum(type(value) is torch.Tensor and torch.equal(value, full[name])
                    for name, value in saved.items() if name in full)
        held.append({"entries": len(saved), "whole and equal": whole,
                     "DTensors": sum(hasattr(v, "to_local") for v in saved.values())})
    return held


_held = {}  # the mistakes' outcomes, weighed in the intended answer's launch, not 3


def _saved(answer, config):
    if answer in _held:
        return _held.pop(answer)
    import transformers.models.distilbert.modeling_distilbert  # noqa: F401
    waited = core.Raised("RuntimeError: a collective timed out: a process never joined")
    saves = [answer, *(wrong for _, wrong in CHECKPOINT.mistakes
                       if answer is CHECKPOINT.intended)]
    with tempfile.TemporaryDirectory() as folder:
        try:  # preload=False: the model's code above, once, is all the workers need
            held = launcher.run_in_processes(
                saving_worker, (saves, folder), timeout_s=90, preload=False,
                collective_timeout_s=COLLECTIVE_TIMEOUT_S)
        except launcher.WorkerTimeoutError:
            return waited
        except launcher.WorkerFailedError as error:  # gloo's, where a peer never joined
            return (waited if launcher.is_peer_failure(error.worker_traceback)
                    else core.Raised(error.worker_traceback.strip().splitlines()[-1]))
    _held.update(zip(saves[1:], held[1:]))
    return held[0]


def gathered_save(model, path):  # every process joins each all-gather; 0 writes
    state = {name: value.full_tensor() for name, value in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(state, path)


def local_save(model, path):  # a usual wrong answer: this process's slices only
    if dist.get_rank() == 0:
        torch.save({k: v.to_local() for k, v in model.state_dict().items()}, path)


CHECKPOINT = core.Exercise(
    "6.3", _saved, intended=gathered_save, name="fixed_save",
    mistakes=(
        ("the state dict of a `fully_shard` model holds DTensors, each process's "
         "slice: gather each whole first (`.full_tensor()`, or `get_model_state_dict` "
         "with `full_state_dict=True`), in every process.", colleague_save),
        ("`.to_local()` gives this process's slice, half of each tensor: "
         "`.full_tensor()` all-gathers the whole one.", local_save),
    ),
    error_hints=(("timed out", "only process 0 gathered: an all-gather waits for "
                  "every process, so gather in every process and write in one."),),
    describe="every entry a plain tensor of the full shape, equal to the model's.",
    correct="the file holds all {entries} tensors whole.",
)


@core.checker(CHECKPOINT)
def check_fixed_save(fixed_save):
    """``fixed_save(model, path)``: a full checkpoint of a sharded model."""


def run_colleague_save():
    """What the colleague's file holds: the symptom of exercise 6.3 (measured once)."""
    return core.cached_outcome(CHECKPOINT, 0, 0)
