"""Measure the planner's error (`make validate-planner`, lesson 07).

Each configuration is planned by ``helpers.planner.plan`` (formulas and a 3-layer copy
on fake tensors), then measured with lesson 1's meter:

- ``real``: the whole model, real tensors, on this CPU: a warm-up step, then one step
  (every micro-batch's forward and backward, the optimizer's step) measured;
- ``fake``: the whole model at its full depth on fake tensors (too big to train here):
  forward and backward measured, the optimizer step left out (its state needs real
  numbers); its state is the formula checked on the real rows;
- ``processes``: 2 real processes (DDP, ZeroRedundancyOptimizer, FSDP2 either way, via
  lesson 06's ``helpers.sharding.launch``; Local SGD with its own small loop): each
  process's peak and the bytes it sent, counted by lesson 03's collective counter.

It prints the table and writes it with the machine, versions and date to
``data/planner/validation.json`` (``--out``). ``--sample`` runs the tests' sample only.
"""
import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers import planner  # noqa: E402
from helpers.planner import Levers, Run  # noqa: E402

PARTS = ("weights", "gradients", "optimizer state", "activations",
         "autocast weight copies")
CPU = planner.Device(kind="cpu", memory_bytes=24 * 2**30)


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    run: Run
    levers: Levers
    how: str  # real, fake, processes

    @property
    def name(self):
        lv = self.levers
        parts = [self.model, f"b{self.run.batch}", f"s{self.run.seq}"]
        if self.run.accumulation > 1:
            parts.append(f"acc{self.run.accumulation}")
        if lv.checkpointing:
            parts.append("ckpt")
        parts.append(lv.precision)
        parts.append(lv.optimizer)
        if lv.devices > 1:
            parts.append(f"{lv.sharding}x{lv.devices}")
            if lv.local_sgd_every:
                parts.append(f"localsgd{lv.local_sgd_every}")
        return " ".join(parts)


def make_optimizer(model, levers):
    """The optimizer of ``levers`` (Transformers' Adafactor, as its Trainer makes
    it)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    if levers.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-4, foreach=False,
                                 fused=levers.optimizer_implementation == "fused")
    if levers.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9, foreach=False)
    if levers.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(parameters, lr=1e-4, scale_parameter=False,
                         relative_step=False)
    raise ValueError(f"{levers.optimizer} is not measured here (it needs a GPU)")


def _bytes_held(tensors):
    blocks = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        blocks[storage._cdata] = storage.nbytes()
    return sum(blocks.values())


def micro_batches(model, batch, run, levers, tracker=None):
    """Every micro-batch's forward and backward; with a tracker, (bytes the first one
    keeps for backward, autocast's weight copies among them)."""
    saved = copies = None
    for micro in range(run.accumulation):
        loss = planner.micro_batch_step(model, batch, run, levers, "cpu")
        if tracker is not None and micro == 0:
            alive = tracker.alive_ids() - {tracker.allocation_id(loss)}
            copies = tracker.alive_bytes(tracker.weight_copies & alive)
            saved = tracker.alive_bytes(alive) - copies
        loss.backward()
        del loss
    return saved, copies


def measure_real(case):
    """One measured step of the whole model on real tensors, after a warm-up step (it
    makes the optimizer's state), then one more that ``FlopCounterMode`` counts: the
    memory is measured without it (its module tracker keeps tensors alive, see
    ``planner.FlopCounter``)."""
    from torch.utils.flop_counter import FlopCounterMode

    from helpers.optimizer_state import optimizer_state_size

    run, levers = case.run, case.levers
    config = planner.load_config(case.model)
    torch.manual_seed(0)
    model = planner.build_model(config, attention=run.attention)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty unties them
    model.init_weights()  # Transformers' own initialisation, buffers included
    planner.prepare_model(model, levers, "cpu")
    optimizer = make_optimizer(model, levers)
    batch = planner.make_batch(config, run, "cpu")

    def step(tracker=None):
        saved, copies = micro_batches(model, batch, run, levers, tracker)
        gradients = _bytes_held([p.grad for p in model.parameters()
                                 if p.grad is not None])
        optimizer.step()
        return saved, copies, gradients

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()  # makes the optimizer's state
        optimizer.zero_grad(set_to_none=not run.keep_gradients)
        weights = _bytes_held(model.parameters())
        state = optimizer_state_size(optimizer)[1]
        kept = _bytes_held([p.grad for p in model.parameters() if p.grad is not None])
        tracker = planner.StepTracker({planner._key(p) for p in model.parameters()})
        with tracker:
            saved, copies, gradients = step(tracker)
        optimizer.zero_grad(set_to_none=not run.keep_gradients)
        # a third step, as the second, counted (the first step's count differs from
        # every later one's by up to 2.4 % with checkpointing, measured on llama-tiny)
        counter = FlopCounterMode(display=False)
        with counter:
            step()
    peak = weights + state + kept + tracker.peak_bytes
    parts = {"weights": weights, "gradients": gradients, "optimizer state": state,
             "activations": saved, "autocast weight copies": copies}
    return {"peak_bytes": peak, "parts": parts, "flops": counter.get_total_flops(),
            "sent_bytes": 0.0}


