"""Checks for notebooks/practice/01_gradient_checkpointing_practice.ipynb (lesson
01), on the practice core: the bytes kept for backward, the operations run again, what
a policy saved, which blocks were recomputed together, and the gradients, measured."""
import functools
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

# the same gradients, float32 rounding aside
all_close = core.close(rel=1e-5, abs_=1e-6)


# --- 1.1: a region that ends before B ---------------------------------------------

def region_ends_before_b(rows=128, features=256):
    """Lesson 1's example, small, as a loss function: A = sin(x) in the region, B = x @
    W + b and C = A * B outside it (a product: its backward reads both A and B)."""
    x, W = torch.ones(rows, features), torch.ones(features, features)
    b = torch.zeros(features)
    for tensor in (x, W, b):  # made before the measurement: they do not count
        tensor.requires_grad_()

    def loss():
        A = checkpoint(torch.sin, x, use_reentrant=False)
        return (A * torch.addmm(b, x, W)).sum()
    return loss


@functools.cache
def region_measurements():
    """{"kept_KiB", "A_runs", "B_runs"} of exercise 1.1's graph, measured."""
    forward, backward = count_ops(region_ends_before_b())
    runs = {op: forward[op] + backward.get(op, 0) for op in ("sin", "addmm")}
    return {"kept_KiB": measure_memory(region_ends_before_b()).saved_bytes / KiB,
            "A_runs": runs["sin"], "B_runs": runs["addmm"]}


def predicted_or_measured(prediction, config):
    """Each predicted number, or "as measured" where it is what the graph did."""
    measured = region_measurements()
    if not isinstance(prediction, dict) or set(prediction) != set(measured):
        raise Wrong('prediction should be a dict with the keys "kept_KiB", "A_runs" '
                    'and "B_runs", e.g. {"kept_KiB": 0, "A_runs": 1, "B_runs": 1}.')
    numbers = {key: core.as_number(prediction[key], f'prediction["{key}"]',
                                   whole=key != "kept_KiB") for key in measured}
    return {key: "as measured" if number == measured[key] else number
            for key, number in numbers.items()}


def predicted(kept_KiB=2 * 128, A_runs=1, B_runs=1):  # A and B, 128 KiB each
    return {"kept_KiB": kept_KiB, "A_runs": A_runs, "B_runs": B_runs}


MUL_SAVES = ("checkpoint drops only what is saved inside its region; mul, outside it, "
             "saves both its inputs (dC/dA = B, dC/dB = A).")
REGION = core.Exercise(
    "1.1", measure=predicted_or_measured, name="prediction", intended=predicted(),
    mistakes=[
        (f"kept_KiB = 0: more stays: {MUL_SAVES}", predicted(kept_KiB=0)),
        (f"kept_KiB = 128: more stays: {MUL_SAVES}", predicted(kept_KiB=128)),
        ("kept_KiB = 384: one tensor too many: which op would save C? sum's backward "
         "reads no input.", predicted(kept_KiB=3 * 128)),
        ("A_runs = 2 would be right without early stop; with it, recomputation stops "
         "once what the region saved is saved again: sin saves its input x.",
         predicted(A_runs=2)),
        ("B_runs = 2: B runs outside the region; only a checkpoint's inside is "
         "recomputed.", predicted(B_runs=2))],
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


def switch_run(switch, batch_size):
    """The tiny DistilBERT after ``switch(model)``: KiB kept for backward, gradients
    through torch.autograd.grad, whether backward replays the forward's dropout masks
    (the random-number state preserved), and whether the old name warned."""
    model, batch = tiny_model().train(), fixed_batches(batch_size, 1)[0]
    plain = backward_gradients(model, batch)
    with core.explaining_warnings("gradient_checkpointing_enable",
                                  "use_reentrant") as warned:
        core.learner(switch, model)
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
            "rng replayed": replayed, "old name": old_name}


def switch_with(name="activation_checkpointing_enable", **kwargs):
    """switch_on_checkpointing as a learner writes it: one call of the switch."""
    def switch_on_checkpointing(model):
        getattr(model, name)(**kwargs)
    return switch_on_checkpointing


