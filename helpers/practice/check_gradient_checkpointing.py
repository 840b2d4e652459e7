"""Practice 1's checks (lesson 01, gradient checkpointing), on the practice core."""
import functools
import itertools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, checkpoint_sequential

from helpers.memory import count_ops, measure_memory
from helpers.practice import core
from helpers.practice.core import Wrong
from helpers.practice.fixtures import GatedBlock, fixed_batches, tiny_model
from helpers.units import KiB

all_close = core.close(rel=1e-5, abs_=1e-6)  # equal gradients, float32 rounding aside
OLD = "gradient_checkpointing_enable"  # the deprecated name of the switch
SAVE, RECOMPUTE = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
ADDMM = torch.ops.aten.addmm.default


@functools.cache
def region_measurements():
    """The intended answer, measured: A = sin(x) in the region, B = x @ W + b, A * B."""
    x, W, b = (torch.ones(*shape, requires_grad=True)  # made before: they do not count
               for shape in [(128, 256), (256, 256), (256,)])

    def loss():
        A = checkpoint(torch.sin, x, use_reentrant=False)
        return (A * torch.addmm(b, x, W)).sum()

    forward, backward = count_ops(loss)
    return {"kept_KiB": measure_memory(loss).saved_bytes / KiB,
            "A_runs": forward["sin"] + backward.get("sin", 0),
            "B_runs": forward["addmm"] + backward.get("addmm", 0)}


def predicted(**numbers):  # a learner's: A and B stay, 128 KiB each; sin, addmm once
    return {"kept_KiB": 2 * 128, "A_runs": 1, "B_runs": 1} | numbers


def prediction_numbers(prediction, config):
    """The three numbers predicted (measured, for the intended answer), or Wrong."""
    prediction = prediction() if callable(prediction) else prediction
    if not isinstance(prediction, dict) or set(prediction) != set(predicted()):
        raise Wrong('prediction should be {"kept_KiB": n, "A_runs": n, "B_runs": n}.')
    return {key: core.as_number(value, f'prediction["{key}"]', whole=key != "kept_KiB")
            for key, value in prediction.items()}


MUL_SAVES = ("checkpoint drops only what is saved inside its region; mul, outside it, "
             "saves both its inputs (dC/dA = B, dC/dB = A).")
REGION = core.Exercise(
    "1.1", measure=prediction_numbers, intended=region_measurements, mistakes=[
        (f"kept_KiB = 0: more stays: {MUL_SAVES}", predicted(kept_KiB=0)),
        (f"kept_KiB = 128: more stays: {MUL_SAVES}", predicted(kept_KiB=128)),
        ("A_runs = 2 would be right without early stop; with it, recomputation stops "
         "once what the region saved is saved again: sin saves its input x.",
         predicted(A_runs=2))],
    describe="kept_KiB counts what forward made and some backward reads; A_runs and "
    "B_runs count forward once, then what backward runs again.", name="prediction",
    correct="measured: {kept_KiB:.0f} KiB kept (A and B), sin {A_runs}x, addmm "
    "{B_runs}x, as without checkpointing: mul keeps A outside the region, and early "
    "stop ends the recomputation before sin. A region pays off only when what it drops "
    "is not needed outside.")


@core.checker(REGION)
def check_region_before_b_prediction(prediction):
    """``prediction``: {"kept_KiB": n, "A_runs": n, "B_runs": n} for 1.1's graph."""


def gradients(model, batch):  # torch.autograd.grad's, any dropout drawn from seed 0
    torch.manual_seed(0)
    return torch.autograd.grad(model(**batch).loss, list(model.parameters()))


def switch_run(switch, batch_size):
    """After ``switch(model)``: KiB kept, gradients, masks replayed, old name used."""
    model, batch = tiny_model().train(), fixed_batches(batch_size, 1)[0]
    plain = gradients(model, batch)
    with core.explaining_warnings(OLD, "use_reentrant") as warned:
        core.learner(switch, model)
        kept = core.learner(measure_memory, lambda: model(**batch).loss).saved_bytes
        try:
            same = all_close(gradients(model, batch), plain)
            for module in model.modules():  # dropout on: which masks does backward use?
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0.5
            checkpointed = gradients(model, batch)
            model.activation_checkpointing_disable()
            replayed = all_close(checkpointed, gradients(model, batch))
        except RuntimeError as error:  # torch.autograd.grad refuses the reentrant one
            if "use_reentrant=True" not in str(error):
                raise
            same, replayed = "refused: the reentrant checkpoint ran", "not measured"
    old_name = any(OLD in str(warning.message) for warning in warned)
    return {"kept_KiB": round(kept / KiB), "autograd.grad": same,
            "rng replayed": replayed, "old name": old_name}