def measure_fake(case):
    """Forward and backward of the whole model, at its full depth, on fake tensors
    (built as the planner builds its copy: ``planner.fake_training``); the FLOPs by
    ``FlopCounterMode`` in a second step, the memory measured without it."""
    from torch.utils.flop_counter import FlopCounterMode

    run, levers = case.run, case.levers
    config = planner.load_config(case.model)

    with planner.fake_training(config, run, levers, "cpu") as (model, batch):
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        tracker = planner.StepTracker({planner._key(p) for p in model.parameters()})
        with tracker:
            saved, copies = micro_batches(model, batch, run, levers, tracker)
        gradients = sum(p.grad.numel() * p.grad.element_size()
                        for p in model.parameters() if p.grad is not None)
        for parameter in model.parameters():
            parameter.grad = None
        counter = FlopCounterMode(display=False)
        with counter:
            micro_batches(model, batch, run, levers)
    parts = {"weights": weights, "gradients": gradients, "activations": saved,
             "autocast weight copies": copies}
    return {"peak_bytes": weights + tracker.peak_bytes, "parts": parts,
            "flops": counter.get_total_flops(), "sent_bytes": 0.0,
            "phase": "forward and backward"}


STAGE_OF = {"ddp": "DDP", "zero1": "ZeroRedundancyOptimizer",
            "fsdp": "FSDP2, reshard_after_forward=False", "fsdp-reshard": "FSDP2"}
# DDP rebuilds its gradient buckets once, in the second step's forward
# (torch/nn/parallel/distributed.py, _pre_forward: reducer._rebuild_buckets(); "It may
# allocate new buckets before deallocating old buckets"): measured on distilbert-tiny
# with DDP, the second step's peak holds a second copy of the gradients (+499,976
# bytes) that the third and every later step does not. The plan is of a step in the
# steady state: the third step is measured.
PROCESS_STEPS = {"steps": 3, "measured_step": 3}


def processes_worker(accelerator, jobs, models):
    """Every 2-process configuration in one launch: lesson 06's ``train_stage`` for each
    sharding (a fresh copy of the model each), the Local SGD loop for the others."""
    import copy

    from helpers import sharding

    group = sharding.cpu_mesh().get_group()
    results = []
    for job in jobs:
        model = copy.deepcopy(models[job["size"]])
        if job["every"]:
            results.append(local_sgd_worker(accelerator, model, job["batch"],
                                            job["every"], 2 * job["every"]))
        else:
            results.append(sharding.train_stage(job["stage"], job["settings"], model,
                                                group))
    return results


