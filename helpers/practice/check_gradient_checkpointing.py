"""Checks for notebooks/practice/01_gradient_checkpointing_practice.ipynb (lesson 01).

Each check runs the learner's answer and the intended answer the same way, and judges
the answer by what it does against what the intended one does: bytes kept for backward,
matrix multiplies run again, layers checkpointed, gradients. The hints explain what the
answer did, from the same measurements.
"""
import contextlib
import functools
import inspect
import math
from functools import partial
from unittest import mock

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from helpers.memory import count_ops, measure_memory
from helpers.practice.verdicts import (
    Wrong,
    call_learner,
    checker,
    explaining_warnings,
    on_one_thread,
    require_callable,
    require_done,
    whole_number,
)
from helpers.units import KiB

SAVE_POLICIES = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


def plural(count, word):
    """``1 layer``, ``2 layers``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def listed(names):
    """``a``, ``a and b``, ``a, b and c``."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# --- 1.1: a region that ends before B
# ------------------------------------------------------------------

class ABCExample:
    """Lesson 1's A + B = C example, small: A = sin(x) is cheap, B = x @ W + b is
    expensive, C = A * B.

    As in lesson 1, C is A * B rather than the slide's A + B: the gradient of a sum
    needs neither input, so autograd would keep nothing; a product's backward needs both
    A and B.
    """

    def __init__(self, rows=128, features=256, seed=0):
        generator = torch.Generator().manual_seed(seed)
        # (rows, features)
        self.x = torch.randn(rows, features, generator=generator).requires_grad_()
        self.W = (
            torch.randn(features, features, generator=generator) / features**0.5
        ).requires_grad_()
        self.b = torch.zeros(features, requires_grad=True)

    def loss_region_ends_before_b(self):
        """Exercise 1.1's graph: only A inside the checkpoint; B and C computed outside
        it."""
        # the region: A = sin(x), nothing more
        A = checkpoint(torch.sin, self.x, use_reentrant=False)
        B = torch.addmm(self.b, self.x, self.W)
        return (A * B).sum()

    def loss_without_checkpointing(self):
        A = torch.sin(self.x)
        B = torch.addmm(self.b, self.x, self.W)
        return (A * B).sum()


def region_before_b_measurements():
    """What exercise 1.1's graph keeps and runs, measured: the answer, and what the
    hints compare it with."""
    example = ABCExample()
    # A, B and C: each x's shape, float32
    tensor_kib = example.x.numel() * example.x.element_size() // KiB
    forward, backward = count_ops(example.loss_region_ends_before_b)
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        _, backward_without_early_stop = count_ops(example.loss_region_ends_before_b)
    report = measure_memory(example.loss_region_ends_before_b)
    return {
        "kept_KiB": report.saved_bytes / KiB,
        "A_runs": forward["sin"] + backward.get("sin", 0),
        "B_runs": forward["addmm"] + backward.get("addmm", 0),
        "tensor_KiB": tensor_kib,
        "kept_without_checkpointing_KiB": measure_memory(
            example.loss_without_checkpointing
        ).saved_bytes
        / KiB,
        "A_runs_without_early_stop": forward["sin"]
        + backward_without_early_stop.get("sin", 0),
    }


@checker("1.1")
@on_one_thread
def check_region_before_b_prediction(prediction):
    """``prediction``: {"kept_KiB": n, "A_runs": n, "B_runs": n} for exercise 1.1's
    graph."""
    require_done(prediction, "prediction", "a whole number")
    keys = ("kept_KiB", "A_runs", "B_runs")
    if not isinstance(prediction, dict) or set(prediction) != set(keys):
        raise Wrong('prediction should be a dict with the keys "kept_KiB", '
                    '"A_runs" and "B_runs", '
                    'e.g. {"kept_KiB": 0, "A_runs": 1, "B_runs": 1}.')
    kept = prediction["kept_KiB"]
    if isinstance(kept, float) and 0 < kept < 1:
        raise Wrong('prediction["kept_KiB"] should be a whole number of KiB, but it '
                    f'is {kept}: a fraction below 1 '
                    "looks like MiB. Hint: kept_KiB is in KiB (1 MiB = 1024 KiB).")
    predicted = {
        key: whole_number(prediction[key], f'prediction["{key}"]') for key in keys
    }
    measured = region_before_b_measurements()
    kib = measured["tensor_KiB"]
    # the hints below explain A and B kept: make sure that is what ran
    if measured["kept_KiB"] != 2 * kib:
        raise RuntimeError(f"exercise 1.1's graph kept {measured['kept_KiB']} KiB, "
                           f"not A and B ({2 * kib} KiB)")
    negative = [key for key in keys if predicted[key] < 0]
    if negative:
        raise Wrong(f"{listed(negative)} cannot be negative: kept_KiB counts KiB that "
                    "stay for backward, A_runs "
                    "and B_runs count how many times an op runs.")
    # what is off in the prediction -> why, without giving the measured value away
    hints = {}
    if predicted["kept_KiB"] >= KiB * kib and predicted["kept_KiB"] % (KiB * kib) == 0:
        hints["kept_KiB"] = (f"{predicted['kept_KiB']} is a number of bytes (a whole "
                             f"number of {kib} KiB tensors "
                             f"times {KiB}): kept_KiB is in KiB, 1 KiB = {KiB} bytes.")
    elif predicted["kept_KiB"] < measured["kept_KiB"]:
        hints["kept_KiB"] = (
            ("you predicted that nothing stays. " if predicted["kept_KiB"] == 0
             else f"you counted one tensor of {kib} KiB. "
             if predicted["kept_KiB"] == kib else "")
            + "More stays: checkpoint drops only what is saved *inside* its region, "
            "and mul, outside it, "
            "saves both of its inputs (dC/dA = B, dC/dB = A). Is A dropped when A is "
            "the region's output?"
        )
    # A, B and C: one tensor too many
    elif predicted["kept_KiB"] == measured["kept_KiB"] + kib:
        hints["kept_KiB"] = ("less stays than you predicted: you counted one tensor "
                             "too many. Which op would "
                             "save C, when the backward of sum needs no input?")
    elif predicted["kept_KiB"] > measured["kept_KiB"]:
        hints["kept_KiB"] = (
            "less stays than you predicted. Count only the tensors "
            "created in this forward "
            "that some op's backward reads: x, W and b existed "
            "before and do not count, and "
            "C is read by no backward (sum's backward needs no input)."
        )
    if predicted["A_runs"] != measured["A_runs"]:
        hints["A_runs"] = (
            f"{predicted['A_runs']} would be right without early stop. With it "
            "(the default), the "
            "recomputation stops as soon as every tensor the region saved has been "
            "saved again: which tensor "
            "does sin save, and does it save it before or after it runs?"
            if predicted["A_runs"] == measured["A_runs_without_early_stop"] else
            "count forward once, then ask whether backward must run sin again to get "
            "what the region saved.")
    if predicted["B_runs"] != measured["B_runs"]:
        hints["B_runs"] = ("B is computed outside the region, and only what runs "
                           "inside a checkpoint is recomputed.")
    if hints:
        raise Wrong(f"off: {listed(hints)}. Hint: "
                    + " ".join(f"{key}: {hint}" for key, hint in hints.items()))
    same = measured["kept_KiB"] == measured["kept_without_checkpointing_KiB"]
    return (f"measured: {measured['kept_KiB']:.0f} KiB kept for backward (A and B), "
            f"sin {measured['A_runs']}x, "
            f"addmm {measured['B_runs']}x. " + ("The same bytes as without "
                                                "checkpointing: " if same else "")
            + "A is the region's output, which mul saves outside the region, and "
              "early stop ends "
            "the recomputation before sin runs again (its only saved tensor is its "
            "input x). A region "
            "pays off only when what it drops inside is not needed outside.")


