"""Checks for notebooks/practice/06_sharding_practice.ipynb (lesson 06), on the core:
6.1 and 6.2 against the ZeRO formulas lesson 06 measured to 1 part in 10^5; 6.3 runs
the learner's checkpoint in 2 real processes on the tiny DistilBERT sharded by FSDP2."""
import os
import tempfile

import torch
import torch.distributed as dist

from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes
from helpers.practice import core
from helpers.units import MiB

STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
SPLIT = {"DDP": (), "ZeRO-1": ("state",), "ZeRO-2": ("gradients", "state"),
         "ZeRO-3": ("weights", "gradients", "state")}
FLOAT32_ADAMW = {"weights": 4, "gradients": 4, "state": 8}  # bytes per parameter


def formula_bytes(stage, parameters, n, split=SPLIT, per_parameter=FLOAT32_ADAMW):
    """Bytes one of ``n`` processes holds between steps, float32 AdamW (lesson 06)."""
    return sum(b * parameters / (n if kind in split[stage] else 1)
               for kind, b in per_parameter.items())


# --- 6.1: bytes per process
def _per_stage(answer, config):
    parameters, n = config
    return {stage: core.as_number(core.learner(answer, stage, parameters, n),
                                  f"bytes_per_process({stage!r}, {parameters:,}, {n})")
            for stage in STAGES}


def _splitting(**split):  # a mistake: a stage that splits other parts
    return lambda stage, p, n: formula_bytes(stage, p, n, {**SPLIT, **split})

BYTES = core.Exercise(
    "6.1", _per_stage, intended=formula_bytes, name="bytes_per_process",
    configs=((65_783_042, 2), (7_000_000_000, 8), (1_200, 3)),
    same=core.close(rel=1e-4),
    mistakes=(
        ("ZeRO-2 splits the gradients and the optimizer state; every process still "
         "keeps all the weights. Splitting the weights too is ZeRO-3.",
         _splitting(**{"ZeRO-2": SPLIT["ZeRO-3"]})),
        ("ZeRO-1 splits only the optimizer state: the gradients stay whole, as DDP's "
         "all-reduce leaves them.", _splitting(**{"ZeRO-1": SPLIT["ZeRO-2"]})),
        ("AdamW keeps two float32 averages per parameter: 8 bytes of state, not 4 "
         "(lesson 4).", lambda stage, p, n: formula_bytes(
             stage, p, n, per_parameter={**FLOAT32_ADAMW, "state": 4})),
        ("a split divides by the number of processes, n, not by n - 1.",
         lambda stage, p, n: formula_bytes(stage, p, max(n - 1, 1))),
    ),
    describe=lambda got, expected, config: (
        f"for {config[0]:,} parameters on {config[1]} processes you gave {got}, not "
        f"{expected}. Hint: 4 + 4 + 8 bytes a parameter; divide what each splits."),
    correct=lambda got, config: (f"DistilBERT-base on 2: {got['DDP'] / MiB:,.1f} MiB "
                                 f"with DDP, {got['ZeRO-3'] / MiB:,.1f} with ZeRO-3."),
)


@core.checker(BYTES)
def check_bytes_per_process(bytes_per_process):
    """``bytes_per_process(stage, parameters, n)``: the bytes one of ``n`` processes
    holds between steps."""


# --- 6.2: the first stage that fits
def first_fitting(parameters, n, gpu_bytes, activation_bytes):
    """The first stage (the least split) whose bytes fit, else None."""
    return next((stage for stage in STAGES if formula_bytes(stage, parameters, n)
                 + activation_bytes <= gpu_bytes), None)


def _stage_of(answer, config):
    stage = core.learner(answer, *config)
    if stage not in (*STAGES, None):
        raise core.Wrong(f"first_stage_that_fits{config} returned {stage!r}; it should "
                         f"return one of {', '.join(map(repr, STAGES))}, or None.")
    return stage


