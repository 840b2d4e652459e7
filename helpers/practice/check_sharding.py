"""Practice 6's checks (lesson 06): ZeRO's formulas; 6.3, a sharded save on 2 ranks."""
import contextlib
import io
import os
import tempfile
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.serialization import add_safe_globals, clear_safe_globals, get_safe_globals

from helpers import launcher
from helpers.models import build_model
from helpers.practice import core
from helpers.sharding import cpu_mesh
from helpers.units import MiB

STAGES = {"DDP": (), "ZeRO-1": ("state",), "ZeRO-2": ("gradients", "state"),
          "ZeRO-3": ("weights", "gradients", "state")}  # stage -> what it divides by n
# bytes sent / DDP's, measured in lesson 6 and lab 6 (ZeRO-2: fully_shard, no reshard)
SENT = {"DDP": 1.0, "ZeRO-1": 1.5, "ZeRO-2": 1.0, "ZeRO-3": 1.5}
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
    label="{:,} parameters on {} processes", same=core.close(rel=1e-4), mistakes=(
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


def cheapest(parameters, n, gpu_bytes, activation_bytes, sent=SENT):
    """The stage that fits and sends the fewest bytes; of two, the one less split."""
    fitting = [stage for stage in STAGES  # least split first: min keeps the first
               if formula_bytes(stage, parameters, n) + activation_bytes <= gpu_bytes]
    return min(fitting, key=sent.get, default=None)


FITS = core.Exercise(
    "6.2", lambda answer, config: core.learner(answer, *config),
    name="cheapest_stage_that_fits", intended=cheapest,
    configs=((1.3e9, 8, 24e9, 2e9), (7e9, 8, 80e9, 10e9), (7e9, 8, 80e9, 20e9),
             (13e9, 8, 80e9, 10e9), (7e9, 64, 80e9, 20e9), (70e9, 8, 80e9, 10e9)),
    label="{:.3g} parameters on {} GPUs of {:.3g} bytes, {:.3g} of activations",
    mistakes=(  # ZeRO-3 fits wherever a stage does
        ("ZeRO-1 fits here, but as PyTorch runs it (ZeroRedundancyOptimizer) it sends "
         "1.5x DDP's bytes; ZeRO-2 (FSDP2 without resharding) sends 1.0x and keeps "
         "less, so it fits wherever ZeRO-1 does. Hint: rank by the bytes sent.",
         lambda *c: cheapest(*c, sent=dict.fromkeys(STAGES, 1))),
        ("ZeRO-3 always fits best, but it sends 1.5x DDP's bytes: return the stage "
         "that fits and sends the fewest.", lambda *c: cheapest(*c) and "ZeRO-3"),
        ("the activations need room too: add activation_bytes to each stage's bytes.",
         lambda p, n, gpu, act: cheapest(p, n, gpu, 0))),
    describe="return the stage that fits and sends the fewest bytes (DDP 1.0x, ZeRO-1 "
    "1.5x, ZeRO-2 1.0x, ZeRO-3 1.5x), of two the less split; None if none fits.",
    correct="1.3B parameters fit 24 GB with DDP; 7B on 8 GPUs of 80 GB with ZeRO-2, "
    "never ZeRO-1 (it sends more); 70B fit nowhere.")


@core.checker(FITS)
def check_cheapest_stage_that_fits(cheapest_stage_that_fits):
    """``cheapest_stage_that_fits(parameters, n, gpu_bytes, activation_bytes)``."""


def colleague_save(model, path):
    """Save a checkpoint that one process can load later; every process calls it."""
    if dist.get_rank() == 0:  # one file, written once
        torch.save(model.state_dict(), path)


def saving_worker(accelerator, saves, folder):
    """Each process, each save: the tiny DistilBERT sharded, saved; who wrote it."""
    mesh, torch_save = cpu_mesh(), torch.save  # gloo's group on any machine
    held, target, wrote = [], [], []

    def counted(obj, f, *args, **kwargs):  # a path, a file, or a writer of torch's own
        name = getattr(f, "name", f)
        wrote.append(isinstance(name, str | os.PathLike) and str(name) in target)
        return torch_save(obj, f, *args, **kwargs)

    for index, save in enumerate(saves):
        target[:], wrote[:] = [f"{folder}/{index}.pt"], []
        with mock.patch.object(torch, "save", counted):
            save(fully_shard(build_model("tiny", seed=0), mesh=mesh), target[0])
        writers = [None] * dist.get_world_size()
        dist.all_gather_object(writers, any(wrote))
        held.append(sum(writers))
    return held


def loaded_outside_group(path, full):
    """Outside the process group: torch.load's defaults, then an unsharded model."""
    if not os.path.isfile(path):
        return ("a folder, not one file (torch.distributed.checkpoint writes a file "
                "per process)") if os.path.exists(path) else "no file"
    added = get_safe_globals()
    clear_safe_globals()
    try:
        model = build_model("tiny", seed=1)  # other weights: the file's replace them
        model.load_state_dict(torch.load(path))
    except Exception as error:  # its first sentence, and what load_state_dict saw
        said = str(error).strip().splitlines()[1:2] * ("state_dict" in str(error))
        return ": ".join([core.describe_error(error).split(". ")[0].rstrip(":"),
                          *[line.strip().split(":")[0] for line in said]])
    finally:
        add_safe_globals(added)
    equal = sum(torch.equal(v, full[k]) for k, v in model.state_dict().items())
    return f"{equal} of {len(full)} tensors equal to the model's"


def _saved(save, config):  # the intended answer's launch weighs the mistakes too
    if save not in _held:
        mistakes = [w for _, w in CHECKPOINT.mistakes if save is CHECKPOINT.intended]
        weigh([save, *mistakes])
    return _held.pop(save)


def weigh(saves):
    """Run ``saves`` in one launch of 2 processes; keep each one's outcome for 6.3."""
    import transformers.models.distilbert.modeling_distilbert  # noqa: F401
    with tempfile.TemporaryDirectory() as folder:
        try:  # preload=False: the model's code above, once, is all the workers need
            with contextlib.redirect_stdout(io.StringIO()):  # "Launching training"
                writers = launcher.run_in_processes(
                    saving_worker, (saves, folder), timeout_s=90, preload=False,
                    collective_timeout_s=core.COLLECTIVE_TIMEOUT_S)
        except (launcher.WorkerFailedError, launcher.WorkerTimeoutError) as error:
            said = getattr(error, "worker_traceback", "")  # none: it hung, then stopped
            return _held.update(dict.fromkeys(saves, core.Raised(
                core.never_joined(said) if said else core.NEVER_JOINED)))
        full = build_model("tiny", seed=0).state_dict()
        _held.update({save: {WROTE: n,
                             LOADS: loaded_outside_group(f"{folder}/{i}.pt", full)}
                      for i, (save, n) in enumerate(zip(saves, writers))})  # as asked


def saving(method, writer=0):  # every process calls a method of each entry; 0 writes
    def save(model, path):
        state = {k: getattr(v, method)() for k, v in model.state_dict().items()}
        if dist.get_rank() == writer or writer is None:
            torch.save(state, path)
    return save


WROTE, LOADS = "processes that wrote it", "loaded with torch.load defaults"
CHECKPOINT = core.Exercise(
    "6.3", _saved, intended=saving("full_tensor"), name="fixed_save", mistakes=(
        ("the file holds DTensors, each process's slice, which `torch.load`'s defaults "
         "refuse outside the process group: gather each whole first "
         "(`.full_tensor()`, or `get_model_state_dict` with `full_state_dict=True`), "
         "in every process.", colleague_save),
        ("`.to_local()` gives this process's slice, half of each tensor, so the "
         "unsharded model refuses the file: `.full_tensor()` all-gathers the whole "
         "one.", saving("to_local")),
        ("both processes wrote the file, the same bytes twice, over each other: write "
         "it once. Hint: `if dist.get_rank() == 0:` around torch.save only.",
         saving("full_tensor", writer=None))),
    error_hints=(("never joined", "only process 0 gathered: an all-gather waits for "
                  "every process, so gather in every process and write in one."),),
    describe=lambda got, expected, config: "processes that wrote the file: "
    f"{got[WROTE]}; {LOADS}: {got[LOADS]}. Hint: one file, written by one process, "
    "that torch.load's defaults read outside the process group into the unsharded "
    "model.",
    correct=lambda got, config: (
        f"one process wrote the file; outside the process group, torch.load with "
        f"its defaults read it and the unsharded model took it: {got[LOADS]}."))


@core.checker(CHECKPOINT)
def check_fixed_save(fixed_save):
    """``fixed_save(model, path)``: a full checkpoint of a sharded model."""


def run_colleague_save():
    """What the colleague's file holds: the symptom of exercise 6.3 (measured once)."""
    return core.cached_outcome(CHECKPOINT, 0, 0)
