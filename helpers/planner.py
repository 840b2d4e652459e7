"""Plan a training run before running it: per-device peak memory with its parts, bytes
sent per step and FLOPs per step, for any combination of the course's levers
(lesson 07).

``plan(model, run, levers, device)`` never trains the configuration. It lays the model
out on PyTorch's meta device (parameters counted exactly, no memory), and runs a copy
with three layers, at the real shapes, one forward and backward on fake tensors
(``helpers.mixed_precision.on_fake_tensors``: shapes and dtypes, no arithmetic) under
lesson 1's meter (``helpers.memory.LiveTensorTracker``) and PyTorch's
``FlopCounterMode``. Hooks cut that run into segments: what comes before the layers,
each layer's forward, the head and loss, each layer's backward, what comes after. The
middle layer's segments, repeated, give the memory timeline of the real depth, and its
peak; the rest is formulas:

- weights, gradients and optimizer state: bytes per parameter tensor, from its shape
  and dtype (lesson 04), sharded as DDP, ``ZeroRedundancyOptimizer`` or FSDP2 shard
  them (lesson 06, padding included);
- the optimizer step's scratch memory, read from each optimizer's source;
- bytes sent: ring collectives (lessons 03 and 06).

``python -m helpers.planner --model data/models/<name> ...`` prints a plan, its verdict
and the cheapest lever combinations that fit (``--help``). Its error is measured by
``tools/validate_planner.py``.
"""
import argparse
import bisect
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import pickle
import sys
import time
import warnings
from pathlib import Path

import torch

from helpers.memory import LiveTensorTracker
from helpers.paths import DATA_DIR
from helpers.units import GiB, MiB

# "bfloat16-fsdp": FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16,
# reduce_dtype=float32), torchtitan's default: float32 shards, gradients and optimizer
# state; whole bfloat16 weights gathered; forward and backward in bfloat16, no autocast
PRECISIONS = ("float32", "bfloat16", "float16", "bfloat16-pure", "bfloat16-fsdp")
# the precisions whose model runs in bfloat16 throughout
BFLOAT16_MODEL = ("bfloat16-pure", "bfloat16-fsdp")
PRECISION_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
                     "bf16-pure": "bfloat16-pure", "bf16-fsdp": "bfloat16-fsdp",
                     "no": "float32"}
# the dtype each precision's matrix multiplications run in, which sets their peak: a
# float32 run's are IEEE float32, PyTorch's default (get_float32_matmul_precision()
# is "highest", torch.backends.cuda.matmul.allow_tf32 False, unless a run sets them)
COMPUTE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
                  "bfloat16-pure": "bfloat16", "bfloat16-fsdp": "bfloat16"}
# Published dense peaks, FLOP/s, per compute dtype (NVIDIA A100 datasheet; "float32" is
# FP32, not TF32's 156 TFLOP/s): the command's default device
A100_PEAK_FLOPS = {"float32": 19.5e12, "bfloat16": 312e12, "float16": 312e12}
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw8bit")
SHARDINGS = ("none", "ddp", "zero1", "fsdp", "fsdp-reshard")
OPTIMIZER_IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
# what checkpointing keeps of each layer: nothing but its input (every op recomputed),
# or torchtitan's selective "op" policy (torchtitan/models/llama/parallelize_llama.py,
# December 2024): the outputs of every other matmul and of attention are kept
CHECKPOINTING_POLICIES = ("every-op", "selective-op")
# Which Transformers class trains each family: a classifier head (2 labels, as the
# course's DistilBERT and Transformers' BERT-large runs) or a causal language model.
CLASSIFIERS = ("distilbert", "bert")
NUM_LABELS = 2
# The layer stack of each family, and the group FSDP2 wraps one by one.
LAYER_PATHS = {"distilbert": "distilbert.transformer.layer",
               "bert": "bert.encoder.layer", "gpt2": "transformer.h",
               "llama": "model.layers"}
# The copy the fake run measures: its first layer, a middle one repeated, its last.
MEASURED_LAYERS = 3