FITS = core.Exercise(
    "6.2", _stage_of, intended=first_fitting, name="first_stage_that_fits",
    configs=((1.3e9, 8, 24e9, 2e9), (7e9, 8, 80e9, 10e9), (7e9, 8, 80e9, 20e9),
             (13e9, 8, 80e9, 10e9), (7e9, 64, 80e9, 20e9), (70e9, 8, 80e9, 10e9)),
    mistakes=(
        ("the most sharded stage always fits best, but it sends the most: ZeRO-3 "
         "sends 1.5x DDP's bytes. Return the *first* stage that fits.",
         lambda p, n, gpu, act: "ZeRO-3" if formula_bytes("ZeRO-3", p, n) + act <= gpu
         else None),
        ("the activations need room too: add activation_bytes to each stage's bytes.",
         lambda p, n, gpu, act: first_fitting(p, n, gpu, 0)),
        ("the splits divide by n, the number of processes: your answer did not change "
         "with n.", lambda p, n, gpu, act: first_fitting(p, 8, gpu, act)),
    ),
    describe=lambda got, expected, config: (
        f"for {config[0]:.3g} parameters on {config[1]} GPUs of {config[2]:.3g} bytes "
        f"with {config[3]:.3g} bytes of activations your answer was {got!r}, not "
        f"{expected!r}. Hint: exercise 6.1's bytes plus the activations, stage by "
        "stage, from DDP to ZeRO-3."),
    correct=lambda got, config: "1.3B parameters fit 24 GB with DDP; 70B fit nowhere.",
)


@core.checker(FITS)
def check_first_stage_that_fits(first_stage_that_fits):
    """``first_stage_that_fits(parameters, n, gpu_bytes, activation_bytes)``: the
    first stage, from DDP to ZeRO-3, that fits; else None."""


# --- 6.3: a full checkpoint of a sharded model
def colleague_save(model, path):
    """Save a checkpoint that one process can load later; every process calls it."""
    if dist.get_rank() == 0:  # one file, written once
        torch.save(model.state_dict(), path)


def saving_worker(accelerator, save, path):
    """Each process: the tiny DistilBERT sharded, then ``save``; process 0 weighs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from helpers.models import build_model

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build_model("tiny", seed=0)
    for layer in model.distilbert.transformer.layer:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    full = {name: value.full_tensor() for name, value in model.state_dict().items()}
    save(model, path)
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    saved = torch.load(path, weights_only=False) if os.path.exists(path) else {}
    whole = [name for name, value in saved.items() if name in full
             and type(value) is torch.Tensor and value.shape == full[name].shape
             and torch.equal(value, full[name])]
    return {"entries": len(saved), "whole and equal": len(whole),
            "DTensors": sum(hasattr(v, "to_local") for v in saved.values())}


def _saved(answer, config):
    with tempfile.TemporaryDirectory() as folder:
        try:
            # an all-gather that one process never joins (the usual mistake) fails
            # after a few seconds, not the launcher's minute
            return run_in_processes(saving_worker, (answer, f"{folder}/model.pt"),
                                    timeout_s=90, collective_timeout_s=6)
        except WorkerTimeoutError:
            return core.Raised("WorkerTimeoutError: the processes never finished")
        except WorkerFailedError as error:
            last = error.worker_traceback.strip().splitlines()[-1]
            # gloo's words for a collective a peer never joined: the waiting process
            # times out, or its peer sees the connection close as the other exits
            waited = any(text in error.worker_traceback for text in
                         ("Timed out", "by peer", "pair closure"))
            return core.Raised("RuntimeError: a collective timed out: a process never "
                               "joined it" if waited else last)


def gathered_save(model, path):
    """Every process joins each all-gather; process 0 writes."""
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
    error_hints=tuple((text, "only process 0 gathered: an all-gather waits for every "
                       "process, so gather in every process and write in one.")
                           for text in ("never finished", "timed out")),
    describe=lambda got, expected, config: (
        f"the file held {got}; a full checkpoint holds {expected}. Hint: every entry "
        "a plain tensor of the full shape, equal to the model's weights."),
    correct=lambda got, config: f"the file holds all {got['entries']} tensors whole.",
)


@core.checker(CHECKPOINT)
def check_fixed_save(fixed_save):
    """``fixed_save(model, path)``: a full checkpoint of a sharded model, called by
    every process."""


def run_colleague_save():
    """What the colleague's file holds: the symptom of exercise 6.3 (measured once)."""
    return core.cached_outcome(CHECKPOINT, 0, 0)