# --- 1.2: the switch in Transformers, a colleague's line fixed
# ------------------------------------------

def tiny_batch(vocab_size, special_ids, seed=0):
    """8 sequences of 64 random ordinary tokens (ids below ``vocab_size``, none in
    ``special_ids``), labels 0, 1, ..."""
    generator = torch.Generator().manual_seed(seed)
    # [PAD], [CLS], ... carry no text: a sentence is made of the other tokens
    ordinary_ids = torch.tensor(sorted(set(range(vocab_size)) - set(special_ids)))
    picks = torch.randint(len(ordinary_ids), (8, 64), generator=generator)
    return {"input_ids": ordinary_ids[picks], "labels": torch.tensor([0, 1] * 4)}


def intended_switch(model):
    """The answer to exercise 1.2: every layer, today's name, non-reentrant, no copy of
    the random-number state."""
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False,
                                         "preserve_rng_state": False}
    )


def checkpointed_layers(model):
    """{name: whether its checkpoint flag is on} for each of the model's layers: what
    the switch set."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return {name: module.gradient_checkpointing
            for name, module in model.named_modules()
            if isinstance(module, GradientCheckpointingLayer)}


def run_and_count_rng_copies(model, batch):
    """(memory report of one forward + backward, how many times it copied the CPU
    random-number state)."""
    copies = []
    real_get_rng_state = torch.get_rng_state

    def counted_get_rng_state():
        # with preserve_rng_state, checkpoint copies the state in forward, and again
        # around the recomputation (torch.random.fork_rng), both through
        # torch.get_rng_state (torch/utils/checkpoint.py)
        copies.append(1)
        return real_get_rng_state()

    with mock.patch.object(torch, "get_rng_state", counted_get_rng_state):
        report = measure_memory(lambda: model(**batch).loss)
    return report, len(copies)


def gradients_by_autograd_grad(model, batch):
    """The parameters' gradients through torch.autograd.grad, which the reentrant
    checkpoint refuses."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(model(**batch).loss, parameters)


@functools.cache
def switch_reference():
    """(batch, kept bytes without checkpointing, kept bytes with the intended switch,
    gradients), measured once."""
    from helpers.data import load_tokenizer
    from helpers.models import build_model

    model = build_model("tiny", seed=0).train()
    batch = tiny_batch(model.config.vocab_size, load_tokenizer().all_special_ids)
    before, _ = run_and_count_rng_copies(model, batch)
    gradients = tuple(p.grad.clone() for p in model.parameters() if p.requires_grad)
    intended_switch(model)
    reference, _ = run_and_count_rng_copies(model, batch)
    return batch, before.saved_bytes, reference.saved_bytes, gradients


class SwitchCalls(list):
    """The names of the checkpointing switches called, in order; ``offload``: whether
    one asked for offload=True."""

    offload = False


# today's name, then the old one
SWITCHES = ("activation_checkpointing_enable", "gradient_checkpointing_enable",
            "activation_checkpointing_disable", "gradient_checkpointing_disable")


@contextlib.contextmanager
def recording_switches():
    """Record, in order, which of PreTrainedModel's checkpointing switches the code
    inside calls.

    The list it yields also says (``.offload``) whether any of those calls asked for
    ``offload=True``.

    Only the calls the code makes itself: the old names call today's
    (transformers/modeling_utils.py, gradient_checkpointing_enable), and that inner call
    is not the learner's. The check must not rely on the old name's FutureWarning alone:
    a learner's warnings filter can silence it. Each switch is replaced on the class by
    a function, so ``_is_overridden`` (which compares ``__func__`` with the class
    attribute) still sees no override and the switches run as they would.
    """
    from transformers import PreTrainedModel

    calls, depth = SwitchCalls(), [0]

    def recorded(name, original):
        signature = inspect.signature(original)

        def switch(self, *args, **kwargs):
            if depth[0] == 0:
                calls.append(name)
                # arguments it does not take: the switch itself says so
                with contextlib.suppress(TypeError):
                    arguments = signature.bind(self, *args, **kwargs).arguments
                    # today's name takes offload=; the old one passes it on in **kwargs
                    calls.offload |= bool(arguments.get(
                        "offload", arguments.get("kwargs", {}).get("offload")))
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        return functools.wraps(original)(switch)

    with contextlib.ExitStack() as patches:
        for name in SWITCHES:
            switch = recorded(name, getattr(PreTrainedModel, name))
            patches.enter_context(mock.patch.object(PreTrainedModel, name, switch))
        yield calls


