"""Practice 7's checks (lesson 07, plan a run): answers judged by the planner
(``helpers.planner.plan``) and by a measured forward pass."""
import functools

import torch

from helpers import planner
from helpers.planner import Device, Levers, Run
from helpers.practice import core

# 7.1 and 7.3: Llama 2 7B on 8 GPUs of 80 GB (the lesson's plan)
MODEL, GPUS = "llama-2-7b", 8
GPU = Device(memory_bytes=80e9)
FIT_RUN = Run(batch=1, seq=2048)
KEEPS_RESULT = "keeps the training's result"  # AdamW, and no bfloat16 end to end
SHARDS = "shards the training state"  # anything but DDP


def _quiet_transformers():
    from transformers.utils import logging

    logging.set_verbosity_error()  # the configs' own notes would break the verdict


# --- 7.1: levers that make a run fit ----------------------------------------------

def measure_levers(answer, config):
    """Whether the planner finds the answer's levers fit, and keep the result."""
    levers = core.learner(answer) if callable(answer) else answer
    if not isinstance(levers, Levers):
        raise core.Wrong(f"levers should be a Levers(...) from helpers.planner; it is "
                         f"{core.short_repr(levers)}.")
    if levers.devices != GPUS:
        raise core.Wrong(f"the run has {GPUS} GPUs: Levers(devices={GPUS}, ...); yours "
                         f"has devices={levers.devices}.")
    _quiet_transformers()
    result = planner.plan(MODEL, FIT_RUN, levers, GPU)
    keeps = levers.optimizer == "adamw" and levers.precision != "bfloat16-pure"
    return {"fits": result.fits, KEEPS_RESULT: keeps, SHARDS: levers.sharding != "ddp"}


def describe_levers(got, expected, config):
    if not got["fits"]:
        return ("the planner says it does not fit 80 GB. Hint: plan it and read the "
                "parts: which one is whole on every GPU?")
    return ("it fits, but it changes the optimizer or the weights' precision. Hint: "
            "keep AdamW and float32 weights; pull a lever that costs only time or "
            "communication.")


FIT = core.Exercise(
    "7.1", measure_levers, Levers(devices=GPUS, sharding="fsdp-reshard"),
    name="levers", describe=describe_levers, mistakes=[
        ("with DDP every GPU keeps the whole weights, gradients and AdamW state: 16 "
         "bytes per parameter, more than 80 GB for 7 billion. Neither checkpointing "
         "nor autocast shrinks them (autocast adds bfloat16 copies): shard them "
         "(lesson 6).", Levers(precision="bfloat16", devices=GPUS, sharding="ddp"))],
    correct=lambda got, config: (
        f"the planner says it fits {GPU.memory_bytes / 1e9:.0f} GB per GPU and "
        "keeps AdamW in float32: sharding costs communication, not accuracy."))


@core.checker(FIT)
def check_levers_that_fit(levers):
    """``levers``: a Levers(...) on 8 GPUs that fits Llama 2 7B's run and keeps the
    result."""


# --- 7.2: predict a part, then measure it --------------------------------------------

COPY_MODELS = ("distilbert-tiny", "llama-tiny", "gpt2-tiny")
COPY_RUN = Run(batch=2, seq=16)


def build(name):
    """A tiny model of ``data/models/``, real weights, on the CPU."""
    _quiet_transformers()
    torch.manual_seed(0)
    return planner.build_model(planner.load_config(name), device="cpu").train()


def measured_copies(name):
    """The bytes of the weight copies bfloat16 autocast keeps alive after one
    forward pass on the CPU, counted by lesson 1's meter."""
    model = build(name)
    batch = planner.make_batch(model.config, COPY_RUN, "cpu")
    tracker = planner.StepTracker({planner._key(p) for p in model.parameters()})
    with tracker, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    alive = tracker.alive_ids() - {tracker.allocation_id(loss)}
    return tracker.alive_bytes(tracker.weight_copies & alive)


def predicted_copies(answer, name):
    """The answer's prediction for one model."""
    return core.as_number(core.learner(answer, build(name)),
                          "autocast_copy_bytes's answer", whole=True)


def _matmul_modules(model):
    from transformers.pytorch_utils import Conv1D

    return [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D))]


def intended_copies(model):
    """Every weight of a matrix multiply (Linear, and GPT-2's Conv1D), in bfloat16."""
    return sum(m.weight.numel() * 2 for m in _matmul_modules(model))


def _measured(answer, name):  # the Exercise's measure: the meter, not the formula
    if answer is intended_copies:
        return measured_copies(name)
    return predicted_copies(answer, name)