@dataclasses.dataclass(frozen=True)
class Run:
    """One training step: ``batch`` sequences of ``seq`` tokens per device and
    micro-batch, ``accumulation`` micro-batches per optimizer step."""
    batch: int = 1
    seq: int = 128
    accumulation: int = 1
    # Transformers' attention: "sdpa" (its default) or "eager" (the only one before
    # 4.36, that of Transformers' published BERT-large runs)
    attention: str = "sdpa"
    # zero_grad(set_to_none=False) between steps (lesson 06's loop, and DDP's buckets
    # keep them anyway) instead of PyTorch's default, set_to_none=True
    keep_gradients: bool = False
    # checkpointing's implementation: non-reentrant (PyTorch's recommendation, the
    # course's) or reentrant (torch.utils.checkpoint's default until 2.4, that of
    # Transformers' published runs)
    reentrant_checkpointing: bool = False
    # autocast's weight cache (torch.autocast's cache_enabled, on by default): the
    # 16-bit copy autocast makes of a float32 weight (a leaf that requires grad) is
    # kept until the outermost autocast exits, at forward's end (lessons 05 and 07)
    autocast_cache: bool = True

    def __post_init__(self):
        for name in ("batch", "seq", "accumulation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.attention not in ("sdpa", "eager"):
            raise ValueError(f"attention must be 'sdpa' or 'eager', got "
                             f"{self.attention!r}")


@dataclasses.dataclass(frozen=True)
class Levers:
    """The course's levers (lessons 01 to 06)."""
    checkpointing: bool = False  # every layer (lessons 01 and 02)
    precision: str = "float32"  # PRECISIONS (lesson 05)
    optimizer: str = "adamw"  # OPTIMIZERS (lesson 04)
    # for-loop (PyTorch's default on a CPU, Transformers' own AdamW), foreach
    # (PyTorch's default on a GPU) or fused; it sets the optimizer step's scratch memory
    optimizer_implementation: str = "for-loop"
    sharding: str = "none"  # SHARDINGS (lessons 03 and 06)
    devices: int = 1
    # Local SGD (lesson 03): average the weights every k steps instead of all-reducing
    # gradients each step; None: off
    local_sgd_every: int | None = None
    # with checkpointing: CHECKPOINTING_POLICIES
    checkpointing_policy: str = "every-op"

    def __post_init__(self):
        precision = PRECISION_ALIASES.get(self.precision, self.precision)
        object.__setattr__(self, "precision", precision)
        choices = {"precision": PRECISIONS, "optimizer": OPTIMIZERS,
                   "sharding": SHARDINGS,
                   "optimizer_implementation": OPTIMIZER_IMPLEMENTATIONS,
                   "checkpointing_policy": CHECKPOINTING_POLICIES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: "
                                 f"{', '.join(valid)}")
        if not isinstance(self.checkpointing, bool):
            raise ValueError(f"checkpointing must be True or False, got "
                             f"{self.checkpointing!r}")
        if (isinstance(self.devices, bool) or not isinstance(self.devices, int)
                or self.devices < 1):
            raise ValueError("devices must be a whole number >= 1, got "
                             f"{self.devices!r}")
        if precision == "bfloat16-fsdp" and not self.sharding.startswith("fsdp"):
            raise ValueError("bfloat16-fsdp is FSDP2's mixed precision policy: use it "
                             "with sharding='fsdp' or 'fsdp-reshard'")
        if self.devices > 1 and self.sharding == "none":
            raise ValueError(f"{self.devices} devices need a sharding: one of "
                             f"{', '.join(SHARDINGS[1:])}")
        if self.local_sgd_every is not None:
            if (isinstance(self.local_sgd_every, bool)
                    or not isinstance(self.local_sgd_every, int)
                    or self.local_sgd_every < 1):
                raise ValueError("local_sgd_every must be a whole number of steps >= 1 "
                                 f"or None, got {self.local_sgd_every!r}")
            if self.sharding != "ddp":
                raise ValueError("Local SGD averages whole models: use it with "
                                 "sharding='ddp' (each device keeps everything)")


@dataclasses.dataclass(frozen=True)
class Device:
    """What one device offers, all stated inputs: its memory, the memory the runtime
    takes before any tensor (the CUDA context), its link and its peak throughput."""
    memory_bytes: float = 80 * 10**9
    context_bytes: float = 0
    link_bytes_per_s: float = 100 * 10**9
    # FLOP/s: one number for every precision (default: an A100's bfloat16 peak), or a
    # peak per compute dtype (COMPUTE_DTYPES' values), e.g. A100_PEAK_FLOPS; a dict is
    # left out of the hash
    peak_flops: float | dict = dataclasses.field(default=312 * 10**12, hash=False)
    # the device type the fake run uses: autocast's rules and attention kernels differ
    # between 'cpu' and 'cuda'
    kind: str = "cuda"
    # model the caching allocator's rounding (CUDA: blocks of 512 bytes, large ones
    # in 2 MiB steps) on top of the live tensors
    allocator_rounding: bool = False
    # replay two whole steps' allocations (fake tensors, full depth) through a model of
    # the CUDA caching allocator (``CachingAllocator``), and add what it reserves
    # beyond the live peak: the published runs' rule (a fake run of the whole model:
    # seconds for BERT-large, too slow for the largest models)
    allocator_replay: bool = False

    def __post_init__(self):
        if self.kind not in ("cpu", "cuda"):
            raise ValueError(f"kind must be 'cpu' or 'cuda', got {self.kind!r}")
        peaks = self.peak_flops
        if isinstance(peaks, dict):
            dtypes = sorted(set(COMPUTE_DTYPES.values()))
            if not peaks or set(peaks) - set(dtypes):
                raise ValueError(f"peak_flops as a dict maps compute dtypes ("
                                 f"{', '.join(dtypes)}) to FLOP/s, e.g. "
                                 f"{{'float32': 19.5e12, 'bfloat16': 312e12}}; got "
                                 f"{peaks!r}")
            object.__setattr__(self, "peak_flops", dict(peaks))  # the caller's copy
        values = {name: getattr(self, name)
                  for name in ("memory_bytes", "context_bytes", "link_bytes_per_s")}
        if isinstance(peaks, dict):
            values.update({f"peak_flops[{k!r}]": v for k, v in peaks.items()})
        else:
            values["peak_flops"] = peaks
        for name, value in values.items():
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or value < 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def peak_for(self, precision):
        """The peak FLOP/s of ``precision``'s matmuls (their dtype: COMPUTE_DTYPES)."""
        precision = PRECISION_ALIASES.get(precision, precision)
        if precision not in COMPUTE_DTYPES:
            raise ValueError(f"unknown precision {precision!r}; valid: "
                             f"{', '.join(PRECISIONS)}")
        if not isinstance(self.peak_flops, dict):
            return self.peak_flops
        dtype = COMPUTE_DTYPES[precision]
        if dtype not in self.peak_flops:
            raise ValueError(f"this Device states no peak for {dtype} (the matmuls of "
                             f"precision {precision!r}): add it to peak_flops, e.g. "
                             f"peak_flops={{..., {dtype!r}: 312e12}}")
        return self.peak_flops[dtype]


@dataclasses.dataclass
class Plan:
    """What one device holds and does in one optimizer step."""
    parts: dict  # bytes: weights, gradients, optimizer state, activations, ...
    peak_bytes: int  # live tensors at the step's peak
    reserved_bytes: int  # with the allocator's rounding, if modelled; else peak_bytes
    total_bytes: int  # reserved_bytes + the device's context
    fits: bool
    sent_bytes: float  # per device per step, over a ring
    link_seconds: float
    flops: int  # per device per step, FlopCounterMode's count
    compute_seconds: float
    parameters: int
    levers: Levers
    run: Run
    device: Device
    peak_phase: str  # where the step peaks
    phases: dict  # live bytes at the peak of each phase of the step

    def as_dict(self):
        return {"parts": self.parts, "peak_bytes": self.peak_bytes,
                "reserved_bytes": self.reserved_bytes, "total_bytes": self.total_bytes,
                "fits": self.fits, "sent_bytes": self.sent_bytes,
                "link_seconds": self.link_seconds, "flops": self.flops,
                "compute_seconds": self.compute_seconds, "parameters": self.parameters,
                "peak_phase": self.peak_phase, "phases": self.phases}


# --- the model, laid out without memory -------------------------------------------

def _config_folder(model):
    folder = Path(model)
    if not folder.is_dir() and not folder.is_absolute():
        candidate = DATA_DIR / "models" / str(model)
        if candidate.is_dir():
            folder = candidate
    if not (folder / "config.json").exists():
        known = sorted(p.name for p in (DATA_DIR / "models").iterdir() if p.is_dir())
        raise FileNotFoundError(
            f"no config.json in {str(model)!r}; pass a folder holding a Transformers "
            f"configuration, e.g. data/models/<name> with <name> one of: "
            f"{', '.join(known)} (python data/make_data.py remakes them)")
    return folder


def load_config(model, **overrides):
    """A Transformers configuration from a folder (or a name in data/models), or the
    configuration given."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        config = model.__class__.from_dict(model.to_dict())
    else:
        config = AutoConfig.from_pretrained(_config_folder(model))
    if config.model_type not in LAYER_PATHS:
        raise ValueError(f"model type {config.model_type!r} is not planned; planned "
                         f"families: {', '.join(LAYER_PATHS)}")
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _layer_count_key(config):
    return {"distilbert": "n_layers", "gpt2": "n_layer"}.get(config.model_type,
                                                             "num_hidden_layers")


def build_model(config, device="meta", attention="sdpa", layers=None):
    """The model of ``config`` (a classifier for DistilBERT and BERT, a causal LM
    otherwise) on ``device``, with ``layers`` layers if given; on 'meta' it has shapes
    only."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = load_config(config)
    if layers is not None:
        setattr(config, _layer_count_key(config), layers)
    config._attn_implementation = attention
    if config.model_type in CLASSIFIERS:
        config.num_labels = NUM_LABELS
        cls = AutoModelForSequenceClassification
    else:
        cls = AutoModelForCausalLM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device):
            return cls.from_config(config, attn_implementation=attention)


def layer_stack(model):
    """The ``nn.ModuleList`` of the model's layers."""
    module = model
    for name in LAYER_PATHS[model.config.model_type].split("."):
        module = getattr(module, name)
    return module


@dataclasses.dataclass(frozen=True)
class ParameterTable:
    """Shapes of the model's parameters, by FSDP2 group (one per layer, then the rest),
    and its buffers' bytes."""
    # (shapes of layer 0, ..., shapes of the rest), each a tuple of shapes
    groups: tuple
    buffer_bytes: int  # float32/int buffers, as DDP broadcasts them each forward
    layers: int

    @property
    def shapes(self):
        return [s for group in self.groups for s in group]

    @property
    def count(self):
        return sum(math.prod(s) for s in self.shapes)


# Where plans keep what they measured (parameter tables and fake runs), by content:
# a configuration planned once is planned again without importing its model's code or
# running anything (a 70B command: about 10 s of CPU time the first time). Set
# PLANNER_CACHE to another folder, or to "off".
CACHE_DIR = os.environ.get("PLANNER_CACHE",
                           str(Path.home() / ".cache" / "efficient-training-planner"))


@functools.lru_cache(maxsize=1)
def _cache_version():
    """What a cached measurement depends on besides its inputs: this file's code and
    the versions of torch and Transformers."""
    import transformers

    source = Path(__file__).read_bytes()
    return [hashlib.sha256(source).hexdigest(), torch.__version__,
            transformers.__version__]


def _disk_cached(kind, key, compute):
    """``compute()``, or its result stored earlier under ``key`` in ``CACHE_DIR``."""
    if CACHE_DIR == "off":
        return compute()
    digest = hashlib.sha256(json.dumps([kind, key, _cache_version()],
                                       default=str).encode()).hexdigest()
    path = Path(CACHE_DIR) / f"{kind}-{digest[:32]}.pickle"
    with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError,
                             AttributeError):
        return pickle.loads(path.read_bytes())
    value = compute()
    with contextlib.suppress(OSError):  # a cache that cannot be written: no cache
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(pickle.dumps(value))
        os.replace(partial, path)  # whole or not at all, for processes side by side
    return value


@functools.lru_cache(maxsize=32)
def _parameter_table(config_json, attention):
    return _disk_cached("table", [config_json, attention],
                        lambda: _measure_parameter_table(config_json, attention))