def dropout_on(model):
    """[(name, p)] of each of the model's dropout layers that drops something."""
    return [(name, module.p) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Dropout) and module.p > 0]


OFFLOAD_HINT = ("the colleague asked for nothing of the sort: leave offload at False, "
                "its default. offload=True asks Transformers to copy what checkpoint "
                "keeps to pinned host memory (torch.autograd.graph.save_on_cpu), to "
                "free an accelerator's memory; this model is on the CPU already")
SWITCH_ERROR_HINTS = (
    # a CPU build of torch: "pin_memory=True requires a CUDA or other accelerator
    # backend; no pinned memory ..."
    ("pin_memory", f"{OFFLOAD_HINT}, and this torch build cannot pin memory."),
    ("ZeroDivisionError", "did you pass every_n_layers=0? Transformers checkpoints "
                          "the layers whose index is a multiple of every_n_layers "
                          "(layer_index % every_n_layers), so it must be at least 1; "
                          "every layer is every_n_layers=1, its default."),
)


@checker("1.2")
@on_one_thread
def check_switch_on_checkpointing(switch_on_checkpointing):
    """``switch_on_checkpointing(model)``: every layer, today's name, non-reentrant,
    preserve_rng_state=False."""
    from helpers.models import build_model

    require_callable(switch_on_checkpointing, "switch_on_checkpointing")
    batch, before_bytes, reference_bytes, reference_grads = switch_reference()
    model = build_model("tiny", seed=0).train()
    with explaining_warnings(
        "gradient_checkpointing_enable", "use_reentrant"
    ) as explained:
        with recording_switches() as switches_called:
            returned = call_learner(switch_on_checkpointing, model,
                                    name="switch_on_checkpointing",
                                    hints=SWITCH_ERROR_HINTS)
        # the exercise is the switch, not the mode: a forgotten model.eval() is not
        # judged here
        model.train()
        yours, rng_copies = call_learner(run_and_count_rng_copies, model, batch,
                                         name="the model's forward and backward after "
                                              "switch_on_checkpointing",
                                         hints=SWITCH_ERROR_HINTS)
        try:
            grads = gradients_by_autograd_grad(model, batch)
            reentrant_error = None
        except RuntimeError as error:
            if "use_reentrant=True" not in str(error):
                raise Wrong("after switch_on_checkpointing, torch.autograd.grad "
                            "raised RuntimeError: "
                            f"{str(error).splitlines()[0]}. Hint: run it on its own "
                            "to see the full "
                            "error.") from None
            grads, reentrant_error = None, error
    deprecated = "gradient_checkpointing_enable" in switches_called or any(
        "gradient_checkpointing_enable" in str(w.message) for w in explained
    )
    torch_warned = any("use_reentrant" in str(w.message) for w in explained)
    layers = checkpointed_layers(model)

    if yours.saved_bytes >= 0.9 * before_bytes:
        nothing = (f"nothing changed: {before_bytes / KiB:.0f} KiB kept for backward "
                   "without checkpointing, "
                   f"{yours.saved_bytes / KiB:.0f} KiB after your call, and "
                   f"{sum(layers.values())} of the "
                   f"{len(layers)} layers checkpointed")
        enabled = [name for name in switches_called if name.endswith("enable")]
        if inspect.isgenerator(returned):
            raise Wrong(f"{nothing}: switch_on_checkpointing returned a generator, so "
                        "its body never ran (a "
                        "function with yield in it runs only when something iterates "
                        "over what it returns). "
                        "Hint: remove the yield; call the switch directly.")
        if enabled and switches_called[-1].endswith("disable"):
            raise Wrong(f"{nothing}: your function switched checkpointing on "
                        f"({enabled[-1]}), then off again "
                        f"({switches_called[-1]}). Hint: leave it on: the one "
                        "call it needs is "
                        "model.activation_checkpointing_enable(...).")
        if not enabled:
            raise Wrong(f"{nothing}: your function called neither "
                        "activation_checkpointing_enable nor its "
                        "old name (and setting an attribute, on the model or its "
                        "config, switches nothing on). "
                        "Hint: call the model's method that enables it, "
                        "model.activation_checkpointing_enable(...).")
        raise Wrong(f"{nothing}, although your function called {enabled[-1]}. Hint: "
                    "call it on the model your "
                    "function is given, and change nothing else.")
    dropping = dropout_on(model)
    if dropping:
        (first, p), more = dropping[0], len(dropping) - 1
        raise Wrong("your function switched dropout on in "
                    f"{plural(len(dropping), 'layer')} ({first}: p={p}"
                    + (f", and {more} more" if more else "") + "), where the tiny "
                                                               "model has none. It "
                    "changes what the model computes, dropout outside the "
                    "checkpointed layers keeps its masks "
                    "for backward, and with preserve_rng_state=False a recomputed "
                    "layer would draw other masks "
                    "than its forward did. Hint: change only the checkpointing "
                    "switch; leave dropout at 0.0.")
    problems = []
    # A CPU build raises above, in save_on_cpu's pinning. A CUDA build runs it, GPU or
    # not (without one, save_on_cpu skips the pinning: torch.cuda.is_available() is
    # False), so offload is judged here.
    if switches_called.offload:
        problems.append(f"you passed offload=True: {OFFLOAD_HINT}")
    if deprecated:
        problems.append("you called gradient_checkpointing_enable, the deprecated "
                        "name (Transformers warns that "
                        "it goes in v6): the exercise asks for today's name, "
                        "activation_checkpointing_enable; its "
                        "keyword is activation_checkpointing_kwargs")
    off = [name for name, on in layers.items() if not on]
    if yours.saved_bytes > 1.01 * reference_bytes and off:
        problems.append(
            f"{len(off)} of the {len(layers)} layers ({listed(off)}) ran "
            "without a checkpoint and kept "
            f"{'its' if len(off) == 1 else 'their'} activations: "
            f"{yours.saved_bytes / KiB:.0f} KiB "
            f"kept for backward, against {reference_bytes / KiB:.0f} KiB "
            "with every layer "
            "checkpointed. The exercise asks for every layer: "
            "every_n_layers must stay 1 (its "
            "default; every_n_layers=2 checkpoints only every second layer)"
        )
    if reentrant_error is not None:
        cause = (
            "your activation_checkpointing_kwargs replaced Transformers' default "
            "{'use_reentrant': False} "
            "instead of adding to it, and PyTorch, told nothing, took its old "
            "reentrant checkpoint (it "
            "warned: 'the use_reentrant parameter should be passed explicitly')"
            if torch_warned
            else "your kwargs asked for the reentrant checkpoint (use_reentrant=True)"
        )
        problems.append(f"the reentrant checkpoint ran: {cause}. torch.autograd.grad "
                        "then fails ('When "
                        "use_reentrant=True, torch.utils.checkpoint is incompatible "
                        "with .grad()'); put "
                        "\"use_reentrant\": False in the dict yourself")
    if rng_copies:
        problems.append("checkpoint copied the random-number state "
                        f"{plural(rng_copies, 'time')} in one forward "
                        "and backward pass (to replay it when it recomputes a layer): "
                        "preserve_rng_state is True "
                        "unless you pass \"preserve_rng_state\": False in "
                        "activation_checkpointing_kwargs")
    if problems:
        raise Wrong(f"{plural(len(problems), 'thing')} to fix. Hint: "
                    + "; ".join(problems) + ".")
    if any(g is None for g in grads) or not all(
        torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, reference_grads)
    ):
        raise Wrong("the gradients changed. Hint: switching checkpointing on must not "
                    "change what the model "
                    "computes.")
    if abs(yours.saved_bytes - reference_bytes) > 0.01 * reference_bytes:
        raise Wrong("every layer has its checkpoint on, yet it kept "
                    f"{yours.saved_bytes / KiB:.0f} KiB for "
                    f"backward, against {reference_bytes / KiB:.0f} KiB with the "
                    "intended switch: something else "
                    "your function changed in the model keeps more or less. Hint: "
                    "switch it on with "
                    "activation_checkpointing_enable, and change nothing "
                    "else in the model.")
    return (f"{sum(layers.values())} of {len(layers)} layers checkpointed: "
            f"{yours.saved_bytes / KiB:.0f} KiB kept "
            f"for backward instead of {before_bytes / KiB:.0f} KiB, the random-number "
            "state never copied, and "
            "torch.autograd.grad "
            "gives the same gradients. Skipping the copy is safe here only because "
            "this model has no dropout: "
            "with dropout, the recomputed masks must be the forward's.")