def set_an_attribute(model):
    model.config.gradient_checkpointing = True


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
        ("no layer was checkpointed: setting an attribute, or naming the method "
         "without calling it, switches nothing on. Hint: call "
         "model.activation_checkpointing_enable(...).", set_an_attribute)],
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

    def forward(self, h):  # h: (rows, width); each Linear runs as aten.addmm
        gate, up = self.gate_proj(h), self.up_proj(h)  # (rows, hidden) each
        return h + self.down_proj(torch.nn.functional.silu(gate) * up)


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
RECOMPUTING = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def policy_run(policy, rows):
    """What one gated block (64 wide, 256 inside, ``rows`` rows) checkpointed with
    ``policy`` did: KiB kept, matmuls run again in backward, the tensors its first
    forward saved (or offloaded), and whether the gradients are those without
    checkpointing."""
    (block,), h = gated_blocks(1, 64, 256, rows)
    decisions = []  # for the forwards' ops, not for the recomputations'

    def recorded(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        if isinstance(decision, bool):  # PyTorch accepts True (save), False
            decision = SAVING[0] if decision else RECOMPUTING[1]
        if not isinstance(decision, CheckpointPolicy):
            raise Wrong(f"your policy returned {decision!r} for {op}; it must return a "
                        "CheckpointPolicy (e.g. CheckpointPolicy.MUST_SAVE or "
                        "PREFER_RECOMPUTE) for every op. Hint: is there a return on "
                        "every path?")
        if not ctx.is_recompute and op.overloadpacket.__name__ != "t":
            decisions.append(decision)
        return decision

    def loss():
        context_fn = partial(create_selective_checkpoint_contexts, recorded)
        return checkpoint(block, h, use_reentrant=False, context_fn=context_fn).sum()

    kept = core.learner(measure_memory, loss).saved_bytes  # forward and backward
    gradients = [p.grad for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    _, backward = core.learner(count_ops, loss)
    block.zero_grad(set_to_none=True)
    block(h).sum().backward()
    return {"kept_KiB": kept / KiB, "matmuls again": backward.get("addmm", 0),
            "saved": tuple(name if decision in SAVING else f"{name} (offloaded)"
                           for name, decision in zip(GATED_TENSORS, decisions)
                           if decision not in RECOMPUTING),
            "gradients": all_close(gradients, [p.grad for p in block.parameters()])}


def keep_gate_and_up(ctx, op, *args, **kwargs):
    """The intended answer of 1.3: save the matmuls 256 wide, recompute the rest."""
    if op == torch.ops.aten.addmm.default and ctx.op_output.shape[-1] == 256:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def policy_saving(*saved):
    """A policy as a learner writes it: save the ops named, recompute the rest."""
    def policy(ctx, op, *args, **kwargs):
        return SAVING[0] if op in saved else RECOMPUTING[1]
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
        ("silu's and mul's backward still read gate and up, so their matmuls ran "
         "again. Hint: save gate and up.", policy_saving(SILU, MUL))],
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
    output, KiB kept and peak, the blocks recomputed together, those run outside any
    checkpoint (they kept their insides), and the gradients."""
    n_blocks, segments = case
    blocks, h = gated_blocks(n_blocks, 32, 128, 256)
    expected = run_blocks(blocks, h)
    expected.square().mean().backward()  # the gradients without checkpoints
    plain = [p.grad for p in blocks.parameters()]
    blocks.zero_grad(set_to_none=True)
    with core.explaining_warnings("use_reentrant", "requires_grad=True") as warned:
        output = core.learner(forward, blocks, h, segments)
    if not isinstance(output, torch.Tensor) or output.shape != expected.shape:
        raise Wrong("checkpointed_forward should return the last block's output, a "
                    f"tensor of shape {tuple(expected.shape)}, but returned "
                    f"{type(output).__name__}.")
    outcome = {OUTPUT: torch.allclose(output.detach(), expected.detach(), atol=1e-5),
               "output requires grad": output.requires_grad, "warned": bool(warned)}
    if not output.requires_grad or not outcome[OUTPUT]:
        return outcome
    recomputed = []

    def loss():
        value = forward(blocks, h, segments).square().mean()
        for i, block in enumerate(blocks):  # from now on a block call recomputes
            block.register_forward_pre_hook(lambda *_, i=i: recomputed.append(i))
        return value

    report = core.learner(measure_memory, loss)
    gradients = [p.grad for p in blocks.parameters()]
    return {**outcome, "kept_KiB": report.saved_bytes / KiB,
            "peak_KiB": report.peak_activation_bytes / KiB,
            "recomputed together": recomputed_regions(recomputed),
            "kept their insides": tuple(i for i in range(n_blocks)
                                        if report.kept("silu", i)),
            "gradients": None not in gradients and all_close(gradients, plain)}


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
         partial(every_segment_checkpointed, use_reentrant=None))],
    describe="every block once, in order, in one of the segments, each segment in "
    "its own checkpoint.", label="{} blocks in {} segments",
    correct="8 blocks in 4 segments, as 7 in 3 and 6 in 4: {kept_KiB:.0f} KiB kept and "
    "a peak of {peak_KiB:.0f} KiB, each block recomputed once, identical gradients.")


@core.checker(SEGMENTS)
def check_checkpointed_segments(checkpointed_forward):
    """``checkpointed_forward(blocks, h, segments)``: the blocks in ``segments``
    balanced checkpointed segments."""