def _measure_parameter_table(config_json, attention):
    from transformers import AutoConfig

    config = AutoConfig.for_model(**json.loads(config_json))
    depth = getattr(config, _layer_count_key(config))
    # The layers of each family are alike: a copy with one layer and one with two give
    # the shapes and buffers of any depth, where laying out all 80 layers of a 70B
    # configuration took 3 s of CPU time
    shallow = [build_model(config, attention=attention, layers=n)
               for n in (1, min(depth, 2))]
    model = shallow[0]
    layers = layer_stack(model)
    in_layers = {id(p) for p in layers.parameters()}
    layer = tuple(tuple(p.shape) for p in layers[0].parameters())
    rest = tuple(tuple(p.shape) for p in model.parameters() if id(p) not in in_layers)

    def buffers(m):
        return sum(b.numel() * b.element_size() for b in m.buffers())

    per_layer = buffers(shallow[1]) - buffers(shallow[0]) if depth > 1 else 0
    buffer_bytes = buffers(shallow[0]) + (depth - 1) * per_layer
    return ParameterTable((layer,) * depth + (rest,), buffer_bytes, depth)


def parameter_table(config, attention="sdpa"):
    """The ``ParameterTable`` of ``config``, from the model laid out on the meta
    device."""
    config = load_config(config)
    return _parameter_table(json.dumps(config.to_dict(), sort_keys=True, default=str),
                            attention)


def count_parameters(model):
    """The number of parameters of a configuration (a folder, a name in data/models or a
    Transformers configuration), counted on the meta device."""
    return parameter_table(model).count


# --- bytes per parameter tensor (lesson 04), sharded (lesson 06) ------------------

def _shard_shape(shape, devices):
    """The shape of one device's FSDP2 shard: dim 0 cut in ``devices`` chunks of
    ceil(dim0 / devices) rows, the last ones padded (torch.chunk, then padding)."""
    if devices == 1:
        return shape
    return (math.ceil(shape[0] / devices),) + tuple(shape[1:])


def optimizer_state_bytes(shape, optimizer, dtype_bytes=4):
    """Bytes of one parameter's optimizer state, from the optimizer's source.

    adamw: exp_avg and exp_avg_sq in the parameter's dtype (the step counter, a
    0-dim float32 tensor, too); sgd: one momentum buffer; adafactor (Transformers'):
    for a matrix, a row and a column second moment in float32, else a full one, plus
    its RMS and step scalars; adamw8bit (bitsandbytes): 1 byte each for both moments and
    a float32 scale per block of 256 values, float32 state for tensors under 4,096
    values (its ``min_8bit_size``).
    """
    numel = math.prod(shape)
    if optimizer == "adamw":
        return 2 * numel * dtype_bytes + 4
    if optimizer == "sgd":
        return numel * dtype_bytes
    if optimizer == "adafactor":
        if len(shape) >= 2:
            rows = math.prod(shape[:-1])
            return 4 * (rows + shape[-1]) + 4 * 1
        return 4 * numel + 4 * 1
    if optimizer == "adamw8bit":
        if numel < 4096:
            return 2 * numel * 4
        return 2 * (numel + 4 * math.ceil(numel / 256))
    raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")


def optimizer_step_scratch(shapes, levers, dtype_bytes):
    """The most bytes the optimizer step allocates for itself (freed before it returns).

    From the sources: PyTorch's for-loop AdamW holds ``exp_avg_sq.sqrt()`` and its
    quotient by the bias correction at once, two tensors of the parameter's size, one
    parameter at a time; foreach AdamW takes the square roots of all of them at once;
    fused kernels and SGD's in-place updates take none; Transformers' Adafactor holds
    the squared gradient and the update, two of the parameter's size in float32.
    """
    largest = max(math.prod(s) for s in shapes)
    if levers.optimizer == "adamw":
        if levers.optimizer_implementation == "fused":
            return 0
        if levers.optimizer_implementation == "foreach":
            return sum(math.prod(s) for s in shapes) * dtype_bytes
        return 2 * largest * dtype_bytes
    if levers.optimizer == "adafactor":
        return 2 * largest * 4
    return 0


def _zero1_partition(shapes, devices):
    """The parameters each rank of ``ZeroRedundancyOptimizer`` owns: sorted by size,
    largest first, each to the rank holding the fewest elements so far
    (torch/distributed/optim/zero_redundancy_optimizer.py, _partition_parameters)."""
    owned = [[] for _ in range(devices)]
    sizes = [0] * devices
    for shape in sorted(shapes, key=math.prod, reverse=True):
        rank = sizes.index(min(sizes))
        owned[rank].append(shape)
        sizes[rank] += math.prod(shape)
    return owned


def _per_device_shapes(table, levers):
    """(shapes whose weights and gradients this device holds, shapes whose optimizer
    state it holds) on the device that holds the most."""
    shapes, n = table.shapes, levers.devices
    if levers.sharding.startswith("fsdp"):
        local = [_shard_shape(s, n) for s in shapes]
        return local, local
    if levers.sharding == "zero1":
        partitions = _zero1_partition(shapes, n)
        return shapes, max(partitions, key=lambda p: sum(map(math.prod, p)))
    return shapes, shapes


# --- one step of a short copy, on fake tensors ------------------------------------

class StepTracker(LiveTensorTracker):
    """Lesson 1's meter, which also notes the copies autocast makes of the weights (a
    ``_to_copy`` of a parameter)."""

    def __init__(self, parameter_keys=()):
        super().__init__()
        self.parameter_keys = set(parameter_keys)
        self.weight_copies = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if (func is torch.ops.aten._to_copy.default and args
                and isinstance(args[0], torch.Tensor)
                and _key(args[0]) in self.parameter_keys):
            alloc = self.allocation_id(out)
            if alloc is not None:
                self.weight_copies.add(alloc)
        return out


def _key(tensor):
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


class FlopCounter:
    """PyTorch's ``FlopCounterMode`` count (its own dispatch mode and formula table),
    without its per-module breakdown. That breakdown enters a ``ModuleTracker``, whose
    hooks on each module's inputs and outputs keep tensors alive that a step without the
    counter frees: measured on distilbert-tiny, 4 x 64 tokens, float32, checkpointing,
    the live peak was 4,419,272 bytes with ``FlopCounterMode`` on and 3,167,944 bytes
    without (with 2 micro-batches: 6,614,216 and 3,515,592). A meter must not change
    what it measures, so the memory is measured under this counter."""

    def __init__(self):
        from torch.utils.flop_counter import FlopCounterMode

        self.counter = FlopCounterMode(display=False)
        self.mode = None

    def __enter__(self):
        from torch.utils.flop_counter import _FlopCounterMode

        self.counter.flop_counts.clear()
        # FlopCounterMode.__enter__ without mod_tracker.__enter__(): every count goes
        # to its "Global" entry, which get_total_flops reads
        self.mode = _FlopCounterMode(self.counter)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        result = self.mode.__exit__(*exc)
        self.mode = None
        return result

    def get_total_flops(self):
        return self.counter.get_total_flops()


def _hidden_states(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if (isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.dim() == 3):
            return value
    raise RuntimeError("found no hidden states among a layer's inputs")


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    for value in output:
        if isinstance(value, torch.Tensor):
            return value
    raise RuntimeError("found no tensor among a layer's outputs")


class SegmentMarks:
    """Marks in a tracker's event list: each layer's forward start and end, the end of
    forward, and the moments backward reaches each layer's output and input."""

    def __init__(self, tracker, layers, flop_counter=None):
        self.tracker, self.flop_counter = tracker, flop_counter
        self.marks = []  # (name, event index, flops so far)
        self.handles = []
        for index, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(
                functools.partial(self._pre, index), with_kwargs=True))
            self.handles.append(layer.register_forward_hook(
                functools.partial(self._post, index, len(layers))))

    def mark(self, name):
        """Note the moment ``name``; only its first time counts (checkpointing runs
        each layer's forward again during backward)."""
        if any(name == seen for seen, _, _ in self.marks):
            return
        flops = self.flop_counter.get_total_flops() if self.flop_counter else 0
        self.marks.append((name, len(self.tracker.events), flops))

    def _pre(self, index, module, args, kwargs):
        if any(f"F{index}" == seen for seen, _, _ in self.marks):
            return  # checkpointing's recomputation, in backward
        self.mark(f"F{index}")
        hidden = _hidden_states(args, kwargs)
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: self.mark(f"B{index}end"))

    def _post(self, index, count, module, args, output):
        if any(f"F{index}end" == seen for seen, _, _ in self.marks):
            return
        self.mark(f"F{index}end")
        if index == count - 1:
            out = _first_tensor(output)
            if out.requires_grad:
                out.register_hook(lambda grad: self.mark(f"B{index}"))

    def remove(self):
        for handle in self.handles:
            handle.remove()