COPIES = core.Exercise(
    "7.2", _measured, intended_copies, configs=COPY_MODELS,
    label="the model {}", name="autocast_copy_bytes", mistakes=[
        ("autocast casts the inputs of matrix multiplies only: the embeddings and the "
         "LayerNorms stay float32 (lesson 5).",
         lambda model: sum(p.numel() * 2 for p in model.parameters())),
        ("the copies are bfloat16: 2 bytes per element, not 4.",
         lambda model: sum(m.weight.numel() * 4 for m in _matmul_modules(model))),
        ("count the weights only: the meter finds no copy of a bias kept alive.",
         lambda model: sum(m.weight.numel() * 2 + (m.bias.numel() * 2
                                                   if m.bias is not None else 0)
                           for m in _matmul_modules(model))),
        ("GPT-2's layers are not nn.Linear but transformers' Conv1D "
         "(transformers.pytorch_utils): a matrix multiply too (addmm), and autocast "
         "copies its weight as well.",
         lambda model: sum(m.weight.numel() * 2 for m in model.modules()
                           if isinstance(m, torch.nn.Linear)))],
    describe="which operations does autocast run in bfloat16, and which of their "
    "inputs are weights?",
    same=core.close(rel=0, abs_=0.5),  # whole bytes; the nearest mistake is far off
    correct=lambda got, name: (
        f"the meter counted {got:,} bytes of bfloat16 weight copies kept for backward "
        f"on {name}, as you predicted, and on {len(COPY_MODELS) - 1} other models: "
        "2 bytes per weight of every matrix multiply, kept until backward."))


@core.checker(COPIES)
def check_autocast_copies(autocast_copy_bytes):
    """``autocast_copy_bytes(model)``: the bytes of bfloat16 weight copies autocast
    keeps during one forward pass."""


# --- 7.3: the wrong assumption in a colleague's plan ---------------------------------

PLAN_RUN = Run(batch=2, seq=4096)
PLAN_LEVERS = Levers(precision="bfloat16", devices=GPUS, sharding="fsdp-reshard")
PER_PARAMETER = ("weights", "gradients", "optimizer state")
FITS = "fits"


@functools.cache  # one plan, read by the intended answer and every mistake
def planned():
    """The planner's plan of the colleague's run."""
    _quiet_transformers()
    return planner.plan(MODEL, PLAN_RUN, PLAN_LEVERS, GPU)


def intended_plan():
    """The intended answer: the parts per parameter (before sharding), the
    activations per GPU, and the verdict, as the planner gives them."""
    result = planned()
    per = {part: result.parts[part] * GPUS / result.parameters
           for part in PER_PARAMETER}
    return {**per, "activations": result.parts["activations"], FITS: result.fits}


def measure_plan(answer, config):
    fixed = core.learner(answer) if callable(answer) else answer
    keys = (*PER_PARAMETER, "activations", FITS)
    if not (isinstance(fixed, dict) and set(keys) <= set(fixed)):
        raise core.Wrong(f"fixed_plan should be a dict with {core.listed(keys)}; it is "
                         f"{core.short_repr(fixed)}.")
    if "bool" not in str(getattr(fixed[FITS], "dtype", type(fixed[FITS]))):
        raise core.Wrong(f"fixed_plan[{FITS!r}] is {fixed[FITS]!r}: give True or "
                         "False.")
    numbers = {key: core.as_number(fixed[key], f"fixed_plan[{key!r}]")
               for key in keys[:-1]}
    return {**numbers, FITS: bool(fixed[FITS])}


def colleague(per_parameter=(2, 2, 4), activations=None, fits=None):
    """A plan as a learner fixes it: bytes per parameter, the planner's activations
    unless given, the planner's verdict unless given."""
    def fixed():
        result = planned()
        plan = dict(zip(PER_PARAMETER, per_parameter))
        plan["activations"] = (result.parts["activations"] if activations is None
                               else activations)
        plan[FITS] = result.fits if fits is None else fits
        return plan
    return fixed


COLLEAGUE_PLAN = core.Exercise(
    "7.3", measure_plan, intended_plan, name="fixed_plan", mistakes=[
        ("8 bytes per parameter is what `accelerate estimate-memory` prints for "
         "mixed-precision Adam (the largest of its parts, the optimizer state); the "
         "split 2 + 2 + 4 is the colleague's. A PyTorch autocast step keeps float32 "
         "weights, float32 gradients and float32 AdamW state (lesson 5).", colleague()),
        ("2 + 2 + 12 is the Playbook's layout, bfloat16 weights beside float32 master "
         "weights. Autocast keeps only float32 weights, and makes its bfloat16 copies "
         "during the step (lesson 5).", colleague((2, 2, 12))),
        ("the colleague's second wrong assumption is still there: the activations are "
         "not 0. Plan the run (plan(...).parts['activations']).",
         colleague((4, 4, 8), activations=0, fits=True)),
        ("with the activations counted, it does not fit: read the planner's verdict "
         "(plan(...).fits).", colleague((4, 4, 8), fits=True))],
    describe="compare each part with the planner's plan of the colleague's run.",
    same=core.close(rel=0.01),  # FSDP2's padding: a few bytes per million over 4, 4, 8
    correct=lambda got, config: (
        f"{got['weights']:.0f} + {got['gradients']:.0f} + "
        f"{got['optimizer state']:.0f} bytes per parameter, and "
        f"{got['activations'] / 1e9:.0f} GB of activations per GPU: the run does "
        f"{'' if got[FITS] else 'NOT '}fit 80 GB. The colleague counted 8 bytes "
        "per parameter (accelerate's figure) and no activations."))


@core.checker(COLLEAGUE_PLAN)
def check_colleague_plan(fixed_plan):
    """``fixed_plan``: the colleague's plan, corrected: {weights, gradients, optimizer
    state (bytes per parameter), activations (bytes per GPU), fits}."""