def switch_with(name="activation_checkpointing_enable", **kwargs):  # a learner's
    return lambda model: getattr(model, name)(**kwargs)


BOTH = {"use_reentrant": False, "preserve_rng_state": False}
SWITCH = core.Exercise(
    "1.2", measure=switch_run, configs=(4, 2), name="switch_on_checkpointing",
    intended=switch_with(activation_checkpointing_kwargs=BOTH), mistakes=[
        (f"{OLD} is the deprecated name. Hint: activation_checkpointing_enable("
         "activation_checkpointing_kwargs=...).",
         switch_with(OLD, gradient_checkpointing_kwargs=BOTH)),
        ("the reentrant checkpoint ran: your kwargs replaced Transformers' "
         "{'use_reentrant': False}. Hint: put \"use_reentrant\": False in them.",
         switch_with(activation_checkpointing_kwargs={"preserve_rng_state": False})),
        ("backward replayed the forward's random numbers. Hint: pass "
         "\"preserve_rng_state\": False in activation_checkpointing_kwargs.",
         switch_with(activation_checkpointing_kwargs={"use_reentrant": False}))],
    describe="call model.activation_checkpointing_enable(...) with both options in its "
    "kwargs, and change nothing else.", label="batches of {}",
    correct="every layer checkpointed: {kept_KiB} KiB kept for backward, the same "
    "gradients through torch.autograd.grad, and with dropout on, backward drew new "
    "masks: the random-number state was not copied (safe: the model has no dropout).")


@core.checker(SWITCH)
def check_switch_on_checkpointing(switch_on_checkpointing):
    """``switch_on_checkpointing(model)``: the switch, as the colleague wants it."""


def gated_blocks(n_blocks, width, hidden, rows):  # the same at every call
    torch.manual_seed(0)  # check() puts the learner's random state back
    blocks = torch.nn.ModuleList(GatedBlock(width, hidden) for _ in range(n_blocks))
    return blocks, torch.randn(rows, width)


def policy_run(policy, rows):
    """KiB kept, matmuls run again, gradients: a gated block checkpointed by policy."""
    (block,), h = gated_blocks(1, 64, 256, rows)

    def loss():
        context_fn = functools.partial(
            torch.utils.checkpoint.create_selective_checkpoint_contexts, policy)
        return checkpoint(block, h, use_reentrant=False, context_fn=context_fn).sum()

    plain = torch.autograd.grad(block(h).sum(), list(block.parameters()))
    kept = core.learner(measure_memory, loss).saved_bytes  # its backward fills .grad
    same = all_close([p.grad for p in block.parameters()], plain)
    return {"kept_KiB": kept / KiB, "gradients": same,
            "matmuls again": core.learner(count_ops, loss)[1].get("addmm", 0)}


def keep_gate_and_up(ctx, op, *args, **kwargs):
    """The intended answer of 1.3: save the matmuls 256 wide, recompute the rest."""
    return SAVE if op == ADDMM and ctx.op_output.shape[-1] == 256 else RECOMPUTE


POLICY = core.Exercise(
    "1.3", measure=policy_run, intended=keep_gate_and_up, configs=(128, 32),
    name="keep_what_backward_reads", same=core.close(rel=1e-3), mistakes=[
        ("down_proj's output stayed too, and no backward reads it. Hint: ctx.op_output"
         "'s shape tells gate and up from down_proj.",
         lambda ctx, op, *args, **kwargs: SAVE if op == ADDMM else RECOMPUTE),
        ("nothing was saved, so gate's and up's matmuls ran again. Hint: return "
         "MUST_SAVE for torch.ops.aten.addmm.default (torch.addmm is another object).",
         lambda ctx, op, *args, **kwargs: SAVE if op == torch.addmm else RECOMPUTE)],
    describe="save exactly the matmul outputs that some backward reads.",
    label="{} rows", correct="{kept_KiB:.0f} KiB kept (gate and up), no matmul run "
    "again, identical gradients, with 128 and 32 rows. down_proj's output need not "
    "stay: early stop ends the recomputation before down_proj runs.")


@core.checker(POLICY)
def check_gated_block_policy(policy):
    """``policy(ctx, op, *args, **kwargs)``: no matmul again, nothing kept unread."""