def make_batch(config, run, device, vocab_low=5):
    """A micro-batch of random token ids (and labels) of the run's shape."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(vocab_low, config.vocab_size, (run.batch, run.seq),
                              generator=generator).to(device)
    if config.model_type in CLASSIFIERS:
        labels = (torch.arange(run.batch) % NUM_LABELS).to(device)
    else:
        labels = input_ids
    return {"input_ids": input_ids, "labels": labels}


def autocast_context(precision, device_type):
    """The forward pass's context for ``precision``: autocast for bfloat16 and float16,
    nothing otherwise. On fake CUDA tensors (no GPU here) autocast's CUDA rules are set
    as ``torch.autocast`` sets them, without its availability check."""
    from helpers.mixed_precision import _autocast_state

    if precision in ("float32",) + BFLOAT16_MODEL:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float16
    # CPU autocast, without its check that this CPU has float16 kernels (fake tensors
    # need none)
    return _autocast_state("cpu", dtype)


# CUDA's autocast runs these in float32 (aten/src/ATen/autocast_mode.cpp: its fp32 and
# fp32_set_opt_dtype lists); CPU's autocast leaves them in their input's dtype. The fake
# run is on CPU tensors (fake CUDA tensors cannot run a linear layer on a CPU-only
# build), so a plan for a GPU applies these rules on top of CPU's autocast.
CUDA_FLOAT32_FUNCTIONS = frozenset({
    "softmax", "log_softmax", "layer_norm", "group_norm", "cross_entropy", "nll_loss",
    "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div", "exp", "log", "pow", "rsqrt",
    "reciprocal", "logsumexp", "cumsum", "cumprod", "prod", "sum", "softplus",
    "binary_cross_entropy_with_logits", "cosine_similarity"})


class CudaAutocastRules(torch.overrides.TorchFunctionMode):
    """While CPU autocast is on: the functions CUDA's autocast runs in float32 get
    float32 inputs, as there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name in CUDA_FLOAT32_FUNCTIONS and torch.is_autocast_enabled("cpu")
                and not kwargs.get("dtype")):
            def up(value):
                if (isinstance(value, torch.Tensor)
                        and value.dtype in (torch.float16, torch.bfloat16)):
                    return value.float()
                return value
            args = tuple(up(a) for a in args)
            kwargs = {k: up(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def autocast_rules(device_type):
    """``CudaAutocastRules`` for a plan on a GPU, nothing for one on a CPU."""
    return CudaAutocastRules() if device_type == "cuda" else contextlib.nullcontext()


def _selective_op_context():
    """torchtitan's selective "op" policy, as it wrote it (December 2024): a fresh count
    per checkpointed call; keep the outputs of the ops in its list, but only every
    other matmul's. CPU's flash attention stands for CUDA's (a fake run is on CPU
    tensors)."""
    from collections import defaultdict

    from torch.utils.checkpoint import (
        CheckpointPolicy,
        create_selective_checkpoint_contexts,
    )

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default,
            aten.max.default}
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        to_save = func in save and not (func == aten.mm.default
                                        and meta[f"{mode}_mm_count"] % 2 == 0)
        return (CheckpointPolicy.MUST_SAVE if to_save
                else CheckpointPolicy.PREFER_RECOMPUTE)

    return create_selective_checkpoint_contexts(policy)


def _cuda_rules_in_recompute(context_fn=None):
    """A checkpoint ``context_fn``: ``context_fn``'s contexts (none if None), with
    ``CudaAutocastRules`` around the recomputation too. Backward runs with torch
    function modes off, so without it a plan for a GPU recomputed GPT-2's GELU (its
    ``torch.pow``) in bfloat16 where forward had run it in float32, and checkpointing
    stopped on the mismatch (``CheckpointError``)."""
    def contexts():
        forward, recompute = (context_fn() if context_fn is not None
                              else (contextlib.nullcontext(), contextlib.nullcontext()))
        return forward, _both(recompute, CudaAutocastRules())
    return contexts


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def prepare_model(model, levers, device_type, cast=True, reentrant=False):
    """The levers a model object carries: dtype for bfloat16 end to end (``cast``),
    checkpointing, train mode."""
    if cast and levers.precision in BFLOAT16_MODEL:
        model.to(torch.bfloat16)
    if levers.checkpointing:
        # non-reentrant (PyTorch's recommendation); the RNG state it saves (bytes on a
        # real GPU) is left out of a GPU's plan
        # Transformers 5.23 renamed gradient_checkpointing_enable (the old name warns)
        enable = getattr(model, "activation_checkpointing_enable", None)
        kwargs = {"use_reentrant": reentrant,
                  "preserve_rng_state": device_type == "cpu"}
        context_fn = None
        if levers.checkpointing_policy == "selective-op":
            if reentrant:
                raise ValueError("selective checkpointing needs the non-reentrant "
                                 "implementation")
            context_fn = _selective_op_context
        if device_type == "cuda" and not reentrant:
            context_fn = _cuda_rules_in_recompute(context_fn)
        if context_fn is not None:
            kwargs["context_fn"] = context_fn
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    return model


def micro_batch_step(model, batch, run, levers, device_type):
    """Forward (under the precision's autocast) and backward of one micro-batch."""
    cache = torch.is_autocast_cache_enabled()
    # checkpointing's recomputation in backward reuses the flag forward ran with
    torch.set_autocast_cache_enabled(run.autocast_cache)
    try:
        with autocast_context(levers.precision, device_type):
            loss = model(**batch).loss
    finally:
        torch.set_autocast_cache_enabled(cache)
    if run.accumulation > 1:
        loss = loss / run.accumulation
    return loss


@dataclasses.dataclass
class Segments:
    """The event deltas of one micro-batch's forward and backward, cut by layer."""
    # name -> list of (byte delta, whether it repeats with the middle layer)
    pieces: dict
    flops: dict  # name -> flops
    copies_per_layer: int  # autocast's weight copies a middle layer keeps for backward
    copies_other: int  # those the rest keeps
    saved_middle: int  # net bytes a middle layer's forward keeps
    loss_bytes: int  # the loss, alive at forward's end but not kept for backward
    # name -> [(event position in that piece, bytes of the weights' gradients made
    # since the previous position)]: each group's backward ends at such a position,
    # where FSDP2 reduce-scatters them and frees them
    gradient_bytes: dict = dataclasses.field(default_factory=dict)


ORDER_FORWARD = ("pro", "F0", "F1", "F2", "epi", "head")
ORDER_BACKWARD = ("B2", "B1", "B0", "tail")


def _cut(tracker, marks, start, end):
    """Split the tracker's events from ``start`` to ``end`` at the marks, by segment."""
    index = {name: (position, flops) for name, position, flops in marks}
    bounds = [("pro", start), ("F0", index["F0"][0]), ("F1", index["F1"][0]),
              ("F2", index["F2"][0]), ("epi", index["F2end"][0]),
              ("head", index["forward end"][0]), ("B2", index["B2"][0]),
              ("B1", index["B2end"][0]),
              ("B0", index["B1end"][0]), ("tail", index["B0end"][0]), (None, end)]
    flop_bounds = [index[n][1] for n in ("F0", "F1", "F2", "F2end", "forward end",
                                         "B2", "B2end", "B1end", "B0end")]
    # Some blocks of every layer are freed together after the last layer: autocast's
    # cached copies of the weights when autocast is left (after forward),
    # checkpointing's recomputed tensors when backward ends. Such a free, after the
    # layers, of a block the middle layer made is repeated as the middle layer is
    # (marked True).
    middle = {alloc for alloc, delta in
              tracker.events[index["F1"][0]:index["F2"][0]]
              + tracker.events[index["B2end"][0]:index["B1end"][0]] if delta > 0}
    pieces = {}
    for (name, begin), (_, stop) in itertools.pairwise(bounds):
        after_layers = name in ("epi", "head", "tail")
        pieces[name] = [(delta, after_layers and delta < 0 and alloc in middle)
                        for alloc, delta in tracker.events[begin:stop]]
    return pieces, index, flop_bounds


@contextlib.contextmanager
def fake_training(config, run, levers, device_type, layers=None):
    """``(model, batch)`` of ``config`` with ``layers`` layers (its own depth if None)
    on fake tensors (shapes and dtypes, no memory), the levers applied, CUDA's autocast
    rules on for a plan on a GPU (for checkpointing's recomputation in backward too):
    the planner's copy and the validation's whole model are built here, the same way."""
    from helpers.mixed_precision import on_fake_tensors

    model = build_model(config, attention=run.attention, layers=layers)
    if levers.precision in BFLOAT16_MODEL:  # on the meta device: fake ones cannot
        model.to(torch.bfloat16)
    with on_fake_tensors(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model.to_empty(device="cpu")
        model.tie_weights()  # to_empty under fake tensors unties them
        prepare_model(model, levers, device_type, cast=False,
                      reentrant=run.reentrant_checkpointing)
        batch = {k: torch.empty(v.shape, dtype=v.dtype).fill_(1)
                 for k, v in make_batch(config, run, "cpu").items()}
        with autocast_rules(device_type):
            yield model, batch


def fake_segments(config, run, levers, device_type, with_gradients, whole=False):
    """Segments of one micro-batch of a ``MEASURED_LAYERS``-layer copy on fake tensors;
    ``with_gradients``: the gradients exist already (a later micro-batch, or gradients
    kept between steps). ``whole``: the model at its own depth instead, its forward as
    one segment and the rest as another (no layer repeated)."""
    depth = None if whole else MEASURED_LAYERS
    with fake_training(config, run, levers, device_type, depth) as (model, batch):
        if with_gradients:  # a first micro-batch, unmeasured, makes them
            micro_batch_step(model, batch, run, levers, device_type).backward()
        parameter_keys = {_key(p) for p in model.parameters()}
        tracker = StepTracker(parameter_keys)
        flop_counter = FlopCounter()
        marks = SegmentMarks(tracker, layer_stack(model), flop_counter)
        with flop_counter, tracker:
            loss = micro_batch_step(model, batch, run, levers, device_type)
            marks.mark("forward end")
            alive_at_forward_end = tracker.alive_ids() - {tracker.allocation_id(loss)}
            loss_bytes = loss.untyped_storage().nbytes()
            copies_alive = tracker.weight_copies & alive_at_forward_end
            loss.backward()
            del loss
        marks.remove()
        made_gradients = {tracker.allocation_id(p.grad) for p in model.parameters()
                          if p.grad is not None} - {None}
    if whole:
        index = {name: (position, flops) for name, position, flops in marks.marks}
        end_forward, flops_forward = index["forward end"]
        pieces = {name: [] for name in ORDER_FORWARD + ORDER_BACKWARD}
        pieces["pro"] = [(d, False) for _, d in tracker.events[:end_forward]]
        pieces["head"] = [(d, False) for _, d in tracker.events[end_forward:]]
        flops = dict.fromkeys(pieces, 0)
        flops["pro"] = flops_forward
        flops["head"] = flop_counter.get_total_flops() - flops_forward
        sizes = {alloc: nbytes for _, alloc, nbytes in tracker.created}
        # each layer's backward ends when its input's gradient is made (B<i>end), the
        # rest's at the end
        ends = sorted(position - end_forward for name, position, _ in marks.marks
                      if name.startswith("B") and name.endswith("end"))
        ends.append(len(tracker.events) - end_forward)
        released, begin = [], 0
        for stop in ends:
            released.append((stop, sum(
                delta for alloc, delta in tracker.events[end_forward + begin:
                                                         end_forward + stop]
                if alloc in made_gradients and delta > 0)))
            begin = stop
        return Segments(pieces, flops, 0, sum(sizes[a] for a in copies_alive), 0,
                        loss_bytes, {"head": released})
    pieces, index, fb = _cut(tracker, marks.marks, 0, len(tracker.events))
    gradient_bytes = _gradient_bytes(tracker, marks.marks, made_gradients)
    total_flops = flop_counter.get_total_flops()
    names = ("pro", "F0", "F1", "F2", "epi", "head", "B2", "B1", "B0", "tail")
    ends = fb + [total_flops]
    flops = {name: end - begin
             for name, begin, end in zip(names, [0] + fb, ends, strict=True)}
    # autocast's copies the middle layer made and forward left alive
    created = tracker.created
    f1_start, f1_end = index["F1"][0], index["F2"][0]
    f1_allocs = {alloc for alloc, delta in tracker.events[f1_start:f1_end] if delta > 0}
    sizes = {alloc: nbytes for _, alloc, nbytes in created}
    per_layer = sum(sizes[a] for a in copies_alive & f1_allocs)
    other = sum(sizes[a] for a in copies_alive) - MEASURED_LAYERS * per_layer
    return Segments(pieces, flops, per_layer, other,
                    sum(delta for delta, _ in pieces["F1"]), loss_bytes,
                    gradient_bytes)


def _gradient_bytes(tracker, marks, made):
    """{backward piece: bytes of the gradients in ``made`` that it allocated}."""
    index = {name: position for name, position, _ in marks}
    bounds = [("B2", index["B2"]), ("B1", index["B2end"]), ("B0", index["B1end"]),
              ("tail", index["B0end"]), (None, len(tracker.events))]
    return {name: [(stop - begin, sum(delta for alloc, delta
                                      in tracker.events[begin:stop]
                                      if alloc in made and delta > 0))]
            for (name, begin), (_, stop) in itertools.pairwise(bounds)}


# A model this shallow runs at its own depth: as cheap as the copy, and exact
SHALLOW_LAYERS = 4


@functools.lru_cache(maxsize=256)
def _segments_cached(config_json, run, levers_key, device_type, with_gradients):
    return _disk_cached(
        "segments", [config_json, dataclasses.astuple(run), levers_key, device_type,
                     with_gradients],
        lambda: _measure_segments(config_json, run, levers_key, device_type,
                                  with_gradients))


def _measure_segments(config_json, run, levers_key, device_type, with_gradients):
    from transformers import AutoConfig

    config = AutoConfig.for_model(**json.loads(config_json))
    checkpointing, precision, *policy = levers_key
    levers = Levers(checkpointing=checkpointing, precision=precision,
                    checkpointing_policy=policy[0] if policy else "every-op",
                    sharding="fsdp" if precision == "bfloat16-fsdp" else "none")
    whole = getattr(config, _layer_count_key(config)) <= SHALLOW_LAYERS
    return fake_segments(config, run, levers, device_type, with_gradients, whole)


def _levers_key(levers):
    """What of the levers a fake run depends on."""
    if levers.checkpointing and levers.checkpointing_policy != "every-op":
        return levers.checkpointing, levers.precision, levers.checkpointing_policy
    return levers.checkpointing, levers.precision


def segments(config, run, levers, device_type, with_gradients):
    """``fake_segments``, remembered: it depends on the model, the run's shape,
    checkpointing and precision only."""
    shape = dataclasses.replace(run, accumulation=min(run.accumulation, 2),
                                keep_gradients=False)
    return _segments_cached(json.dumps(config.to_dict(), sort_keys=True, default=str),
                            shape, _levers_key(levers),
                            device_type, with_gradients)


def synthesise(seg, layers, reduce_scatter_over=None):
    """(peak above the start, net change, bytes alive at forward's end) of one
    micro-batch with ``layers`` layers: the middle layer's segments repeated.
    ``reduce_scatter_over``: FSDP2 over that many devices: after each group's backward
    its whole gradients are reduce-scattered and freed
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce:
    ``unsharded_grads.clear()``); the shards are counted with the other gradients.
    Its reduce-scatter input (a copy of the group's gradients, a moment before they
    are freed) is left out: the peaks measured on 2 processes (distilbert-tiny, 2 x 16
    and 4 x 64 tokens, FSDP2 resharding) equal the plan without it, to the byte; with
    it, the plan is 15 % above them."""
    if layers < 2:
        raise ValueError("the planner models stacks of at least 2 layers")
    repeats = layers - 2
    order = (["pro", "F0"] + ["F1"] * repeats + ["F2", "epi", "head", "B2"]
             + ["B1"] * repeats + ["B0", "tail"])
    live = peak = 0
    forward_end = None
    for name in order:
        piece = seg.pieces[name]
        if name == "head":
            forward_end = live - seg.loss_bytes
        # a repeated piece peaks where it peaks once, shifted by what came before
        running = live
        releases = dict(seg.gradient_bytes.get(name, ())) if reduce_scatter_over else {}
        for position, (delta, per_middle_layer) in enumerate(piece, start=1):
            running += delta * repeats if per_middle_layer else delta
            peak = max(peak, running)
            running -= releases.get(position, 0)
        live = running
    return peak, live, forward_end


# --- the plan ------------------------------------------------------------------------

def _dtype_bytes(levers):
    return 2 if levers.precision == "bfloat16-pure" else 4


def _round_allocation(nbytes):
    """What the CUDA caching allocator hands out for ``nbytes``: multiples of 512 bytes,
    and of 2 MiB above 1 MiB (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize,
    kRoundLarge)."""
    if nbytes > MiB:
        return math.ceil(nbytes / (2 * MiB)) * 2 * MiB
    return math.ceil(nbytes / 512) * 512


def sent_bytes_per_step(table, run, levers):
    """Bytes one device sends per optimizer step over a ring, for the sharding lever."""
    n, kind = levers.devices, levers.sharding
    if n == 1 or kind == "none":
        return 0.0
    element = _dtype_bytes(levers)
    parameter_bytes = table.count * element
    forwards = run.accumulation
    buffers = table.buffer_bytes * (n - 1) / n * forwards  # DDP's buffer broadcast
    if kind in ("ddp", "zero1"):
        if levers.local_sgd_every:  # each process trains alone: no DDP, no buffers
            return 2 * (n - 1) / n * parameter_bytes / levers.local_sgd_every
        sent = buffers + 2 * (n - 1) / n * parameter_bytes
        if kind == "zero1":  # each rank broadcasts the shard it updated
            sent += (n - 1) / n * parameter_bytes
        return sent
    # FSDP2: per group, an all-gather of the padded shards in forward (and again in
    # backward when resharding: the root too, which lesson 06 shards with
    # reshard_after_forward=True as well), a reduce-scatter of the padded gradients in
    # backward, every micro-batch
    sent = 0.0
    for group in table.groups:
        padded = sum(_shard_shape(s, n)[0] * math.prod(s[1:]) for s in group) * n
        gathers = 2 if kind == "fsdp-reshard" else 1
        # MixedPrecisionPolicy gathers bfloat16 and reduces in float32
        gathered = 2 if levers.precision == "bfloat16-fsdp" else element
        sent += gathers * (n - 1) / n * padded * gathered  # all-gather
        sent += (n - 1) / n * padded * element  # reduce-scatter
    return sent * forwards


def _gathered_bytes(table, levers):
    """The whole weights FSDP2 gathers: every group's from forward to backward when it
    keeps them, else the group in use and the one prefetched (lesson 06); 0 without
    FSDP2."""
    if not levers.sharding.startswith("fsdp"):
        return 0
    n = levers.devices
    element = 2 if levers.precision == "bfloat16-fsdp" else _dtype_bytes(levers)
    group_bytes = [sum(_shard_shape(s, n)[0] * math.prod(s[1:]) for s in g) * n
                   * element for g in table.groups]
    if levers.sharding == "fsdp":
        return sum(group_bytes)
    return group_bytes[-1] + 2 * max(group_bytes[:-1])


def state_bytes(model, run, levers):
    """Weights, gradients and optimizer state on the device that holds the most, and
    the whole weights FSDP2 gathers: a lower bound of the plan's peak, from formulas
    alone (the plan's forward and backward holds all of them, and activations)."""
    return _state_bytes(parameter_table(load_config(model), run.attention), levers)


def _state_bytes(table, levers):
    element = _dtype_bytes(levers)
    weight_shapes, state_shapes = _per_device_shapes(table, levers)
    weights = sum(math.prod(s) for s in weight_shapes) * element
    return (2 * weights + sum(optimizer_state_bytes(s, levers.optimizer, element)
                              for s in state_shapes)
            + _gathered_bytes(table, levers))


def plan(model, run=None, levers=None, device=None):
    """The plan of one training step on each device: see the module's docstring."""
    run = run or Run()
    levers = levers or Levers()
    device = device or Device()
    config = load_config(model)
    table = parameter_table(config, run.attention)
    n = levers.devices
    element = _dtype_bytes(levers)
    weight_shapes, state_shapes = _per_device_shapes(table, levers)
    weights = sum(math.prod(s) for s in weight_shapes) * element
    gradients = weights
    state = sum(optimizer_state_bytes(s, levers.optimizer, element)
                for s in state_shapes)
    scratch = optimizer_step_scratch(state_shapes, levers, element)
    # the activations of one micro-batch: the middle layer repeated
    fsdp = levers.sharding.startswith("fsdp")
    grads_kept = run.keep_gradients or levers.sharding in ("ddp", "zero1")
    if fsdp:
        # FSDP2 makes each group's whole gradients afresh in every backward (its
        # gradients live on the sharded parameters): a fake run without gradients,
        # each group's whole ones reduce-scattered and freed after its backward
        first = segments(config, run, levers, device.kind, with_gradients=False)
        peak_first, _, saved = synthesise(first, table.layers, reduce_scatter_over=n)
    else:
        first = segments(config, run, levers, device.kind, with_gradients=grads_kept)
        peak_first, _, saved = synthesise(first, table.layers)
        later = (segments(config, run, levers, device.kind, with_gradients=True)
                 if run.accumulation > 1 and not grads_kept else first)
        peak_later, _, _ = synthesise(later, table.layers)
    copies = first.copies_other + table.layers * first.copies_per_layer
    gathered = _gathered_bytes(table, levers)
    base = weights + state
    phases = {}
    if fsdp:
        # the gradient shards counted whole from the start: kept between steps, or
        # made during the first backward (then an upper bound, by at most 1/N of them)
        phases["forward and backward"] = base + gradients + peak_first + gathered
    elif grads_kept:
        phases["forward and backward"] = base + gradients + peak_first + gathered
    else:
        # the first micro-batch makes the gradients (peak_first holds them)
        phases["forward and backward"] = base + peak_first
        if run.accumulation > 1:
            phases["later micro-batches"] = base + gradients + peak_later
    phases["optimizer step"] = base + gradients + scratch
    peak_phase = max(phases, key=phases.get)
    peak = int(phases[peak_phase])
    activations = max(saved - copies, 0)
    parts = {"weights": int(weights), "gradients": int(gradients),
             "optimizer state": int(state), "activations": int(activations),
             "autocast weight copies": int(copies)}
    # what the step holds for a moment beyond them (0 where the parts themselves never
    # all exist at once: the peak is then below their sum)
    parts["transient"] = int(max(peak - base - gradients - activations - copies, 0))
    reserved = peak
    if device.allocator_replay:
        reserved = peak + _allocator_overhead(
            json.dumps(config.to_dict(), sort_keys=True, default=str), run, levers)
    elif device.allocator_rounding:
        reserved = _reserved(peak, table, levers, run)
    sent = sent_bytes_per_step(table, run, levers)
    flops_micro = _micro_flops(first, table.layers)
    flops = flops_micro * run.accumulation
    total = reserved + device.context_bytes
    return Plan(parts=parts, peak_bytes=peak, reserved_bytes=int(reserved),
                total_bytes=int(total), fits=total <= device.memory_bytes,
                sent_bytes=sent,
                link_seconds=(sent / device.link_bytes_per_s
                              if device.link_bytes_per_s else math.inf),
                flops=int(flops),
                compute_seconds=(flops / peak if (peak := device.peak_for(
                    levers.precision)) else math.inf),
                parameters=table.count, levers=levers, run=run, device=device,
                peak_phase=peak_phase, phases={k: int(v) for k, v in phases.items()})


def _micro_flops(seg, layers):
    f = seg.flops
    return int(sum(f.values()) - f["F1"] - f["B1"]
               + (layers - 2) * (f["F1"] + f["B1"]))


def _reserved(peak, table, levers, run):
    """The caching allocator's reserve at the peak, the one rule for every plan: the
    live peak, plus each parameter-sized block (weights, gradients and two optimizer
    state tensors per parameter) rounded up as the allocator rounds it
    (``_round_allocation``). Fragmentation is not modelled."""
    element = _dtype_bytes(levers)
    rounded = sum(_round_allocation(math.prod(s) * element) - math.prod(s) * element
                  for s in table.shapes)
    return peak + 4 * rounded


# --- the CUDA caching allocator, replayed (published runs) -------------------------
# c10/cuda/CUDACachingAllocator.cpp: requests rounded up to 512 bytes (kMinBlockSize);
# those of at most 1 MiB (kSmallSize) from 2 MiB segments (kSmallBuffer), those under
# 10 MiB (kMinLargeAlloc) from 20 MiB ones (kLargeBuffer), larger ones from a segment
# of their size rounded up to 2 MiB (kRoundLarge). A request takes the smallest cached
# free block of its pool that holds it, split when the rest is at least 512 bytes
# (small pool) or more than 1 MiB (large pool); a freed block merges with its free
# neighbours; segments are never given back (no empty_cache, no out-of-memory retry).
SMALL_SIZE, SMALL_BUFFER = MiB, 2 * MiB
LARGE_BUFFER, MIN_LARGE_ALLOC = 20 * MiB, 10 * MiB


class CachingAllocator:
    """The reserve of PyTorch's CUDA caching allocator for a sequence of allocations and
    frees (one stream, default settings, no ``expandable_segments``)."""

    def __init__(self):
        self.free = {True: [], False: []}  # small pool?: sorted [(size, start)]
        # start -> [end, free, small]; addresses are offsets in one line of segments
        self.blocks = {}
        self.ends = {}  # end -> start of the block ending there
        self.top = 0  # where the next segment starts
        self.segment_ends = set()
        self.reserved = self.live = self.peak_live = 0

    def _add(self, start, end, free, small):
        self.blocks[start] = [end, free, small]
        self.ends[end] = start
        if free:
            bisect.insort(self.free[small], (end - start, start))

    def _remove(self, start):
        end, free, small = self.blocks.pop(start)
        del self.ends[end]
        if free:
            self.free[small].remove((end - start, start))
        return end

    def malloc(self, nbytes):
        """The address of a block for ``nbytes``."""
        size = max(512, math.ceil(nbytes / 512) * 512)
        small = size <= SMALL_SIZE
        pool = self.free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index < len(pool):
            start = pool[index][1]
            end = self._remove(start)
        else:  # a new segment
            held = (SMALL_BUFFER if small else LARGE_BUFFER if size < MIN_LARGE_ALLOC
                    else math.ceil(size / (2 * MiB)) * 2 * MiB)
            start, end = self.top, self.top + held
            self.top = end
            self.segment_ends.add(end)
            self.reserved += held
        rest = end - start - size
        if rest >= 512 if small else rest > SMALL_SIZE:
            self._add(start + size, end, True, small)
            end = start + size
        self._add(start, end, False, small)
        self.live += end - start
        self.peak_live = max(self.peak_live, self.live)
        return start

    def release(self, start):
        end, _, small = self.blocks[start]
        self.live -= end - start
        self._remove(start)
        # merge with free neighbours in the same segment
        if end not in self.segment_ends and self.blocks.get(end, [0, False])[1]:
            end = self._remove(end)
        before = self.ends.get(start)
        if (before is not None and self.blocks[before][1]
                and start not in self.segment_ends):
            self._remove(before)
            start = before
        self._add(start, end, True, small)


def replay_reserved(events):
    """(peak reserved, peak of the blocks handed out) of the caching allocator for a
    tracker's events, [(allocation id, change in bytes)]: a storage that grows is freed
    and allocated again at its new size."""
    allocator = CachingAllocator()
    held, address = {}, {}
    peak = 0
    for alloc, change in events:
        old = held.get(alloc, 0)
        if old:
            allocator.release(address.pop(alloc))
        new = old + change
        held[alloc] = new
        if new > 0:
            address[alloc] = allocator.malloc(new)
        peak = max(peak, allocator.reserved)
    return peak, allocator.peak_live


class _EightBitAdamState(torch.optim.Optimizer):
    """The memory bitsandbytes' 8-bit AdamW allocates (its arithmetic needs a GPU): per
    parameter of at least 4,096 values two uint8 moments and a float32 scale per block
    of 256 values each, float32 moments under that (its ``min_8bit_size``)."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    if p.numel() < 4096:
                        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                    else:
                        blocks = math.ceil(p.numel() / 256)
                        for i in (1, 2):
                            state[f"state{i}"] = torch.zeros_like(p, dtype=torch.uint8)
                            state[f"absmax{i}"] = torch.zeros(blocks)
                p.add_(p.grad, alpha=-1e-3)


def step_optimizer(model, levers):
    """The optimizer of ``levers`` for a replayed step: PyTorch's AdamW or SGD (their
    for-loop, foreach or fused implementation), Transformers' Adafactor, or the
    allocations of bitsandbytes' 8-bit AdamW."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    implementation = {"foreach": levers.optimizer_implementation == "foreach",
                      "fused": levers.optimizer_implementation == "fused" or None}
    if levers.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-4, **implementation)
    if levers.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9,
                               foreach=implementation["foreach"])
    if levers.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(parameters, lr=1e-4, scale_parameter=False,
                         relative_step=False)
    return _EightBitAdamState(parameters)


