"""Checks for notebooks/practice/01_gradient_checkpointing_practice.ipynb (lesson
01), on the practice core: the bytes kept for backward, the operations run again, what
a policy saved, which blocks were recomputed together, and the gradients, measured."""
import functools
import inspect
import itertools
import math
from functools import partial

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from helpers.memory import count_ops, measure_memory
from helpers.practice import core
from helpers.practice.core import Wrong
from helpers.practice.fixtures import fixed_batches, tiny_model
from helpers.units import KiB

# --- 1.1: a region that ends before B ---------------------------------------------


class ABCExample:
    """Lesson 1's example, small: A = sin(x) cheap, B = x @ W + b expensive, C = A * B
    (a product: its backward reads both A and B; a sum's would read neither)."""

    def __init__(self, rows=128, features=256, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, features, generator=generator).requires_grad_()
        self.W = (torch.randn(features, features, generator=generator)
                  / features**0.5).requires_grad_()
        self.b = torch.zeros(features, requires_grad=True)

    def loss_region_ends_before_b(self):
        A = checkpoint(torch.sin, self.x, use_reentrant=False)  # the region: A only
        B = torch.addmm(self.b, self.x, self.W)
        return (A * B).sum()


@functools.cache
def region_measurements():
    """{"kept_KiB", "A_runs", "B_runs"} of exercise 1.1's graph, measured."""
    example = ABCExample()
    forward, backward = count_ops(example.loss_region_ends_before_b)
    kept = measure_memory(example.loss_region_ends_before_b).saved_bytes
    return {"kept_KiB": kept / KiB, "A_runs": forward["sin"] + backward.get("sin", 0),
            "B_runs": forward["addmm"] + backward.get("addmm", 0)}


def predicted_or_measured(prediction, config):
    """Each predicted number, or "as measured" where it is what the graph did."""
    keys = ("kept_KiB", "A_runs", "B_runs")
    if not isinstance(prediction, dict) or set(prediction) != set(keys):
        raise Wrong('prediction should be a dict with the keys "kept_KiB", "A_runs" '
                    'and "B_runs", e.g. {"kept_KiB": 0, "A_runs": 1, "B_runs": 1}.')
    numbers = {key: core.as_number(prediction[key], f'prediction["{key}"]',
                                   whole=key != "kept_KiB") for key in keys}
    return {key: "as measured" if number == region_measurements()[key] else number
            for key, number in numbers.items()}


MUL_SAVES = ("checkpoint drops only what is saved inside its region; mul, outside it, "
             "saves both its inputs (dC/dA = B, dC/dB = A).")
REGION = core.Exercise(
    "1.1", measure=predicted_or_measured, name="prediction",
    intended={"kept_KiB": 2 * 128, "A_runs": 1, "B_runs": 1},  # A and B, 128 KiB each
    mistakes=[(f'kept_KiB = {kept}: {hint}', {"kept_KiB": kept, "A_runs": 1,
                                              "B_runs": 1}) for kept, hint in [
        (0, "more stays: " + MUL_SAVES), (128, "more stays: " + MUL_SAVES),
        (3 * 128, "one tensor too many: which op would save C? sum's backward reads no "
         "input."), (2 * 128 * 1024, "that is bytes: 1 KiB = 1024 bytes."),
        (0.25, "that is MiB: 1 MiB = 1024 KiB.")]] + [
        ("A_runs = 2 would be right without early stop; with it, recomputation stops "
         "once what the region saved is saved again: sin saves its input x.",
         {"kept_KiB": 256, "A_runs": 2, "B_runs": 1}),
        ("B_runs = 2: B runs outside the region; only a checkpoint's inside is "
         "recomputed.", {"kept_KiB": 256, "A_runs": 1, "B_runs": 2})],
    describe="kept_KiB counts what forward made and some backward reads; A_runs and "
    "B_runs count forward once, then what backward runs again.",
    correct=lambda got, config: (
        "measured: {kept_KiB:.0f} KiB kept (A and B), sin {A_runs}x, addmm {B_runs}x, "
        "as without checkpointing: mul keeps A outside the region, and early stop "
        "ends the recomputation before sin. A region pays off only when what it drops "
        "is not needed outside.").format(**region_measurements()))


@core.checker(REGION)
def check_region_before_b_prediction(prediction):
    """``prediction``: {"kept_KiB": n, "A_runs": n, "B_runs": n} for 1.1's graph."""


# --- 1.2: the switch in Transformers, a colleague's line fixed ----------------------