def measure_processes_all(grid):
    """{case name: measurement} of every 2-process case of ``grid``, in one launch."""
    from helpers import sharding
    from helpers.launcher import run_in_processes
    from helpers.models import build_model

    chosen = [case for case in grid if case.how == "processes"]
    if not chosen:
        return {}
    sizes = {("tiny" if "tiny" in case.model else "base") for case in chosen}
    models = {size: build_model(size, initialise_once=True) for size in sizes}
    jobs = []
    for case in chosen:
        size = "tiny" if "tiny" in case.model else "base"
        config = planner.load_config(case.model)
        jobs.append({"size": size, "every": case.levers.local_sgd_every,
                     "batch": planner.make_batch(config, case.run, "cpu"),
                     "stage": STAGE_OF[case.levers.sharding],
                     "settings": {**sharding.SETTINGS, **PROCESS_STEPS,
                                  "micro_batch_size": case.run.batch,
                                  "sequence_length": case.run.seq}})
    results = run_in_processes(processes_worker, (jobs, models), preload=False)
    measured = {}
    for case, result in zip(chosen, results, strict=True):
        if case.levers.local_sgd_every:
            sent = sharding.ring_bytes(result["events"]) / result["steps"]
            measured[case.name] = {"peak_bytes": None, "sent_bytes": sent,
                                   "parts": {}, "flops": None}
            continue
        ranks = result["ranks"]
        rank = max(ranks, key=lambda r: r["peak_bytes"])
        rest = rank["rest_bytes"]
        measured[case.name] = {
            "peak_bytes": rank["peak_bytes"],
            "sent_bytes": sharding.ring_bytes([r["events"] for r in ranks]),
            "parts": {"weights": rest["weights"], "gradients": rest["gradients"],
                      "optimizer state": rest["optimizer state"]},
            "flops": None}
    return measured


def local_sgd_worker(accelerator, model, batch, every, steps):
    """Each process trains alone and averages the weights every ``every`` steps."""
    import torch.distributed as dist

    from helpers.collectives import CollectiveCounter

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    world = dist.get_world_size()
    with CollectiveCounter() as counter:
        for step in range(1, steps + 1):
            counter.step = step
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % every == 0:
                with torch.no_grad():
                    for parameter in model.parameters():
                        dist.all_reduce(parameter.data)
                        parameter.data /= world
    per_rank = [None] * world
    dist.all_gather_object(per_rank, counter.events)
    return {"events": per_rank, "steps": steps}


def cases():
    """The grid: families and sizes, batch, sequence, accumulation, checkpointing,
    precision, optimizer; real where it fits, fake beyond, 2 processes."""
    grid = []
    tiny = ("distilbert-tiny", "gpt2-tiny", "llama-tiny")
    for model in tiny:
        for (batch, seq), accumulation, checkpointing, precision, optimizer in [
                ((2, 32), 1, False, "float32", "adamw"),
                ((4, 64), 1, False, "float32", "adamw"),
                ((4, 64), 1, True, "float32", "adamw"),
                ((4, 64), 2, False, "float32", "adamw"),
                ((4, 64), 2, True, "bfloat16", "adamw"),
                ((4, 64), 1, False, "bfloat16", "adamw"),
                ((4, 64), 1, True, "bfloat16", "adamw"),
                ((4, 64), 1, False, "bfloat16-pure", "adamw"),
                ((4, 64), 1, False, "float32", "sgd"),
                ((4, 64), 1, False, "float32", "adafactor"),
                ((8, 128), 1, False, "float32", "adamw"),
                ((8, 128), 1, True, "bfloat16", "sgd"),
                ((2, 128), 3, False, "float32", "adafactor"),
                ((1, 16), 1, False, "float16", "adamw"),
                ((16, 32), 1, True, "float32", "adamw"),
                ((4, 64), 2, True, "float32", "adamw"),
                ((2, 32), 3, True, "bfloat16", "sgd"),
                ((4, 32), 2, True, "float16", "adafactor"),
        ]:
            grid.append(Case(model, Run(batch, seq, accumulation),
                             Levers(checkpointing, precision, optimizer), "real"))
    for (batch, seq), accumulation, checkpointing, precision, optimizer in [
            # 65 million parameters: each step costs seconds, so three of them; the
            # fake rows and the processes cover this model's other levers
            ((1, 32), 1, False, "float32", "adamw"),
            ((2, 64), 2, True, "bfloat16", "adamw"),
            ((2, 32), 1, False, "bfloat16-pure", "sgd"),
    ]:
        grid.append(Case("distilbert-base-cased", Run(batch, seq, accumulation),
                         Levers(checkpointing, precision, optimizer), "real"))
    fake_rows = [((1, 128), 1, False, "float32"),
                 ((2, 256), 1, True, "float32"),
                 ((2, 256), 1, False, "bfloat16"),
                 ((4, 512), 1, True, "bfloat16"),
                 ((1, 512), 2, False, "bfloat16-pure"),
                 ((4, 128), 1, False, "float16"),
                 ((2, 512), 1, True, "bfloat16-pure"),
                 ((1, 1024), 1, False, "float32")]
    # a fake step costs time per layer: every row for the shallow models, four (each
    # lever once) for those of 24 and 32 layers
    deep = [fake_rows[i] for i in (1, 3, 4, 5)]
    for model, rows in (("gpt2", fake_rows), ("distilbert-base-cased", fake_rows),
                        ("bert-large-uncased", deep), ("llama-2-7b", deep),
                        ("llama-3.1-8b", deep)):
        for (batch, seq), accumulation, checkpointing, precision in rows:
            if model.startswith("distilbert") or model.startswith("bert"):
                seq = min(seq, 512)
            grid.append(Case(model, Run(batch, seq, accumulation),
                             Levers(checkpointing, precision), "fake"))
    for model, (batch, seq) in [("distilbert-tiny", (2, 16)),
                                ("distilbert-tiny", (4, 64)),
                                ("distilbert-tiny", (8, 32)),
                                ("distilbert-base-cased", (2, 16))]:
        for sharding in ("ddp", "zero1", "fsdp", "fsdp-reshard"):
            grid.append(Case(model, Run(batch, seq, keep_gradients=True),
                             Levers(sharding=sharding, devices=2,
                                    optimizer_implementation="fused"), "processes"))
    for every in (1, 2, 4):
        grid.append(Case("distilbert-tiny", Run(2, 16),
                         Levers(sharding="ddp", devices=2, local_sgd_every=every),
                         "processes"))
    return grid