def step_events(config, run, levers, device_type, steps=2):
    """The tracker's allocation events of ``steps`` whole training steps of the model at
    its full depth on fake tensors (no memory): its weights made, then each step's
    micro-batches (at most 2), the optimizer's step and ``zero_grad``."""
    from helpers.mixed_precision import on_fake_tensors

    model = build_model(config, attention=run.attention)
    if levers.precision in BFLOAT16_MODEL:
        model.to(torch.bfloat16)
    tracker = StepTracker()
    with on_fake_tensors(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            model = model.to_empty(device="cpu")
        model.tie_weights()
        prepare_model(model, levers, device_type, cast=False,
                      reentrant=run.reentrant_checkpointing)
        batch = {k: torch.empty(v.shape, dtype=v.dtype).fill_(1)
                 for k, v in make_batch(config, run, "cpu").items()}
        optimizer = step_optimizer(model, levers)
        with autocast_rules(device_type), tracker:
            for _ in range(steps):
                # a third micro-batch allocates and frees as the second did: the
                # cache the second left serves it
                for _ in range(min(run.accumulation, 2)):
                    micro_batch_step(model, batch, run, levers, device_type).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=not run.keep_gradients)
    return tracker.events


@functools.lru_cache(maxsize=64)
def _allocator_overhead(config_json, run, levers):
    """What the caching allocator reserves beyond the live peak, replayed over two
    whole steps (the first makes the optimizer's state, the second reuses the cache)."""
    def compute():
        from transformers import AutoConfig

        config = AutoConfig.for_model(**json.loads(config_json))
        events = step_events(config, run, levers, "cuda")
        reserved, _ = replay_reserved(events)
        live = peak = 0
        for _, change in events:
            live += change
            peak = max(peak, live)
        return reserved - peak
    return _disk_cached("allocator", [config_json, dataclasses.astuple(run),
                                      dataclasses.astuple(levers)], compute)