def backward_gradients(model, batch, seed=0):
    """The gradients of one forward and backward, any dropout drawn from ``seed``."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model(**batch).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


# the same gradients, float32 rounding aside
all_close = core.close(rel=1e-5, abs_=1e-6)


def switch_run(switch, batch_size):
    """The tiny DistilBERT after ``switch(model)``: KiB kept for backward, gradients
    through torch.autograd.grad, whether backward replays the forward's dropout masks
    (the random-number state preserved), the old name's warning, what it returned."""
    model, batch = tiny_model().train(), fixed_batches(batch_size, 1)[0]
    plain = backward_gradients(model, batch)
    with core.explaining_warnings("gradient_checkpointing_enable",
                                  "use_reentrant") as warned:
        returned = core.learner(switch, model)
        model.train()
        kept = core.learner(measure_memory, lambda: model(**batch).loss).saved_bytes
        try:
            loss, parameters = model(**batch).loss, list(model.parameters())
            same = all_close(torch.autograd.grad(loss, parameters), plain)
        except RuntimeError as error:
            if "use_reentrant=True" not in str(error):
                raise
            same = "refused: the reentrant checkpoint ran"
        for module in model.modules():  # dropout on: which masks does backward use?
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.5
        checkpointed = backward_gradients(model, batch)
        model.activation_checkpointing_disable()
        replayed = all_close(checkpointed, backward_gradients(model, batch))
    old_name = any("gradient_checkpointing_enable" in str(w.message) for w in warned)
    return {"kept_KiB": round(kept / KiB), "autograd.grad": same,
            "rng replayed": replayed, "old name": old_name,
            "generator": inspect.isgenerator(returned)}


def switch_with(name="activation_checkpointing_enable", **kwargs):
    """switch_on_checkpointing as a learner writes it: one call of the switch."""
    def switch_on_checkpointing(model):
        getattr(model, name)(**kwargs)
    return switch_on_checkpointing


def set_an_attribute(model):
    model.config.gradient_checkpointing = True


def switch_in_a_generator(model):
    yield model.activation_checkpointing_enable(activation_checkpointing_kwargs={
        "use_reentrant": False, "preserve_rng_state": False})


REENTRANT = ("the reentrant checkpoint ran: your kwargs replaced Transformers' "
             "{'use_reentrant': False}. Hint: put \"use_reentrant\": False in them")
OLD_NAME = ("gradient_checkpointing_enable is the deprecated name. Hint: "
            "activation_checkpointing_enable(activation_checkpointing_kwargs=...)")
BOTH = {"use_reentrant": False, "preserve_rng_state": False}
SWITCH = core.Exercise(
    "1.2", measure=switch_run, configs=(4, 2), name="switch_on_checkpointing",
    intended=switch_with(activation_checkpointing_kwargs=BOTH),
    mistakes=[
        (f"two things to fix: {OLD_NAME}; and {REENTRANT}.", switch_with(
            "gradient_checkpointing_enable",
            gradient_checkpointing_kwargs={"preserve_rng_state": False})),
        (f"{OLD_NAME}.", switch_with("gradient_checkpointing_enable",
                                     gradient_checkpointing_kwargs=BOTH)),
        (f"{REENTRANT}.", switch_with(activation_checkpointing_kwargs={
            "preserve_rng_state": False})),
        ("backward replayed the forward's random numbers. Hint: pass "
         "\"preserve_rng_state\": False in activation_checkpointing_kwargs.",
         switch_with(activation_checkpointing_kwargs={"use_reentrant": False})),
        ("more stayed than with every layer checkpointed: every_n_layers=2 skips "
         "every second layer. Hint: leave every_n_layers at 1.",
         switch_with(activation_checkpointing_kwargs=BOTH, every_n_layers=2)),
        ("every_n_layers must be at least 1 (Transformers checkpoints the layers whose "
         "index it divides). Hint: leave it at 1.",
         switch_with(activation_checkpointing_kwargs=BOTH, every_n_layers=0)),
        ("no layer was checkpointed: setting an attribute switches nothing on. Hint: "
         "call model.activation_checkpointing_enable(...).", set_an_attribute),
        ("nothing changed: a function with yield returns a generator and never runs "
         "its body. Hint: remove the yield.", switch_in_a_generator)],
    error_hints=[("pin_memory", "leave offload=False, as the colleague asked (this "
                       "torch build cannot pin host memory).")],
    describe="call model.activation_checkpointing_enable(...) with both options in its "
    "kwargs, and change nothing else.", label="batches of {}",
    correct="every layer checkpointed: {kept_KiB} KiB kept for backward, the same "
    "gradients through torch.autograd.grad, and with dropout on, backward drew new "
    "masks: the random-number state was not copied (safe: the model has no dropout).")