# the tests' sample: the rows of each tiny model's grid (its order in ``cases``) that
# together pull every lever, on real tensors, in seconds
# (20 rows: the accumulation with checkpointing in bfloat16, the dearest, once)
SAMPLE = {"distilbert-tiny": (0, 2, 3, 4, 5, 7, 8, 9, 12, 13),
          "gpt2-tiny": (1, 2, 6, 9),
          "llama-tiny": (1, 2, 3, 6, 8, 13)}


def sample():
    """The tests' sample: every lever and family, small enough for make test."""
    chosen = []
    for model, indices in SAMPLE.items():
        rows = [case for case in cases() if case.model == model and case.how == "real"]
        chosen += [rows[i] for i in indices]
    return chosen


def predicted(case):
    device = CPU
    result = planner.plan(case.model, case.run, case.levers, device)
    row = {"peak_bytes": result.peak_bytes, "parts": dict(result.parts),
           "flops": result.flops, "sent_bytes": result.sent_bytes}
    if case.how == "fake":
        # measured without the optimizer's step and state, which need real numbers:
        # the peak of every micro-batch's forward and backward
        row["peak_bytes"] = (max(v for k, v in result.phases.items()
                                 if k != "optimizer step")
                             - result.parts["optimizer state"])
    return row


MEASURE = {"real": measure_real, "fake": measure_fake}


# --- published runs (../shared/anchors/published_runs.md) ----------------------------

# Transformers' BERT-large runs on one V100 16 GB (its docs:
# docs/source/en/model_memory_anatomy.md and the v4.27 perf_train_gpu_one.md):
# Trainer, bert-large-uncased with 2 labels, 512
# tokens, eager attention (the only one then), dropout on, Transformers' own AdamW (a
# for-loop), zero_grad(set_to_none=True). "GPU memory occupied" read with NVML after
# training, in MiB: the CUDA context (1,343 MiB, measured in the same page) plus what
# PyTorch's caching allocator reserved. (name, batch, accumulation, checkpointing,
# precision, optimizer, MiB)
BERT_LARGE_V100 = [
    ("baseline", 4, 1, False, "float32", "adamw", 14949),
    ("accumulation", 1, 4, False, "float32", "adamw", 8681),
    ("accumulation + checkpointing", 1, 4, True, "float32", "adamw", 6775),
    ("mixed precision", 4, 1, False, "float16", "adamw", 13939),
    ("accumulation + checkpointing + fp16", 1, 4, True, "float16", "adamw", 7275),
    ("Adafactor", 4, 1, False, "float32", "adafactor", 12295),
    ("acc. + ckpt + fp16 + Adafactor", 1, 4, True, "float16", "adafactor", 4847),
    ("8-bit Adam", 4, 1, False, "float32", "adamw8bit", 13085),
    ("acc. + ckpt + fp16 + 8-bit Adam", 1, 4, True, "float16", "adamw8bit", 5363),
]
V100_CONTEXT_MIB = 1343
# The one overhead rule of every BERT-large row: the CUDA context the same page
# measured, plus what the caching allocator reserves beyond the live peak, replayed over
# two whole steps (planner.CachingAllocator, Device.allocator_replay); never fitted
# per row.
V100 = planner.Device(memory_bytes=16 * 2**30, context_bytes=V100_CONTEXT_MIB * 2**20,
                      kind="cuda", allocator_replay=True)