# --- the command ---------------------------------------------------------------------

def parse_bytes(text):
    """'80GB' -> 80e9, '80GiB' -> 80 * 2**30, '16000MB' -> 16e9; bytes as a number."""
    units = {"gib": GiB, "mib": MiB, "gb": 10**9, "mb": 10**6, "tb": 10**12, "b": 1}
    lowered = str(text).strip().lower().replace(" ", "")
    for unit in sorted(units, key=len, reverse=True):
        if lowered.endswith(unit):
            number = lowered[: -len(unit)]
            break
    else:
        unit, number = "b", lowered
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 80GB, 80GiB or "
                         "16000MB") from None
    if value <= 0:
        raise ValueError(f"a memory size must be positive, got {text!r}")
    return value * units[unit]


def parse_peak_tflops(text):
    """'312' -> 312e12 for every precision; 'float32=19.5,bfloat16=312' -> a peak per
    compute dtype (FLOP/s); None -> A100_PEAK_FLOPS."""
    if text is None:
        return dict(A100_PEAK_FLOPS)
    example = "write e.g. 312, or float32=19.5,bfloat16=312,float16=312"
    try:
        if "=" not in str(text):
            peaks = float(text)
        else:
            pairs = [item.split("=") for item in str(text).split(",")]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError
            peaks = {dtype.strip(): float(value) for dtype, value in pairs}
    except ValueError:
        raise ValueError(f"cannot read --peak-tflops {text!r}: {example}") from None
    values = peaks.values() if isinstance(peaks, dict) else [peaks]
    if not all(0 < value < math.inf for value in values):
        raise ValueError(f"--peak-tflops must be positive, got {text!r}")
    if isinstance(peaks, dict):
        return {dtype: value * 10**12 for dtype, value in peaks.items()}
    return peaks * 10**12