# --- 1.3 and 1.4: a gated MLP block (Llama's, with biases)
# ----------------------------------------------

class GatedBlock(torch.nn.Module):
    """A residual gated MLP (SwiGLU, as in Llama): h + down(silu(gate(h)) * up(h)),
    ``hidden`` wide inside."""

    def __init__(self, width, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(width, hidden)
        self.up_proj = torch.nn.Linear(width, hidden)
        self.down_proj = torch.nn.Linear(hidden, width)

    def forward(self, h):  # h: (rows, width)
        gate = self.gate_proj(h)  # (rows, hidden), a matrix multiply: aten.addmm
        up = self.up_proj(h)      # (rows, hidden), aten.addmm
        # down: (rows, width), aten.addmm
        return h + self.down_proj(torch.nn.functional.silu(gate) * up)


def make_gated_blocks(n_blocks, width, hidden, seed=0):
    """``n_blocks`` gated blocks whose weights depend only on ``seed``, leaving the
    learner's random state alone."""
    # the layers draw from the global generator: restore it after
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.ModuleList(GatedBlock(width, hidden) for _ in range(n_blocks))


# The forward ops of one GatedBlock that make a tensor of their own (`t`, a view of a
# weight, makes none), in order, and what each one is: the names the hints of 1.3 use.
GATED_TENSORS = [("addmm", "gate"), ("addmm", "up"), ("silu", "silu(gate)"),
                 ("mul", "silu(gate) * up"), ("addmm", "down_proj's output"),
                 ("add", "the block's output")]
# the matmul outputs backward reads: silu's backward reads gate, mul's reads up
NEEDED = {"gate", "up"}


def keep_gate_and_up(ctx, op, *args, **kwargs):
    """The answer to exercise 1.3: save the two matmuls whose outputs are hidden wide,
    recompute the rest."""
    if (op == torch.ops.aten.addmm.default
        and ctx.op_output.shape[-1] == GatedExample.HIDDEN):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class GatedExample:
    """Exercise 1.3's region: one GatedBlock inside one checkpoint, on a (rows, width)
    input."""

    ROWS, WIDTH, HIDDEN = 128, 64, 256

    def __init__(self, seed=0):
        self.block = make_gated_blocks(1, self.WIDTH, self.HIDDEN, seed)[0]
        self.h = torch.randn(
            self.ROWS, self.WIDTH, generator=torch.Generator().manual_seed(seed + 1)
        )

    def loss(self, policy=None):
        """The sum of the block's output, the block checkpointed (with ``policy``, if
        given) or, for None, plainly."""
        if policy is None:
            return self.block(self.h).sum()
        context_fn = partial(create_selective_checkpoint_contexts, policy)
        return checkpoint(
            self.block, self.h, use_reentrant=False, context_fn=context_fn
        ).sum()

    def gradients(self, loss_fn):
        self.block.zero_grad(set_to_none=True)
        loss_fn().backward()
        return [p.grad.clone() for p in self.block.parameters()]

    def measure(self, loss_fn):
        """(bytes kept for backward, forward matmuls run again in backward)."""
        self.block.zero_grad(set_to_none=True)
        kept = measure_memory(loss_fn).saved_bytes
        _, backward = count_ops(loss_fn)
        # autograd computes a Linear's gradients with mm: an addmm in backward is a
        # forward matmul run again
        return kept, backward.get("addmm", 0)


@functools.cache
def gated_reference():
    """(bytes kept and matmuls run again with the intended policy, bytes kept without
    checkpointing), measured once."""
    example = GatedExample()
    kept, rerun = example.measure(partial(example.loss, keep_gate_and_up))
    return kept, rerun, example.measure(example.loss)[0]


def recording(policy):
    """Wrap the learner's policy: remember what it returned for each op, forward by
    forward, and reject non-policies.

    Returns (the wrapped policy, a function that runs a loss as a new forward, the
    forwards' decisions: one list of (op name, CheckpointPolicy) per forward, in order).
    """
    forwards = []

    def recorded(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        # PyTorch accepts True (save) and False (recompute)
        if isinstance(decision, bool):
            decision = (CheckpointPolicy.MUST_SAVE if decision
                        else CheckpointPolicy.PREFER_RECOMPUTE)
        if not isinstance(decision, CheckpointPolicy):
            raise Wrong(f"your policy returned {decision!r} for {op}; it must return "
                        "a CheckpointPolicy, e.g. "
                        "CheckpointPolicy.MUST_SAVE or "
                        "CheckpointPolicy.PREFER_RECOMPUTE, for every op. "
                        "Hint: is there a return on every path?")
        forwards[-1].append((op.overloadpacket.__name__, decision))
        return decision

    def as_new_forward(loss_fn):
        def loss():
            forwards.append([])
            return loss_fn()
        return loss

    return recorded, as_new_forward, forwards


def tensor_decisions(decisions):
    """{name (from GATED_TENSORS): CheckpointPolicy} of one forward's decisions, in the
    block's order."""
    # `t` views a weight: no memory
    making = [(name, decision) for name, decision in decisions if name != "t"]
    if [name for name, _ in making] != [op for op, _ in GATED_TENSORS]:
        raise RuntimeError(f"the gated block ran {[name for name, _ in making]}, "
                           f"not {[op for op, _ in GATED_TENSORS]}")
    return {
        tensor: decision for (_, tensor), (_, decision) in zip(GATED_TENSORS, making)
    }


def saved_tensor_names(decisions):
    """The names (from GATED_TENSORS) of the block's tensors that one forward's
    decisions saved."""
    return [tensor for tensor, decision in tensor_decisions(decisions).items()
            if decision in SAVE_POLICIES]


def described_saves(saved):
    return f"saved {listed(saved)}" if saved else "saved no tensor"


OFFLOAD_POLICIES = (CheckpointPolicy.MUST_CPU_OFFLOAD,
                    CheckpointPolicy.PREFER_CPU_OFFLOAD)


@checker("1.3")
@on_one_thread
def check_gated_block_policy(policy):
    """``policy(ctx, op, *args, **kwargs)``: no matmul run again in backward, nothing
    kept that backward won't read."""
    require_callable(policy, "keep_what_backward_reads")
    example = GatedExample()
    recorded, as_new_forward, forwards = recording(policy)
    yours_loss = as_new_forward(partial(example.loss, recorded))
    name = "keep_what_backward_reads (inside checkpoint)"
    grads = call_learner(example.gradients, yours_loss, name=name)
    reference_kept, reference_rerun, without_kept = gated_reference()
    kept, rerun = call_learner(example.measure, yours_loss, name=name)
    # the policy runs in forward only, never in the recomputation
    # (torch/utils/checkpoint.py, SelectiveCheckpointContext's docstring): each forward
    # above decided each op of the block once
    saves = [saved_tensor_names(decisions) for decisions in forwards]
    if any(later != saves[0] for later in saves):
        what = [listed(saved) if saved else "no tensor" for saved in saves]
        raise Wrong("your policy decided differently each time the block ran "
                    f"forward: it saved {what[0]} in "
                    f"the first forward, then {', then '.join(what[1:])}. It keeps "
                    "something between calls "
                    "(a counter that is never reset?), but PyTorch calls it for every "
                    "op of every forward, and "
                    "training runs the block's forward at every step. Hint: decide "
                    "from op and ctx.op_output "
                    "(or args) alone, the same way every time.")
    saved, decided = saves[0], tensor_decisions(forwards[0])
    if not all(torch.allclose(g, r, atol=1e-6)
               for g, r in zip(grads, example.gradients(example.loss))):
        raise Wrong("the gradients differ from those without checkpointing. Hint: the "
                    "policy must only decide "
                    "what to save; it must not change any tensor.")
    kib = example.ROWS * example.HIDDEN * 4 // KiB
    found, hints = [], []
    if rerun > reference_rerun:
        missing = sorted(NEEDED - set(saved))
        if not missing:
            raise RuntimeError(f"backward ran {rerun} matmuls again although the "
                               f"policy saved {saved}")
        offloaded = [tensor for tensor, decision in decided.items()
                     if decision in OFFLOAD_POLICIES]
        found.append(f"backward ran {plural(rerun, 'matmul')} again (your policy "
                     f"{described_saves(saved)})")
        if offloaded:
            hints.append("your policy returned "
                         f"{listed(sorted({decided[t].name for t in offloaded}))} for "
                         f"{listed(offloaded)}: outside torch.compile, selective "
                         "checkpointing stores only what a "
                         "policy marks MUST_SAVE or PREFER_SAVE and recomputes "
                         "everything else, offload included "
                         "(torch/utils/checkpoint.py, _CachingTorchDispatchMode); "
                         "return MUST_SAVE")
        hints.append("silu's backward reads gate and mul's backward reads up: "
                     f"{listed(missing)} must be saved, "
                     "or the recomputation runs "
                     f"{'its matmul' if len(missing) == 1 else 'their matmuls'} again")
        made_from_them = [
            tensor for tensor in saved if tensor in ("silu(gate)", "silu(gate) * up")
        ]
        if made_from_them:
            hints.append(f"saving {listed(made_from_them)}, computed from gate and "
                         "up, does not replace them: "
                         "silu's and mul's backward still read gate and up themselves")
        elif not saved and not offloaded:
            ops_seen = sorted({name for decisions in forwards for name, _ in decisions})
            hints.append(f"your policy saw the ops {listed(ops_seen)}; a "
                         "Linear runs as "
                         "torch.ops.aten.addmm.default (compare op with it, not "
                         "with torch.addmm)")
    extra = [tensor for tensor in saved if tensor not in NEEDED]
    if kept > reference_kept * 1.01:
        found.append(f"{kept / KiB:.0f} KiB stayed for backward, against "
                     f"{reference_kept / KiB:.0f} KiB for gate "
                     f"and up alone ({kib} KiB each)"
                     + (f": it also saved {listed(extra)}" if extra else ""))
        reasons = {"down_proj's output": "no backward reads down_proj's output (the "
                                         "residual add after it saves "
                                         "nothing)",
                   "silu(gate)": "silu(gate) is cheap to recompute from gate",
                   "silu(gate) * up": "silu(gate) * up is cheap to recompute "
                                      "from gate and up",
                   "the block's output": "nothing after the block saves its output"}
        hints.extend(reasons[tensor] for tensor in extra)
        if extra:
            hints.append("save only the addmm outputs that backward reads: "
                         "ctx.op_output (or args) tells "
                         "gate and up from down_proj by shape")
    if found:
        raise Wrong("; ".join(found) + ". Hint: " + "; ".join(hints) + ".")
    if kept < reference_kept * 0.99:
        raise RuntimeError(f"the policy kept {kept} bytes, less than gate and up "
                           f"({reference_kept}), "
                           "with no matmul run again")
    return (f"{kept / KiB:.0f} KiB kept for backward (gate and up, {kib} KiB each; "
            f"{without_kept / KiB:.0f} KiB "
            "without checkpointing), no matmul run again in backward, and identical "
            "gradients. down_proj's "
            "output need not be kept: early stop ends the recomputation before "
            "down_proj runs, as soon as it "
            "has saved its input.")


# --- 1.4: a stack of gated blocks in segments
# --------------------------------------------------------

STACK_WIDTH, STACK_HIDDEN, STACK_ROWS = 32, 128, 512
# (blocks, segments): one that divides evenly, and two that do not: 7 in 3 leaves one
# block over, 6 in 4 two (a last segment that takes the rest passes 7 in 3 as 2, 2, 3,
# but makes 1, 1, 1, 3 of 6 in 4)
STACK_CASES = [(8, 4), (7, 3), (6, 4)]
# what PyTorch says when the reentrant path runs
REENTRANT_WARNINGS = ("requires_grad=True", "use_reentrant")


def run_blocks(blocks, h):
    """The blocks one after the other."""
    for block in blocks:
        h = block(h)
    return h


def balanced_sizes(n_blocks, segments):
    """``segments`` lengths that differ by at most one and add up to ``n_blocks``, the
    longest last."""
    shorter, longer = divmod(n_blocks, segments)
    return [shorter] * (segments - longer) + [shorter + 1] * longer


def every_segment_checkpointed(blocks, h, segments):
    """The reference answer to exercise 1.4: ``segments`` balanced segments, each in its
    own checkpoint.

    Of the balanced orders, the longest segments last gives the highest peak: backward
    recomputes the last segment first, while the inputs kept for all the others are
    still alive. So no balanced answer peaks higher.
    """
    start = 0
    for size in balanced_sizes(len(blocks), segments):
        h = checkpoint(run_blocks, blocks[start:start + size], h, use_reentrant=False)
        start += size
    return h


class BlockCalls:
    """Records block calls through forward pre-hooks: whether autograd was on at each
    call in forward, and which blocks ran during backward (recomputed), in order."""

    def __init__(self, blocks):
        self.blocks, self.in_backward, self.recomputed, self.forward_grad_enabled = (
            blocks,
            False,
            [],
            [],
        )
        self.handles = [block.register_forward_pre_hook(partial(self.called, i))
                        for i, block in enumerate(blocks)]

    def called(self, index, module, args):
        if self.in_backward:
            self.recomputed.append(index)
        else:
            self.forward_grad_enabled.append(torch.is_grad_enabled())

    def remove(self):
        for handle in self.handles:
            handle.remove()


def recomputed_regions(recomputed):
    """The recomputed regions, each a list of consecutive block indices, in the stack's
    order.

    Backward recomputes the last segment first, so two segments never follow each other
    in index order.
    """
    regions = []
    for index in recomputed:
        if regions and index == regions[-1][-1] + 1:
            regions[-1].append(index)
        else:
            regions.append([index])
    return sorted(regions)


def stack_measurements(forward, blocks, h, segments):
    """(memory report, gradients, blocks recomputed in backward in order, blocks whose
    insides were kept)."""
    blocks.zero_grad(set_to_none=True)
    calls = BlockCalls(blocks)

    def loss():
        loss = forward(blocks, h, segments).square().mean()
        # every block call from now on is a recomputation in backward
        calls.in_backward = True
        return loss

    try:
        report = measure_memory(loss)
    finally:
        calls.remove()
    insides_kept = [i for i in range(len(blocks)) if report.kept("silu", i)]
    return report, [p.grad for p in blocks.parameters()], calls.recomputed, insides_kept


@checker("1.4")
@on_one_thread
def check_checkpointed_segments(checkpointed_forward):
    """``checkpointed_forward(blocks, h, segments)``: the blocks in ``segments``
    balanced checkpointed segments."""
    require_callable(checkpointed_forward, "checkpointed_forward")
    # the message of the last case, if every case passes
    for n_blocks, segments in STACK_CASES:
        message = judge_stack_case(checkpointed_forward, n_blocks, segments)
    return message


@functools.cache
def stack_reference(n_blocks, segments):
    """(report without checkpointing, report of the reference answer, the gradients),
    measured once per case."""
    blocks, h = stack_case(n_blocks)
    without, gradients, _, _ = stack_measurements(
        lambda b, x, s: run_blocks(b, x), blocks, h, segments
    )
    reference, _, _, _ = stack_measurements(
        every_segment_checkpointed, blocks, h, segments
    )
    return without, reference, tuple(g.clone() for g in gradients)


def stack_case(n_blocks):
    """``n_blocks`` gated blocks and their input, the same at every call."""
    blocks = make_gated_blocks(n_blocks, STACK_WIDTH, STACK_HIDDEN)
    return blocks, torch.randn(
        STACK_ROWS, STACK_WIDTH, generator=torch.Generator().manual_seed(1)
    )


def blocks_named(indices):
    """``block 3``, ``blocks 0 and 1``."""
    indices = list(indices)
    return f"block{'' if len(indices) == 1 else 's'} {listed(map(str, indices))}"


LATE_BINDING_HINT = ("a checkpoint must recompute exactly what it ran in forward. A "
                     "lambda or def made inside the "
                     "loop reads the loop's variables (start, end, the segment) when "
                     "backward calls it, after the "
                     "loop has moved on: pass the segment as an argument, "
                     "checkpoint(run, blocks[start:end], h, "
                     "use_reentrant=False), or bind it, lambda x, "
                     "part=blocks[start:end]: run(part, x).")


def recomputation_described(times, n_blocks):
    """``blocks 6 and 7 4 times each, blocks 0, 1, 2, 3, 4 and 5 never``: how often
    backward recomputed each block."""
    by_count = {}
    for index in range(n_blocks):
        by_count.setdefault(times.get(index, 0), []).append(index)
    parts = []
    for count, indices in sorted(by_count.items(), reverse=True):
        each = "" if len(indices) == 1 else " each"
        parts.append(
            f"{blocks_named(indices)} "
            + ("never" if count == 0 else "once" + each if count == 1
               else "twice" + each if count == 2 else f"{count} times{each}")
        )
    return listed(parts)


def ran_reentrant_checkpoint(output):
    """Whether ``output``'s graph holds a reentrant checkpoint (its node is
    CheckpointFunction's backward)."""
    seen, todo = set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        todo.extend(next_node for next_node, _ in node.next_functions)
    return False


def judge_stack_case(checkpointed_forward, n_blocks, segments):
    """The verdict's message for one (blocks, segments) case, or Wrong."""
    blocks, h = stack_case(n_blocks)
    case = f"with {n_blocks} blocks and segments={segments}"
    with torch.no_grad():
        expected_output = run_blocks(blocks, h)
    forward_calls = BlockCalls(blocks)
    try:
        with explaining_warnings(*REENTRANT_WARNINGS) as reentrant_warnings:
            output = call_learner(
                checkpointed_forward, blocks, h, segments, name="checkpointed_forward"
            )
    except Wrong as wrong:
        raise Wrong(f"{case}, {wrong}") from None
    finally:
        forward_calls.remove()
    if not isinstance(output, torch.Tensor) or output.shape != expected_output.shape:
        raise Wrong(
            f"{case}, checkpointed_forward should return the last block's "
            "output, a tensor of shape "
            f"{tuple(expected_output.shape)}, but returned "
            f"{type(output).__name__}"
            f"{tuple(output.shape) if isinstance(output, torch.Tensor) else ''}."
        )
    if not torch.allclose(output.detach(), expected_output, atol=1e-5):
        raise Wrong(f"{case}, its output differs from running the blocks one after "
                    "the other. Hint: every block "
                    "must run exactly once, in order, each on the previous one's "
                    "output; check where your "
                    "segments start and end (none left out, none twice).")
    reentrant_hint = ("PyTorch warned that no input requires grad: without "
                      "use_reentrant=False, checkpoint takes "
                      "the old reentrant path, which needs an input that requires "
                      "grad, and h does not. Hint: pass "
                      "use_reentrant=False.")
    if not output.requires_grad:
        ran_with_autograd = forward_calls.forward_grad_enabled and all(
            forward_calls.forward_grad_enabled
        )
        raise Wrong(f"{case}, its output does not require a gradient, so the blocks' "
                    "weights cannot learn. " + (
            reentrant_hint if reentrant_warnings else
            "The blocks ran with autograd on, but the tensor you returned is cut off "
            "from them: did you return "
            "output.detach() (or .data)? Hint: return the last segment's output as "
            "checkpoint gives it."
            if ran_with_autograd else
            "Hint: do not run the blocks under torch.no_grad(); checkpoint "
            "handles that itself."))
    reentrant = ran_reentrant_checkpoint(output)
    del output
    block_input_kib = STACK_ROWS * STACK_WIDTH * 4 / KiB
    if h.requires_grad:
        raise Wrong(
            f"{case}, your function made the check's h require a gradient "
            "(h.requires_grad_()): it changed "
            "its caller's tensor, which after backward holds an h.grad "
            f"({block_input_kib:.0f} KiB) that "
            "nobody asked for. "
            + ("The reentrant checkpoint you ran needs an input that requires "
               "grad; the non-reentrant one " "does not. " if reentrant else "")
            + f"Hint: {'pass use_reentrant=False and ' if reentrant else ''}leave h "
              "as it is."
        )
    without, reference, reference_grads = stack_reference(n_blocks, segments)
    try:
        with explaining_warnings(*REENTRANT_WARNINGS) as measuring_warnings:
            yours, grads, recomputed, insides_kept = call_learner(
                stack_measurements,
                checkpointed_forward,
                blocks,
                h,
                segments,
                name="checkpointed_forward (forward and backward)",
                hints=(("CheckpointError", LATE_BINDING_HINT),),
            )
    except Wrong as wrong:
        raise Wrong(f"{case}, {wrong}") from None
    if any(g is None for g in grads):
        no_gradient = [i for i, block in enumerate(blocks)
                       if any(p.grad is None for p in block.parameters())]
        raise Wrong(
            f"{case}, {blocks_named(no_gradient)} got no "
            "gradient. "
            + (reentrant_hint if reentrant_warnings or measuring_warnings
               else "Hint: do not detach h, and do not run blocks "
               "under torch.no_grad().")
        )
    times = {index: recomputed.count(index) for index in set(recomputed)}
    outside = set(insides_kept)
    recomputed_as_run = all(
        times.get(i, 0) == (0 if i in outside else 1) for i in range(n_blocks)
    )
    if not all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, reference_grads)):
        raise Wrong(f"{case}, the blocks' gradients differ from those "
                    "without checkpointing" + (
            f": backward recomputed {recomputation_described(times, n_blocks)}, not "
            "each block once as forward "
            f"ran it. Hint: {LATE_BINDING_HINT}" if not recomputed_as_run else
            ". Hint: checkpoint recomputes the same values; change nothing in the "
            "blocks or in h."))
    measured = (f"{yours.saved_bytes / KiB:.0f} KiB kept for backward and a peak of "
                f"{yours.peak_activation_bytes / KiB:.0f} KiB, against "
                f"{reference.saved_bytes / KiB:.0f} KiB and "
                f"{reference.peak_activation_bytes / KiB:.0f} KiB with {segments} "
                "balanced checkpointed segments")
    if insides_kept:
        one = len(insides_kept) == 1
        trailing = insides_kept == list(range(n_blocks - len(insides_kept), n_blocks))
        leading = insides_kept == list(range(len(insides_kept)))
        if trailing and not leading:
            blocks = "This is the last block" if one else "These are the last blocks"
            where = (f" {blocks}: checkpoint_sequential "
                     "leaves its last segment without a checkpoint (its loop wraps "
                     "segments - 1 of them, "
                     "torch/utils/checkpoint.py); wrap every segment yourself.")
        elif leading and not trailing:
            blocks = "This is the first block" if one else "These are the first blocks"
            where = (f" {blocks}: does your loop " "start wrapping at block 0?")
        else:
            where = ""
        if 1 in balanced_sizes(n_blocks, segments):
            where += (" Here some segments have a single block: each needs its "
                      "checkpoint too.")
        raise Wrong(f"{case}, {blocks_named(insides_kept)} ran outside any checkpoint "
                    f"and kept {'its' if one else 'their'} insides (gate, up, "
                    f"silu...) for backward: {measured}. "
                    "Hint: every block must run inside one of the checkpointed "
                    f"segments.{where}")
    if any(count > 1 for count in times.values()):
        raise Wrong(f"{case}, backward recomputed "
                    f"{recomputation_described(times, n_blocks)}, not each block "
                    f"once: {measured}. A checkpoint inside another checkpoint's "
                    "region runs again when the outer "
                    "one is recomputed, then once more for its own backward. Hint: "
                    "one checkpoint per segment, "
                    "none inside it and none around them all.")
    regions = recomputed_regions(recomputed)
    sizes = [len(region) for region in regions]
    if len(regions) != segments and sizes and sum(sizes) == n_blocks:
        ceil = math.ceil(n_blocks / segments)
        raise Wrong(
            f"{case}, you made {plural(len(regions), 'checkpointed region')} "
            "of "
            f"{listed(map(str, sizes))} blocks, not {segments}: "
            f"{measured}. Hint: "
            + ("each region keeps its input, so more regions keep more; "
               if len(regions) > segments
               else "a longer region is recomputed all at once, so its insides are "
               "alive together; " if max(sizes) > ceil else "")
            + f"split the {n_blocks} blocks into exactly {segments} segments"
            + (f" ({n_blocks} // {segments} = "
               f"{plural(n_blocks // segments, 'block')} per segment leaves "
               f"{n_blocks % segments} over)" if n_blocks % segments else "")
            + (f"; pieces of ceil({n_blocks} / {segments}) = {ceil} blocks "
               f"make only {len(regions)}"
               if len(regions) < segments and all(size == ceil for size in sizes[:-1])
               else "")
            + "."
        )
    if sizes and max(sizes) - min(sizes) > 1:
        longest, ceil = max(sizes), math.ceil(n_blocks / segments)
        higher = yours.peak_activation_bytes > 1.01 * reference.peak_activation_bytes
        balanced = listed(map(str, balanced_sizes(n_blocks, segments)))
        if higher:
            why = ("backward recomputes a segment all at once, so the longest "
                   f"({longest} blocks) sets the peak: "
                   f"balance them, none longer than {ceil} blocks "
                   f"({balanced}, in any order).")
        else:
            short_count = 2 * segments - 2  # pieces of 2 make segments - 1 of them
            why = (
                "the exercise asks for balanced segments, whose lengths differ by "
                f"at most one: {n_blocks} "
                f"blocks in {segments} segments are {balanced}, in any order. "
                f"Pieces of ceil({n_blocks} / "
                f"{segments}) = {ceil} blocks leave the last one short here"
                + (", and for some numbers of blocks make too few segments "
                   f"({short_count} blocks in pieces "
                   f"of 2 make {segments - 1}, not {segments})" if segments >= 3
                   else "")
                + "."
            )
        raise Wrong(f"{case}, your segments have {listed(map(str, sizes))} blocks: "
                    f"{measured}. Hint: {why}")
    if (reentrant
        and yours.peak_activation_bytes > 1.01 * reference.peak_activation_bytes):
        raise Wrong(f"{case}, your segments ran the reentrant checkpoint "
                    f"(use_reentrant=True): {measured}. Its "
                    "backward recomputes each segment and runs a backward of its own "
                    "over it (CheckpointFunction "
                    "in torch/utils/checkpoint.py), and holds more at once than the "
                    "non-reentrant one, which "
                    "PyTorch recommends. Hint: pass use_reentrant=False.")
    if (abs(yours.saved_bytes - reference.saved_bytes) > 0.01 * reference.saved_bytes
            or yours.peak_activation_bytes > 1.01 * reference.peak_activation_bytes):
        raise Wrong(f"{case}, your {segments} segments of {listed(map(str, sizes))} "
                    "blocks are balanced, yet: "
                    f"{measured}. Hint: checkpoint each segment once, with "
                    "checkpoint(run, segment, h, "
                    "use_reentrant=False), and keep no other tensor alive.")
    others = listed(
        f"{n} in {s}" for n, s in STACK_CASES if (n, s) != (n_blocks, segments)
    )
    return (f"with {n_blocks} blocks in {segments} segments, as with {others}: "
            f"{yours.saved_bytes / KiB:.0f} KiB kept for backward ({segments} x "
            f"{block_input_kib:.0f} KiB: the "
            "input of every segment but the first, and the stack's output) instead of "
            f"{without.saved_bytes / KiB:.0f} KiB, a peak of "
            f"{yours.peak_activation_bytes / KiB:.0f} KiB instead "
            f"of {without.peak_activation_bytes / KiB:.0f} KiB, and "
            "identical gradients.")