# torchtitan's Llama 3.1 8B runs on H100s (pytorch/torchtitan,
# benchmarks/llama3_h100_202412_torchtitan.md): FSDP2 (reshard_after_forward), local
# batch 2 x 8,192 tokens, selective activation checkpointing ("op" policy), AdamW,
# torchtitan's MixedPrecisionPolicy (bfloat16 gathered parameters, float32 shards and
# reduce). The figure is its memory monitor's peak of reserved memory (GiB, no CUDA
# context). (GPUs, setup, GiB)
LLAMA_8B_H100 = [(8, "FSDP", 82.4), (8, "FSDP + torch.compile", 77.0),
                 (128, "FSDP", 67.0), (128, "FSDP + torch.compile", 62.0)]
# The closest levers the planner has, and how each differs from torchtitan's run
TORCHTITAN_DIFFERS = ("planned eager (no torch.compile), the reserve as rounding "
                      "only (no allocator replay)")
H100 = planner.Device(memory_bytes=96 * 2**30, context_bytes=0, kind="cuda",
                      allocator_rounding=True)


def playbook_bytes(config, n_parameters, batch, seq, checkpointing, precision,
                   devices=1, selective=False):
    """The Ultra-Scale Playbook's count: 16 bytes per parameter (over ``devices`` with
    ZeRO-3), plus Korthikanti et al.'s activations per layer, s*b*h*(34 + 5*a*s/h)
    bytes in 16 bits (34*s*b*h with selective recomputation, 2*s*b*h with full),
    doubled for a float32 run."""
    layers, hidden, heads = (config.num_hidden_layers, config.hidden_size,
                             config.num_attention_heads)
    sbh = seq * batch * hidden
    if selective:
        per_layer = 34 * sbh
    elif checkpointing:
        per_layer = 2 * sbh
    else:
        per_layer = sbh * (34 + 5 * heads * seq / hidden)
    if precision == "float32":
        per_layer *= 2
    return 16 * n_parameters / devices + layers * per_layer


def accelerate_bytes(model, precision):
    """``accelerate estimate-memory``'s "Training using Adam" for this model: the
    largest of its parts (accelerate/commands/estimate.py), 16 bytes per parameter in
    float32 and 8 in mixed precision; no activations."""
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _ = calculate_maximum_sizes(model)
    usage = estimate_training_usage(total, "float32" if precision == "float32"
                                    else precision)
    return max(usage.values())


def _published_row(name, measured, result, playbook, accelerate, source, differs):
    return {"run": name, "measured_mib": round(measured / 2**20),
            "predicted_mib": round(result.total_bytes / 2**20),
            "live_peak_mib": round(result.peak_bytes / 2**20),
            "error": error(result.total_bytes, measured),
            "playbook_mib": round(playbook / 2**20),
            "playbook_error": error(playbook, measured),
            "accelerate_mib": round(accelerate / 2**20),
            "accelerate_error": error(accelerate, measured),
            "source": source, "levers_differ": differs}