def lever_combinations(levers):
    """Every combination of the levers a learner can pull on the same devices."""
    shardings = (["none"] if levers.devices == 1 else
                 ["ddp", "zero1", "fsdp", "fsdp-reshard"])
    # checkpointing first: cheapest_fitting skips a combination whose checkpointed twin
    # does not fit. "bfloat16-fsdp" (FSDP2's MixedPrecisionPolicy) is left out of the
    # search: no live run of the validation checks it yet
    for checkpointing, precision, optimizer, sharding in itertools.product(
            (True, False), ("float32", "bfloat16", "bfloat16-pure"),
            ("adamw", "adamw8bit", "adafactor"), shardings):
        yield dataclasses.replace(levers, checkpointing=checkpointing,
                                  precision=precision, optimizer=optimizer,
                                  sharding=sharding, local_sgd_every=None)


# what each lever costs, in the course's order: first what costs nothing, then time,
# then what may change the training's result
OPTIMIZER_RISK = {"adamw": 0, "adamw8bit": 1, "adafactor": 2, "sgd": 3}
PRECISION_RISK = {"float32": 0, "bfloat16": 0, "float16": 0, "bfloat16-pure": 1,
                  "bfloat16-fsdp": 0}


def _search_candidates(model, run, levers, device):
    """The combinations ``cheapest_fitting`` may plan: those whose state and gathered
    weights alone fit (the others need no fake run to be ruled out)."""
    table = parameter_table(load_config(model), run.attention)
    for candidate in lever_combinations(levers):
        if _state_bytes(table, candidate) + device.context_bytes <= device.memory_bytes:
            yield candidate


