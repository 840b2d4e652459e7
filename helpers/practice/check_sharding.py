"""Practice 6's checks (lesson 06): ZeRO's formulas; 6.3, a sharded save on 2 ranks."""
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

STAGES = {"DDP": (), "ZeRO-1": ("state",), "ZeRO-2": ("gradients", "state"),
          "ZeRO-3": ("weights", "gradients", "state")}  # stage -> what it divides by n
COLLECTIVE_TIMEOUT_S = 6  # 6.3's usual mistake, a gather one process skips, fails fast
_held = {}  # 6.3's mistakes' outcomes, weighed in the intended answer's launch, not 3


def formula_bytes(stage, parameters, n, split=STAGES, state_bytes=8):
    """Bytes one of ``n`` processes holds between steps, float32 AdamW (lesson 06)."""
    held = {"weights": 4, "gradients": 4, "state": state_bytes}  # bytes a parameter
    return parameters * sum(b / n if k in split[stage] else b for k, b in held.items())


BYTES = core.Exercise(  # its outcome: the bytes of each stage
    "6.1", lambda answer, config: {stage: core.as_number(core.learner(
        answer, stage, *config), f"bytes_per_process for {stage}") for stage in STAGES},
    intended=formula_bytes, name="bytes_per_process",
    configs=((65_783_042, 2), (7_000_000_000, 8), (1_200, 3)),
    label="{:,} parameters on {} processes", same=core.close(rel=1e-4),
    mistakes=(
        ("ZeRO-2 splits the gradients and the optimizer state; every process still "
         "keeps all the weights. Splitting the weights too is ZeRO-3.",
         lambda *args: formula_bytes(*args, {**STAGES, "ZeRO-2": STAGES["ZeRO-3"]})),
        ("AdamW keeps two float32 averages per parameter: 8 bytes of state, not 4 "
         "(lesson 4).", lambda *args: formula_bytes(*args, state_bytes=4))),
    describe="4 + 4 + 8 bytes a parameter; divide by n the parts each stage splits.",
    correct=lambda got, config: (f"DistilBERT-base on 2: {got['DDP'] / MiB:,.1f} MiB "
                                 f"with DDP, {got['ZeRO-3'] / MiB:,.1f} with ZeRO-3."))


@core.checker(BYTES)
def check_bytes_per_process(bytes_per_process):
    """``bytes_per_process(stage, parameters, n)``: one of ``n`` processes' bytes."""


FITS = core.Exercise(
    "6.2", lambda answer, config: core.learner(answer, *config),
    name="first_stage_that_fits", intended=lambda p, n, gpu, act: next(
        (stage for stage in STAGES if formula_bytes(stage, p, n) + act <= gpu), None),
    configs=((1.3e9, 8, 24e9, 2e9), (7e9, 8, 80e9, 10e9), (7e9, 8, 80e9, 20e9),
             (13e9, 8, 80e9, 10e9), (7e9, 64, 80e9, 20e9), (70e9, 8, 80e9, 10e9)),
    label="{:.3g} parameters on {} GPUs of {:.3g} bytes, {:.3g} of activations",
    mistakes=(  # ZeRO-3 fits wherever a stage does
        ("ZeRO-3 always fits best, but it sends the most (1.5x DDP's bytes): return "
         "the *first* stage that fits.", lambda *c: FITS.intended(*c) and "ZeRO-3"),
        ("the activations need room too: add activation_bytes to each stage's bytes.",
         lambda p, n, gpu, act: FITS.intended(p, n, gpu, 0))),
    describe="return the first stage, 'DDP' to 'ZeRO-3', that fits, else None.",
    correct="1.3B parameters fit 24 GB with DDP; 70B fit nowhere.")


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
        path = f"{folder}/{index}.pt"
        save(fully_shard(build_model("tiny", seed=0), mesh=mesh), path)
        dist.barrier()  # the only collectives before it: the save's
        saved = torch.load(path, weights_only=False) if os.path.exists(path) else {}
        whole = sum(type(value) is torch.Tensor and torch.equal(value, full[name])
                    for name, value in saved.items() if name in full)
        held.append({"entries": len(saved), "whole and equal": whole,
                     "DTensors": sum(hasattr(v, "to_local") for v in saved.values())})
    return held


def _saved(save, config):
    if save in _held:
        return _held.pop(save)
    import transformers.models.distilbert.modeling_distilbert  # noqa: F401
    saves = [save] + [w for _, w in CHECKPOINT.mistakes if save is CHECKPOINT.intended]
    with tempfile.TemporaryDirectory() as folder:
        try:  # preload=False: the model's code above, once, is all the workers need
            held = launcher.run_in_processes(
                saving_worker, (saves, folder), timeout_s=90, preload=False,
                collective_timeout_s=COLLECTIVE_TIMEOUT_S)
        except (launcher.WorkerFailedError, launcher.WorkerTimeoutError) as error:
            said = getattr(error, "worker_traceback", "")  # none: it hung, then stopped
            if not said or launcher.is_peer_failure(said):  # gloo's: a peer never came
                said = "RuntimeError: a collective timed out: a process never joined"
            return core.Raised(said.strip().splitlines()[-1])
    _held.update(zip(saves[1:], held[1:]))
    return held[0]


def saving(method):  # a save: every process calls a method of each entry; 0 writes
    def save(model, path):
        state = {k: getattr(v, method)() for k, v in model.state_dict().items()}
        if dist.get_rank() == 0:
            torch.save(state, path)
    return save


CHECKPOINT = core.Exercise(
    "6.3", _saved, intended=saving("full_tensor"), name="fixed_save",
    mistakes=(
        ("the state dict of a `fully_shard` model holds DTensors, each process's "
         "slice: gather each whole first (`.full_tensor()`, or `get_model_state_dict` "
         "with `full_state_dict=True`), in every process.", colleague_save),
        ("`.to_local()` gives this process's slice, half of each tensor: "
         "`.full_tensor()` all-gathers the whole one.", saving("to_local"))),
    error_hints=(("timed out", "only process 0 gathered: an all-gather waits for "
                  "every process, so gather in every process and write in one."),),
    describe="every entry a plain tensor of the full shape, equal to the model's.",
    correct="the file holds all {entries} tensors whole.")


@core.checker(CHECKPOINT)
def check_fixed_save(fixed_save):
    """``fixed_save(model, path)``: a full checkpoint of a sharded model."""


def run_colleague_save():
    """What the colleague's file holds: the symptom of exercise 6.3 (measured once)."""
    return core.cached_outcome(CHECKPOINT, 0, 0)