def published():
    """Every published row: the planner (context + reserve rule), the Playbook's formula
    and accelerate's count, each plus the same measured context (none for
    torchtitan's, whose figure has none); accelerate's count divided by the GPUs for
    the sharded runs, as a learner would divide it."""
    config = planner.load_config("bert-large-uncased")
    meta = planner.build_model(config, attention="eager")
    n = planner.count_parameters(config)
    context = V100_CONTEXT_MIB * 2**20
    rows = []
    for name, batch, accumulation, checkpointing, precision, optimizer, mib in \
            BERT_LARGE_V100:
        run = Run(batch, 512, accumulation, attention="eager",
                  reentrant_checkpointing=True)
        levers = Levers(checkpointing, precision, optimizer)
        result = planner.plan(config, run, levers, V100)
        measured = mib * 2**20
        playbook = context + playbook_bytes(config, n, batch, 512, checkpointing,
                                            precision)
        accelerate = context + accelerate_bytes(meta, precision)
        rows.append(_published_row(name, measured, result, playbook, accelerate,
                                   "Transformers' docs, BERT-large on a V100", ""))
    config = planner.load_config("llama-3.1-8b")
    meta = planner.build_model(config)
    n = planner.count_parameters(config)
    run = Run(2, 8192)
    for gpus, setup, gib in LLAMA_8B_H100:
        levers = Levers(checkpointing=True, checkpointing_policy="selective-op",
                        precision="bfloat16-fsdp",
                        optimizer_implementation="foreach", sharding="fsdp-reshard",
                        devices=gpus)
        result = planner.plan(config, run, levers, H100)
        measured = gib * 2**30
        playbook = playbook_bytes(config, n, 2, 8192, True, "bfloat16", gpus,
                                  selective=True)
        accelerate = accelerate_bytes(meta, "bfloat16") / gpus
        differs = TORCHTITAN_DIFFERS
        if "compile" in setup:
            differs = differs.replace("eager (no torch.compile)", "eager (the run "
                                      "compiled)")
        rows.append(_published_row(
            f"Llama 3.1 8B, {gpus} H100, {setup}", measured, result, playbook,
            accelerate, "torchtitan's benchmarks, Llama 3.1 8B on H100s", differs))
    return rows


def error(prediction, measurement):
    if measurement is None or prediction is None:
        return None
    if measurement == 0:
        return 0.0 if prediction == 0 else math.inf
    return (prediction - measurement) / measurement


def make_row(case, measured=None, seconds=0.0):
    """The row of one case: predicted, measured (here unless given) and the errors."""
    started = time.perf_counter()
    guess = predicted(case)
    if measured is None:
        measured = MEASURE[case.how](case)
    row = {"case": case.name, "how": case.how,
           "predicted": guess, "measured": measured,
           "errors": {"peak": error(guess["peak_bytes"], measured["peak_bytes"]),
                      "flops": error(guess["flops"], measured["flops"]),
                      "sent_bytes_apart": (None if measured["sent_bytes"] is None
                                           else guess["sent_bytes"]
                                           - measured["sent_bytes"])},
           "seconds": round(time.perf_counter() - started + seconds, 3)}
    for part in PARTS:
        if part in measured["parts"] and measured["parts"][part] is not None:
            row["errors"][part] = error(guess["parts"][part], measured["parts"][part])
    return row


def _one_thread_worker():
    torch.set_num_threads(1)


def validate(grid, verbose=True, on_row=None, workers=None):
    """The rows of ``grid``: the 2-process cases in one launch, then the others in
    ``workers`` processes at once (one per core: each measures with one thread, and
    what is measured is bytes and FLOPs counted, never time)."""
    import multiprocessing
    import os

    rows = []

    def add(row):
        rows.append(row)
        if verbose:
            print(format_row(row), flush=True)
        if on_row is not None:
            on_row(rows)

    started = time.perf_counter()
    launched = measure_processes_all(grid)
    share = (time.perf_counter() - started) / max(len(launched), 1)
    for case in grid:
        if case.how == "processes":
            add(make_row(case, launched[case.name], share))
    alone = [case for case in grid if case.how != "processes"]
    workers = workers or min(len(os.sched_getaffinity(0)), 4)
    if workers == 1 or len(alone) < 2:
        for case in alone:
            add(make_row(case))
        return rows
    # forked processes (the cases travel with the fork, never pickled: the tests load
    # this file under another name); each sends back its rows, in any order
    context = multiprocessing.get_context("fork")
    queue = context.Queue()

    def work(share):
        _one_thread_worker()
        for index in share:
            try:
                queue.put((index, make_row(alone[index]), None))
            except Exception as failure:  # noqa: BLE001 - reported by the parent
                queue.put((index, None, f"{alone[index].name}: {failure!r}"))

    processes = [context.Process(target=work, args=(range(i, len(alone), workers),))
                 for i in range(workers)]
    for process in processes:
        process.start()
    done = {}
    try:
        for _ in alone:
            index, row, failure = queue.get(timeout=600)
            if failure:
                raise RuntimeError(f"a validation worker failed on {failure}")
            done[index] = row
            add(row)
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    first = len(rows) - len(alone)
    rows[first:] = [done[i] for i in range(len(alone))]  # the grid's order
    return rows