@core.checker(SWITCH)
def check_switch_on_checkpointing(switch_on_checkpointing):
    """``switch_on_checkpointing(model)``: every layer, today's name, non-reentrant,
    preserve_rng_state=False."""


# --- 1.3 and 1.4: a gated MLP block (Llama's, with biases) --------------------------

class GatedBlock(torch.nn.Module):
    """A residual gated MLP (SwiGLU, as in Llama): h + down(silu(gate(h)) * up(h))."""

    def __init__(self, width, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(width, hidden)
        self.up_proj = torch.nn.Linear(width, hidden)
        self.down_proj = torch.nn.Linear(hidden, width)

    def forward(self, h):  # h: (rows, width)
        gate = self.gate_proj(h)  # (rows, hidden), a matrix multiply: aten.addmm
        up = self.up_proj(h)  # (rows, hidden), aten.addmm
        return h + self.down_proj(torch.nn.functional.silu(gate) * up)  # aten.addmm


def gated_blocks(n_blocks, width, hidden, rows, seed=0):
    """``n_blocks`` gated blocks and their input, the same at every call (check()
    puts the learner's random state back)."""
    torch.manual_seed(seed)
    blocks = torch.nn.ModuleList(GatedBlock(width, hidden) for _ in range(n_blocks))
    return blocks, torch.randn(rows, width)


# what a GatedBlock's forward ops make, in order (addmm, addmm, silu, mul, addmm, add;
# `t` views a weight and makes nothing)
GATED_TENSORS = ["gate", "up", "silu(gate)", "silu(gate) * up", "down_proj's output",
                 "the block's output"]
SAVING = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


def policy_run(policy, rows):
    """What one gated block (64 wide, 256 inside, ``rows`` rows) checkpointed with
    ``policy`` did: KiB kept, matmuls run again in backward, the tensors each forward
    saved (or offloaded), and whether the gradients are those without checkpointing."""
    (block,), h = gated_blocks(1, 64, 256, rows)
    forwards = []

    def recorded(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        if isinstance(decision, bool):  # PyTorch accepts True (save), False
            decision = SAVING[0] if decision else CheckpointPolicy.PREFER_RECOMPUTE
        if not isinstance(decision, CheckpointPolicy):
            raise Wrong(f"your policy returned {decision!r} for {op}; it must return a "
                        "CheckpointPolicy (e.g. CheckpointPolicy.MUST_SAVE or "
                        "PREFER_RECOMPUTE) for every op. Hint: is there a return on "
                        "every path?")
        if op.overloadpacket.__name__ != "t":
            forwards[-1].append(decision)
        return decision

    def loss(checkpointed=True):
        if not checkpointed:
            return block(h).sum()
        forwards.append([])
        context_fn = partial(create_selective_checkpoint_contexts, recorded)
        return checkpoint(block, h, use_reentrant=False, context_fn=context_fn).sum()

    kept = core.learner(measure_memory, loss).saved_bytes
    _, backward = core.learner(count_ops, loss)
    block.zero_grad(set_to_none=True)
    core.learner(lambda: loss().backward())
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    loss(checkpointed=False).backward()
    saved, offloaded = ([tuple(name for name, decision in zip(GATED_TENSORS, decisions)
                               if decision in kinds) for decisions in forwards]
                        for kinds in (SAVING, (CheckpointPolicy.MUST_CPU_OFFLOAD,
                                               CheckpointPolicy.PREFER_CPU_OFFLOAD)))
    if len(set(saved)) > 1:  # what else it did depends on when it was called
        return {"saved": "differently each forward"}
    return {"kept_KiB": kept / KiB, "matmuls again": backward.get("addmm", 0),
            "saved": saved[0], "offloaded": offloaded[0],
            "gradients": all_close(grads, [p.grad for p in block.parameters()])}


def keep_gate_and_up(ctx, op, *args, **kwargs):
    """The intended answer of 1.3: save the matmuls 256 wide, recompute the rest."""
    if op == torch.ops.aten.addmm.default and ctx.op_output.shape[-1] == 256:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def policy_saving(*saved, how=CheckpointPolicy.MUST_SAVE):
    """A policy as a learner writes it: ``how`` for the ops named, recompute the
    rest."""
    def policy(ctx, op, *args, **kwargs):
        return how if op in saved else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def policy_with_a_toggle():
    every_other = [False]

    def policy(ctx, op, *args, **kwargs):
        if op == torch.ops.aten.addmm.default:
            every_other[0] = not every_other[0]  # never reset between forwards
            if every_other[0]:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy


ADDMM, SILU, MUL = (torch.ops.aten.addmm.default, torch.ops.aten.silu.default,
                    torch.ops.aten.mul.Tensor)
POLICY = core.Exercise(
    "1.3", measure=policy_run, intended=keep_gate_and_up, configs=(128, 32),
    name="keep_what_backward_reads", same=core.close(rel=1e-3),
    mistakes=[
        ("down_proj's output stayed too, and no backward reads it. Hint: ctx.op_output"
         "'s shape tells gate and up from down_proj.", policy_saving(ADDMM)),
        ("nothing was saved, so gate's and up's matmuls ran again. Hint: a Linear runs "
         "as torch.ops.aten.addmm.default, not torch.addmm.",
         policy_saving(torch.addmm)),
        ("outside torch.compile, an offloaded tensor is recomputed, not stored. Hint: "
         "return MUST_SAVE.", policy_saving(ADDMM, how=CheckpointPolicy.MUST_CPU_OFFLOAD
                                            )),
        ("silu's and mul's backward still read gate and up, so their matmuls ran "
         "again. Hint: save gate and up.", policy_saving(SILU, MUL)),
        ("your policy decided differently each forward (a flag never reset?). Hint: "
         "decide from op and ctx.op_output alone.", policy_with_a_toggle())],
    describe="save exactly the matmul outputs that some backward reads.",
    label="{} rows", correct="{kept_KiB:.0f} KiB kept (gate and up), no matmul run "
    "again, identical gradients, with 128 and 32 rows. down_proj's output need not "
    "stay: early stop ends the recomputation before down_proj runs.")


@core.checker(POLICY)
def check_gated_block_policy(policy):
    """``policy(ctx, op, *args, **kwargs)``: no matmul run again in backward, nothing
    kept that backward won't read."""


# --- 1.4: a stack of gated blocks in segments ---------------------------------------

def run_blocks(blocks, h):
    for block in blocks:
        h = block(h)
    return h


def balanced_sizes(n_blocks, segments):
    """Lengths that differ by at most one and add up to ``n_blocks``, longest last."""
    shorter, longer = divmod(n_blocks, segments)
    return [shorter] * (segments - longer) + [shorter + 1] * longer


def every_segment_checkpointed(blocks, h, segments, use_reentrant=False):
    """The intended answer of 1.4. Of the balanced orders, longest last peaks highest
    (backward recomputes the last segment first, while every other input is alive)."""
    start = 0
    for size in balanced_sizes(len(blocks), segments):
        h = checkpoint(run_blocks, blocks[start:start + size], h,
                       use_reentrant=use_reentrant)
        start += size
    return h


def recomputed_regions(recomputed):
    """The lengths of the runs of consecutive blocks recomputed together, sorted."""
    # within a run of consecutive blocks, index - position stays the same
    return tuple(sorted(len(list(run)) for _, run in itertools.groupby(
        enumerate(recomputed), lambda pair: pair[1] - pair[0])))


OUTPUT = "the output of the blocks run in order"


def stack_run(forward, case):
    """What ``forward(blocks, h, segments)`` did on ``case`` (blocks, segments): its
    output's value and gradient, KiB kept and peak, the blocks recomputed together,
    those run outside any checkpoint, and the gradients."""
    n_blocks, segments = case
    blocks, h = gated_blocks(n_blocks, 32, 128, 256)
    with torch.no_grad():
        expected = run_blocks(blocks, h)
    with core.explaining_warnings("use_reentrant", "requires_grad=True") as warned:
        output = core.learner(forward, blocks, h, segments)
    if not isinstance(output, torch.Tensor) or output.shape != expected.shape:
        raise Wrong("checkpointed_forward should return the last block's output, a "
                    f"tensor of shape {tuple(expected.shape)}, but returned "
                    f"{type(output).__name__}.")
    outcome = {OUTPUT: torch.allclose(output.detach(), expected, atol=1e-5),
               "output requires grad": output.requires_grad, "warned": bool(warned)}
    if not output.requires_grad or not outcome[OUTPUT]:
        return outcome
    recomputed, in_backward = [], [False]
    hooks = [block.register_forward_pre_hook(
        lambda module, args, i=i: recomputed.append(i) if in_backward[0] else None)
        for i, block in enumerate(blocks)]

    def loss():
        value = forward(blocks, h, segments).square().mean()
        in_backward[0] = True  # every block call from now on is a recomputation
        return value

    blocks.zero_grad(set_to_none=True)
    try:
        report = core.learner(measure_memory, loss)
    finally:
        for hook in hooks:
            hook.remove()
    gradients = [p.grad for p in blocks.parameters()]
    blocks.zero_grad(set_to_none=True)
    run_blocks(blocks, h).square().mean().backward()
    return {**outcome, "kept_KiB": report.saved_bytes / KiB,
            "peak_KiB": report.peak_activation_bytes / KiB,
            "recomputed together": recomputed_regions(recomputed),
            "kept their insides": tuple(i for i in range(n_blocks)
                                        if report.kept("silu", i)),
            "gradients": None not in gradients and all_close(
                gradients, [p.grad for p in blocks.parameters()])}


def same_stack(got, expected):
    """The same outcome, except that a peak up to the intended one's passes: balanced
    segments in another order (longest first) peak lower."""
    if not (isinstance(got, dict) and isinstance(expected, dict)):
        return got == expected
    got, expected = dict(got), dict(expected)
    peak, highest = got.pop("peak_KiB", 0), expected.pop("peak_KiB", 0)
    return core.close(1e-3)(got, expected) and peak <= 1.01 * highest


def by_pieces_of(size_of):
    """checkpointed_forward as the lesson split it: pieces of ``size_of(n, segments)``
    blocks, each in a checkpoint."""
    def checkpointed_forward(blocks, h, segments):
        size = size_of(len(blocks), segments)
        for start in range(0, len(blocks), size):
            h = checkpoint(run_blocks, blocks[start:start + size], h,
                           use_reentrant=False)
        return h
    return checkpointed_forward


def with_checkpoint_sequential(blocks, h, segments):
    return checkpoint_sequential(blocks, segments, h, use_reentrant=False)


def late_binding(blocks, h, segments):
    start = 0
    for size in balanced_sizes(len(blocks), segments):
        end = start + size
        # the mistake itself: the lambda reads start and end when backward calls it
        h = checkpoint(lambda x: run_blocks(blocks[start:end], x), h,  # noqa: B023
                       use_reentrant=False)
        start = end
    return h


def nested(blocks, h, segments):
    return checkpoint(every_segment_checkpointed, blocks, h, segments,
                      use_reentrant=False)


def detached(blocks, h, segments):
    return every_segment_checkpointed(blocks, h, segments).detach()


SEGMENTS = core.Exercise(
    "1.4", measure=stack_run, intended=every_segment_checkpointed,
    configs=((8, 4), (7, 3), (6, 4)), name="checkpointed_forward", same=same_stack,
    mistakes=[
        ("checkpoint_sequential leaves its last segment without a checkpoint, so its "
         "blocks kept their insides. Hint: wrap every segment yourself.",
         with_checkpoint_sequential),
        ("pieces of ceil(blocks / segments) are not balanced (6 blocks in pieces of 2 "
         "make 3 segments, not 4). Hint: divmod(len(blocks), segments).",
         by_pieces_of(lambda n, s: math.ceil(n / s))),
        ("pieces of blocks // segments make too many segments where the blocks do not "
         "divide evenly. Hint: give the blocks left over one each to some segments.",
         by_pieces_of(lambda n, s: n // s)),
        ("a lambda made in the loop reads start and end when backward calls it, after "
         "the loop moved on. Hint: checkpoint(run, blocks[start:end], h, ...).",
         late_binding),
        ("without use_reentrant=False, checkpoint takes the reentrant path, and its "
         "output needs no gradient (PyTorch warned). Hint: use_reentrant=False.",
         # use_reentrant=None: as if the learner left it out
         partial(every_segment_checkpointed, use_reentrant=None)),
        ("a checkpoint inside another one's region ran twice in backward. Hint: one "
         "checkpoint per segment, none around them all.", nested),
        ("its output does not require a gradient: no .detach() or .data on it. Hint: "
         "return the output checkpoint gives.", detached)],
    describe="every block once, in order, in one of the segments, each segment in "
    "its own checkpoint.", label="{} blocks in {} segments",
    correct="8 blocks in 4 segments, as 7 in 3 and 6 in 4: {kept_KiB:.0f} KiB kept and "
    "a peak of {peak_KiB:.0f} KiB, each block recomputed once, identical gradients.")


@core.checker(SEGMENTS)
def check_checkpointed_segments(checkpointed_forward):
    """``checkpointed_forward(blocks, h, segments)``: the blocks in ``segments``
    balanced checkpointed segments."""