def run_blocks(blocks, h):  # each block's output is the next one's input
    return functools.reduce(lambda h, block: block(h), blocks, h)


def balanced_bounds(n_blocks, segments):  # lengths within one, the longest last
    size, longer = divmod(n_blocks, segments)
    ends = itertools.accumulate([size] * (segments - longer) + [size + 1] * longer)
    return itertools.pairwise([0, *ends])


def every_segment_checkpointed(blocks, h, segments, use_reentrant=False):
    """The intended answer of 1.4, longest segments last: the highest balanced peak."""
    for start, end in balanced_bounds(len(blocks), segments):
        h = checkpoint(run_blocks, blocks[start:end], h, use_reentrant=use_reentrant)
    return h


def stack_run(forward, case):
    """The output, KiB kept and peak, blocks recomputed together or never, gradients."""
    n_blocks, segments = case
    blocks, h = gated_blocks(n_blocks, 32, 128, 256)
    expected = run_blocks(blocks, h)
    plain = torch.autograd.grad(expected.square().mean(), list(blocks.parameters()))
    with core.explaining_warnings("use_reentrant", "requires_grad=True") as warned:
        output = core.returned(core.learner(forward, blocks, h, segments),
                               torch.Tensor, "checkpointed_forward")
    right = all_close(output.detach(), expected.detach())
    outcome = {"the output of the blocks run in order": right,
               "output requires grad": output.requires_grad, "warned": bool(warned)}
    if not (right and output.requires_grad):
        return outcome
    recomputed = []

    def loss():
        value = forward(blocks, h, segments).square().mean()
        for i, block in enumerate(blocks):  # from now on a block call recomputes
            block.register_forward_pre_hook(lambda *_, i=i: recomputed.append(i))
        return value

    report = core.learner(measure_memory, loss)  # its backward fills .grad
    # the runs of consecutive blocks recomputed together: index - position is constant
    together = itertools.groupby(enumerate(recomputed), lambda pair: pair[1] - pair[0])
    return {**outcome, "kept_KiB": report.saved_bytes / KiB,
            "peak_KiB": report.peak_activation_bytes / KiB,
            "recomputed together": tuple(sorted(len(list(run)) for _, run in together)),
            "kept their insides": tuple(i for i in range(n_blocks)
                                        if report.kept("silu", i)),
            "gradients": all_close([p.grad for p in blocks.parameters()], plain)}


def same_stack(got, expected):
    """Or a lower peak: backward recomputes the last segment while all inputs live."""
    if isinstance(got, dict) and "peak_KiB" in got:  # then expected is a dict too
        got = got | {"peak_KiB": max(got["peak_KiB"], expected.get("peak_KiB", 0))}
    return core.close(1e-3)(got, expected)


SEGMENT = ("h = checkpoint(run_blocks, blocks[start:end], h, "  # 1.4's, in its loop
           "use_reentrant=use_reentrant)")
SEGMENTS = core.Exercise(
    "1.4", measure=stack_run, intended=every_segment_checkpointed, same=same_stack,
    configs=((8, 4), (7, 3), (6, 4)), name="checkpointed_forward", mistakes=[
        ("checkpoint_sequential leaves its last segment without a checkpoint, so its "
         "blocks kept their insides. Hint: wrap every segment yourself.",
         lambda blocks, h, segments: checkpoint_sequential(blocks, segments, h,
                                                           use_reentrant=False)),
        ("a lambda made in the loop reads start and end when backward calls it, after "
         "the loop moved on. Hint: checkpoint(run, blocks[start:end], h, ...).",
         core.edited(every_segment_checkpointed, (SEGMENT, "h = checkpoint(lambda x: "
                     "run_blocks(blocks[start:end], x), h, use_reentrant=False)"))),
        ("without use_reentrant=False, checkpoint takes the reentrant path, and its "
         "output needs no gradient (PyTorch warned). Hint: use_reentrant=False.",
         functools.partial(every_segment_checkpointed, use_reentrant=None))],
    describe="every block once, in order, in segments whose lengths differ by at most "
    "one (divmod(len(blocks), segments)), each in its own checkpoint.",
    label="{} blocks in {} segments",
    correct="8 blocks in 4 segments, as 7 in 3 and 6 in 4: {kept_KiB:.0f} KiB kept and "
    "a peak of {peak_KiB:.0f} KiB, each block recomputed once, identical gradients.")


@core.checker(SEGMENTS)
def check_checkpointed_segments(checkpointed_forward):
    """``checkpointed_forward(blocks, h, segments)``: balanced checkpointed segments."""