def cheapest_fitting(model, run, levers, device, count=5):
    """The ``count`` cheapest combinations that fit: fewest changes to the training's
    result first (optimizer, then bfloat16 end to end), then the shortest step
    (compute plus communication)."""
    fitting = []
    model = load_config(model)  # read once
    too_big = set()  # checkpointed combinations that do not fit
    for candidate in _search_candidates(model, run, levers, device):
        twin = dataclasses.replace(candidate, checkpointing=True)
        if not candidate.checkpointing and twin in too_big:
            # checkpointing keeps less than no checkpointing (each layer's input, and
            # one layer's activations recomputed at a time): without it, it does not
            # fit either; its fake run is saved
            continue
        result = plan(model, run, candidate, device)
        if not result.fits and candidate.checkpointing:
            too_big.add(candidate)
        if result.fits:
            seconds = result.compute_seconds + result.link_seconds
            fitting.append(((OPTIMIZER_RISK[candidate.optimizer]
                             + PRECISION_RISK[candidate.precision]), seconds, result))
    fitting.sort(key=lambda item: item[:2])
    return [result for _, _, result in fitting[:count]]


def describe_levers(levers):
    parts = [f"precision {levers.precision}", f"optimizer {levers.optimizer}",
             "checkpointing" if levers.checkpointing else "no checkpointing"]
    if levers.devices > 1:
        parts.append(f"{levers.sharding} on {levers.devices} devices")
        if levers.local_sgd_every:
            parts.append(f"Local SGD every {levers.local_sgd_every} steps")
    return ", ".join(parts)


def format_plan(result):
    lines = [f"{result.parameters:,} parameters; {describe_levers(result.levers)}; "
             f"micro-batch {result.run.batch} x {result.run.seq} tokens, "
             f"accumulation {result.run.accumulation}",
             "per device:"]
    for name, nbytes in result.parts.items():
        lines.append(f"  {name:>24}: {nbytes / GiB:9.2f} GiB")
    lines.append(f"  {'peak (live tensors)':>24}: {result.peak_bytes / GiB:9.2f} GiB "
                 f"(during the {result.peak_phase})")
    if result.device.context_bytes:
        context = result.device.context_bytes / GiB
        lines.append(f"  {'+ context':>24}: {context:9.2f} GiB")
    lines.append(f"  {'total':>24}: {result.total_bytes / GiB:9.2f} GiB of "
                 f"{result.device.memory_bytes / GiB:.2f} GiB")
    lines.append(f"sent per step: {result.sent_bytes / GiB:.3f} GiB "
                 f"({result.link_seconds * 1000:.1f} ms on the link); "
                 f"FLOPs per step: {result.flops:.3e} "
                 f"({result.compute_seconds * 1000:.1f} ms at "
                 f"{result.device.peak_for(result.levers.precision) / 1e12:g} TFLOP/s)")
    lines.append("verdict: " + ("fits" if result.fits else "does NOT fit"))
    return "\n".join(lines)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m helpers.planner",
        description="Plan one training step: memory per device, bytes sent, FLOPs.")
    parser.add_argument("--model", required=True,
                        help="a folder with a Transformers config.json "
                             "(e.g. data/models/llama-3.1-8b)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per device "
                        "and micro-batch")
    parser.add_argument("--seq", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--accumulation", type=int, default=1,
                        help="micro-batches per optimizer step")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation checkpointing on every layer")
    parser.add_argument("--precision", default="fp32",
                        help="fp32, bf16 or fp16 (autocast), bf16-pure (bfloat16 end "
                             "to end), bf16-fsdp (FSDP2's MixedPrecisionPolicy: "
                             "bfloat16 gathered, float32 shards)")
    parser.add_argument("--checkpointing-policy", default="every-op",
                        help="with --checkpointing: every-op or selective-op "
                             "(torchtitan's)")
    parser.add_argument("--optimizer", default="adamw",
                        help=f"one of {', '.join(OPTIMIZERS)}")
    parser.add_argument("--optimizer-implementation", default="foreach",
                        help="for-loop, foreach (PyTorch's default on a GPU) or fused")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--sharding", default=None,
                        help=f"one of {', '.join(SHARDINGS)} (default: none on 1 "
                             "device, ddp on more)")
    parser.add_argument("--local-sgd", type=int, default=None, metavar="K",
                        help="with ddp: average the weights every K steps")
    parser.add_argument("--reentrant-checkpointing", action="store_true",
                        help="checkpoint with use_reentrant=True (the default until "
                             "PyTorch 2.4) instead of non-reentrant")
    parser.add_argument("--attention", default="sdpa", help="sdpa or eager")
    parser.add_argument("--gpu-memory", default="80GB", help="e.g. 80GB, 80GiB")
    parser.add_argument("--context", default="1343MiB",
                        help="memory the runtime takes before any tensor (default: the "
                             "CUDA context Transformers' docs measured on a V100)")
    parser.add_argument("--link", default="100GB", help="link bandwidth per second "
                        "per device, e.g. 100GB (NVLink-class) or 50GB")
    parser.add_argument("--peak-tflops", default=None,
                        help="peak throughput in TFLOP/s: one number for every "
                             "precision, or one per compute dtype, e.g. "
                             "float32=67,bfloat16=989,float16=989 (an H100 SXM, "
                             "NVIDIA's datasheet, dense); default: an A100's, "
                             "float32=19.5,bfloat16=312,float16=312")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        sharding = args.sharding or ("none" if args.devices == 1 else "ddp")
        run = Run(batch=args.batch, seq=args.seq, accumulation=args.accumulation,
                  attention=args.attention,
                  reentrant_checkpointing=args.reentrant_checkpointing)
        levers = Levers(checkpointing=args.checkpointing, precision=args.precision,
                        checkpointing_policy=args.checkpointing_policy,
                        optimizer=args.optimizer,
                        optimizer_implementation=args.optimizer_implementation,
                        sharding=sharding, devices=args.devices,
                        local_sgd_every=args.local_sgd)
        device = Device(memory_bytes=parse_bytes(args.gpu_memory),
                        context_bytes=parse_bytes(args.context),
                        link_bytes_per_s=parse_bytes(args.link),
                        peak_flops=parse_peak_tflops(args.peak_tflops))
        device.peak_for(levers.precision)  # a peak for the run's precision, or say so
        load_config(args.model)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    started = time.perf_counter()
    result = plan(args.model, run, levers, device)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
        return 0
    print(format_plan(result))
    print()
    print("cheapest lever combinations that fit (fewest changes to the result first, "
          "then the shortest step):")
    options = cheapest_fitting(args.model, run, levers, device)
    if not options:
        print("  none: more devices, a shorter sequence or a smaller micro-batch")
    for option in options:
        print(f"  {describe_levers(option.levers)}: "
              f"{option.total_bytes / GiB:.1f} GiB, step "
              f"~{(option.compute_seconds + option.link_seconds) * 1000:.0f} ms")
    print(f"(planned in {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # run as helpers.planner, not as __main__: what the disk cache stores then names
    # this module's classes, which every later process can load
    from helpers.planner import main as planner_main

    sys.exit(planner_main())