def _pct(value):
    return "     -" if value is None else f"{100 * value:+6.2f}%"


def format_row(row):
    e = row["errors"]
    peak = row["measured"]["peak_bytes"]
    return (f"{row['case'][:58]:<58} {row['how']:<9} "
            f"{'-' if peak is None else f'{peak / 2**20:10.1f}'} MiB "
            f"peak {_pct(e['peak'])} act {_pct(e.get('activations'))} "
            f"flops {_pct(e['flops'])} sent "
            f"{'-' if e['sent_bytes_apart'] is None else int(e['sent_bytes_apart'])}")


def summary(rows):
    """Count, median and largest absolute error per part."""
    table = {}
    for key in ("peak",) + PARTS + ("flops",):
        values = [abs(r["errors"][key]) for r in rows
                  if r["errors"].get(key) is not None]
        if values:
            table[key] = {"count": len(values), "median": statistics.median(values),
                          "max": max(values)}
    apart = [abs(r["errors"]["sent_bytes_apart"]) for r in rows
             if r["errors"]["sent_bytes_apart"] is not None and r["how"] == "processes"]
    table["sent bytes (processes)"] = {"count": len(apart),
                                       "max_bytes_apart": max(apart) if apart else None}
    return table


def environment():
    import transformers

    return {"machine": platform.machine(), "processor": platform.processor(),
            "system": platform.system(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": len(__import__("os").sched_getaffinity(0))}


def _print_published(anchors):
    print("\npublished runs (MiB: measured, planner, Playbook formula, accelerate):")
    for row in anchors:
        print(f"  {row['run']:<42} {row['measured_mib']:>6} "
              f"{row['predicted_mib']:>6} ({_pct(row['error'])}) "
              f"{row['playbook_mib']:>6} ({_pct(row['playbook_error'])}) "
              f"{row['accelerate_mib']:>6} ({_pct(row['accelerate_error'])})")
    differs = {row["levers_differ"] for row in anchors if row["levers_differ"]}
    for text in sorted(differs):
        print(f"  (torchtitan rows {text})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", action="store_true", help="the tests' sample only")
    parser.add_argument("--out", default=str(ROOT / "data" / "planner" /
                                             "validation.json"))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--published-only", action="store_true",
                        help="only the published runs, written to --published-out")
    parser.add_argument("--published-out", default=str(ROOT / "data" / "planner" /
                                                       "published.json"))
    parser.add_argument("--update-validation", action="store_true",
                        help="with --published-only: also replace the published "
                             "rows of --out (the live rows left as they are)")
    args = parser.parse_args(argv)
    if args.published_only:
        anchors = published()
        _print_published(anchors)
        if args.no_write:
            return 0
        target = Path(args.published_out)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"environment": environment(),
                                      "context_mib": V100_CONTEXT_MIB,
                                      "rows": anchors}, indent=1) + "\n")
        if args.update_validation:
            out = Path(args.out)
            stored = json.loads(out.read_text())
            stored["published"] = anchors
            out.write_text(json.dumps(stored, indent=1) + "\n")
        return 0
    torch.set_num_threads(1)
    started = time.perf_counter()
    grid = sample() if args.sample else cases()
    # two processes first, then real tensors, then fake ones
    grid.sort(key=lambda case: ("processes", "real", "fake").index(case.how))
    out = Path(args.out)

    def write(rows, anchors=(), done=False):
        if args.no_write:
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "environment": environment(), "complete": done,
            "configurations": len(grid), "measured": len(rows),
            "seconds": time.perf_counter() - started, "summary": summary(rows),
            "rows": rows, "published": list(anchors)}, indent=1) + "\n")

    rows = validate(grid, on_row=write)
    table = summary(rows)
    anchors = [] if args.sample else published()
    if anchors:
        _print_published(anchors)
    seconds = time.perf_counter() - started
    print(f"\n{len(rows)} configurations in {seconds:.0f} s")
    for key, values in table.items():
        print(f"  {key:>24}: " + ", ".join(
            f"{k} {v:.2%}" if isinstance(v, float) else f"{k} {v}"
            for k, v in values.items()))
    write(rows, anchors, done=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
