"""Checks for notebooks/practice/01_gradient_checkpointing_practice.ipynb (lesson 01)."""
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from helpers.memory import count_ops, measure_memory
from helpers.practice.verdicts import (Wrong, call_learner, checker, explaining_warnings, require_callable,
                                      require_done, whole_number)
from helpers.units import KiB, MiB

SAVE_POLICIES = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


class ABCExample:
    """Lesson 1's A + B = C example, small: A = sin(x) is cheap, B = x @ W + b is expensive.

    As in lesson 1, C is A * B rather than the slide's A + B: the gradient of a sum needs neither input,
    so autograd would keep nothing; a product's backward needs both A and B.
    """

    def __init__(self, rows=128, features=256, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, features, generator=generator).requires_grad_()
        self.W = (torch.randn(features, features, generator=generator) / features**0.5).requires_grad_()
        self.b = torch.zeros(features, requires_grad=True)

    def compute_c(self, x):
        """C from x, the region that ``loss`` checkpoints."""
        A = torch.sin(x)                  # cheap, element-wise
        B = torch.addmm(self.b, x, self.W)  # expensive matrix multiply
        return A * B                      # C

    def loss(self, context_fn=None, checkpointed=True):
        """The sum of C, computed under checkpoint (with ``context_fn``'s policy, if given) or plainly."""
        if not checkpointed:
            return self.compute_c(self.x).sum()
        if context_fn is None:
            return checkpoint(self.compute_c, self.x, use_reentrant=False).sum()
        return checkpoint(self.compute_c, self.x, use_reentrant=False, context_fn=context_fn).sum()

    def gradients(self, loss_fn):
        """Copies of the gradients of x, W and b after ``loss_fn().backward()`` from zero."""
        for tensor in (self.x, self.W, self.b):
            tensor.grad = None
        loss_fn().backward()
        return [self.x.grad.clone(), self.W.grad.clone(), self.b.grad.clone()]


def measured_computations():
    """How many times A (sin), B (addmm) and C (mul) run over forward + backward with plain checkpointing."""
    example = ABCExample()
    forward, backward = count_ops(lambda: example.loss())
    _, backward_without = count_ops(lambda: example.loss(checkpointed=False))
    # backward runs mul for the gradients anyway: only the difference is a recomputed C
    recomputed_c = backward.get("mul", 0) - backward_without.get("mul", 0)
    return {"A": forward["sin"] + backward.get("sin", 0), "B": forward["addmm"] + backward.get("addmm", 0),
            "C": forward["mul"] + recomputed_c}


@checker("1.1")
def check_recompute_prediction(prediction):
    """``prediction``: {"A": n, "B": n, "C": n}, how many times each is computed with plain checkpointing."""
    require_done(prediction, "prediction", "a whole number")
    if not isinstance(prediction, dict) or set(prediction) != {"A", "B", "C"}:
        raise Wrong('prediction should be a dict with the keys "A", "B" and "C", e.g. {"A": 1, "B": 1, "C": 1}.')
    predicted = {node: whole_number(prediction[node], f'prediction["{node}"]') for node in "ABC"}
    measured = measured_computations()
    if predicted == measured:
        return (f"measured with count_ops: A {measured['A']}x, B {measured['B']}x, C {measured['C']}x. "
                "Checkpointing drops A and B after forward and computes them again in backward; C is never "
                "recomputed, because backward needs only A and B.")
    wrong = [node for node in "ABC" if predicted[node] != measured[node]]
    if any(predicted[node] < measured[node] for node in "AB"):
        raise Wrong(f"you predicted {predicted}. Hint: checkpoint keeps only the region's input x; "
                    "backward needs A and B (dC/dA = B, dC/dB = A), so how many times must each be computed?")
    if "C" in wrong and predicted["C"] > measured["C"]:
        raise Wrong("A and B are right, C is not. Hint: does the backward pass need C itself, or only A and B? "
                    "PyTorch's non-reentrant checkpoint stops recomputing once it has everything backward needs.")
    raise Wrong(f"you predicted {predicted}; {', '.join(wrong)} is off. Hint: each tensor is computed once in "
                "forward; count how many of them backward must compute again.")


def recording(policy):
    """Wrap the learner's policy: remember what it returned for each op, and reject non-policies."""
    decisions = {}

    def recorded(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        if isinstance(decision, bool):  # PyTorch accepts True (save) and False (recompute)
            decision = CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE
        if not isinstance(decision, CheckpointPolicy):
            raise Wrong(f"your policy returned {decision!r} for {op}; it must return a CheckpointPolicy, e.g. "
                        "CheckpointPolicy.MUST_SAVE or CheckpointPolicy.PREFER_RECOMPUTE, for every op. "
                        "Hint: is there a return on every path?")
        decisions[str(op)] = decision
        return decision

    return recorded, decisions


@checker("1.3")
def check_keep_expensive_policy(policy):
    """``policy(ctx, op, *args, **kwargs)``: save the matrix multiply, recompute the rest."""
    require_callable(policy, "keep_expensive")
    example = ABCExample()
    recorded, decisions = recording(policy)
    context_fn = partial(create_selective_checkpoint_contexts, recorded)
    loss_fn = partial(example.loss, context_fn)
    call_learner(lambda: example.gradients(loss_fn), name="keep_expensive (inside checkpoint)")
    saved_ops = sorted(op for op, decision in decisions.items() if decision in SAVE_POLICIES)
    _, backward = count_ops(loss_fn)
    if backward.get("addmm", 0) > 0:
        said = f"it saved {', '.join(saved_ops)}" if saved_ops else "it saved no op at all"
        raise Wrong(f"B (the matrix multiply, aten.addmm) ran again in backward: {said}. The ops your policy "
                    f"saw were {', '.join(sorted(decisions))}. Hint: `op` is an ATen overload; compare it with "
                    "torch.ops.aten.addmm.default (not torch.addmm) and return CheckpointPolicy.MUST_SAVE.")
    if backward.get("sin", 0) == 0:
        raise Wrong(f"nothing was recomputed: your policy saved {', '.join(saved_ops)}, so A (sin) was kept too "
                    "and checkpointing saves no memory. Hint: return CheckpointPolicy.PREFER_RECOMPUTE for "
                    "every op other than the matrix multiply.")
    if not all(torch.allclose(g, r) for g, r in zip(example.gradients(loss_fn),
                                                     example.gradients(partial(example.loss, checkpointed=False)))):
        raise Wrong("the gradients differ from those without checkpointing. Hint: the policy must only decide "
                    "what to save; it must not change any tensor.")
    kept = measure_memory(loss_fn)
    return (f"backward recomputed sin {backward['sin']}x and addmm 0x; B stayed in memory "
            f"({kept.saved_bytes / KiB:.0f} KiB kept for backward), and the gradients are identical.")


class Block(torch.nn.Module):
    """Lesson 1's block: a residual MLP, 8x wider inside."""

    def __init__(self, width):
        """A block ``width`` wide outside, 8 x ``width`` inside."""
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 8 * width), torch.nn.Linear(8 * width, width)

    def forward(self, h):
        """h plus the MLP of h (the residual connection)."""
        return h + self.down(torch.nn.functional.gelu(self.up(h)))


def make_blocks(n_blocks=8, width=32, seed=0):
    """``n_blocks`` blocks whose weights depend only on ``seed``, leaving the learner's random state alone."""
    with torch.random.fork_rng(devices=[]):  # the blocks' layers draw from the global generator: restore it after
        torch.manual_seed(seed)
        return torch.nn.ModuleList(Block(width) for _ in range(n_blocks))


def every_block_checkpointed(blocks, h):
    """The reference answer to exercise 1.4."""
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False)
    return h


def plain_forward(blocks, h):
    """The blocks one after the other, without checkpointing: the reference output and memory."""
    for block in blocks:
        h = block(h)
    return h


def stack_measurements(forward, blocks, h):
    """(memory report, the blocks' gradients) of ``forward(blocks, h)`` followed by backward."""
    blocks.zero_grad(set_to_none=True)
    report = measure_memory(lambda: forward(blocks, h).square().mean())
    return report, [p.grad for p in blocks.parameters()]


@checker("1.4")
def check_checkpointed_forward(checkpointed_forward):
    """``checkpointed_forward(blocks, h)``: run the blocks in order, each inside its own checkpoint."""
    require_callable(checkpointed_forward, "checkpointed_forward")
    blocks, h = make_blocks(), torch.randn(512, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected_output = plain_forward(blocks, h)
    with explaining_warnings("requires_grad=True", "use_reentrant") as reentrant_warnings:
        output = call_learner(checkpointed_forward, blocks, h, name="checkpointed_forward")
    if not isinstance(output, torch.Tensor) or output.shape != expected_output.shape:
        raise Wrong(f"checkpointed_forward should return the last block's output, a tensor of shape "
                    f"{tuple(expected_output.shape)}, but returned {type(output).__name__}"
                    f"{tuple(output.shape) if isinstance(output, torch.Tensor) else ''}.")
    if not torch.allclose(output.detach(), expected_output, atol=1e-5):
        raise Wrong("its output differs from running the blocks one after the other. Hint: feed each block the "
                    "previous block's output, and return the last one.")
    if not output.requires_grad:
        reentrant = bool(reentrant_warnings)
        raise Wrong("its output does not require a gradient, so the blocks' weights cannot learn. " + (
            "PyTorch warned that no input requires grad: without use_reentrant=False, checkpoint takes the old "
            "reentrant path, which needs an input that requires grad. Hint: checkpoint(block, h, use_reentrant=False)."
            if reentrant else "Hint: do not run the blocks under torch.no_grad(); checkpoint handles that itself."))
    without, reference_grads = stack_measurements(plain_forward, blocks, h)
    reference, _ = stack_measurements(every_block_checkpointed, blocks, h)
    yours, grads = call_learner(stack_measurements, checkpointed_forward, blocks, h,
                                name="checkpointed_forward (forward and backward)")
    if any(g is None for g in grads) or not all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, reference_grads)):
        raise Wrong("the blocks' gradients differ from those without checkpointing. Hint: "
                    "checkpoint(block, h, use_reentrant=False) recomputes the same values; do not detach h.")
    if yours.saved_bytes >= 0.9 * without.saved_bytes:
        raise Wrong(f"it kept {yours.saved_bytes / MiB:.2f} MiB for backward, as much as without checkpointing "
                    f"({without.saved_bytes / MiB:.2f} MiB). Hint: wrap each call block(h) in "
                    "checkpoint(block, h, use_reentrant=False).")
    if yours.peak_activation_bytes > 1.1 * reference.peak_activation_bytes:
        raise Wrong(f"it kept only {yours.saved_bytes / MiB:.2f} MiB after forward, but the peak during backward "
                    f"was {yours.peak_activation_bytes / MiB:.2f} MiB against {reference.peak_activation_bytes / MiB:.2f} "
                    "MiB with one checkpoint per block: a region of several blocks is recomputed all at once. "
                    "Hint: give each block its own checkpoint.")
    return (f"kept for backward {yours.saved_bytes / MiB:.2f} MiB instead of {without.saved_bytes / MiB:.2f} MiB "
            f"(only the blocks' inputs); peak activations {yours.peak_activation_bytes / MiB:.2f} MiB instead of "
            f"{without.peak_activation_bytes / MiB:.2f} MiB; the gradients are identical.")


def tiny_batch(vocab_size, special_ids, seed=0):
    """8 sequences of 64 random ordinary tokens (ids below ``vocab_size``, none in ``special_ids``), labels 0, 1, ..."""
    generator = torch.Generator().manual_seed(seed)
    # [PAD], [CLS], ... carry no text: a sentence is made of the other tokens
    ordinary_ids = torch.tensor(sorted(set(range(vocab_size)) - set(special_ids)))
    picks = torch.randint(len(ordinary_ids), (8, 64), generator=generator)
    return {"input_ids": ordinary_ids[picks], "labels": torch.tensor([0, 1] * 4)}


@checker("1.2")
def check_switch_on_checkpointing(switch_on_checkpointing):
    """``switch_on_checkpointing(model)``: turn on a Transformers model's activation checkpointing."""
    from helpers.data import load_tokenizer
    from helpers.models import build_model

    require_callable(switch_on_checkpointing, "switch_on_checkpointing")
    model = build_model("tiny", seed=0).train()
    batch = tiny_batch(model.config.vocab_size, load_tokenizer().all_special_ids)
    before = measure_memory(lambda: model(**batch).loss)
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with explaining_warnings("gradient_checkpointing_enable") as deprecation_warnings:
        call_learner(switch_on_checkpointing, model, name="switch_on_checkpointing")
    model.train()
    after = call_learner(measure_memory, lambda: model(**batch).loss,
                         name="the model's forward and backward after switch_on_checkpointing")
    if after.saved_bytes >= 0.9 * before.saved_bytes:
        raise Wrong(f"nothing changed: {before.saved_bytes / MiB:.2f} MiB kept for backward before your call, "
                    f"{after.saved_bytes / MiB:.2f} MiB after. Setting an attribute (on the model or its config) "
                    "does not switch checkpointing on. Hint: call the model's method that enables it.")
    grads = [p.grad for p in model.parameters()]
    if any(g is None for g in grads) or not all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, reference)):
        raise Wrong("the gradients changed. Hint: switching checkpointing on must not change what the model computes.")
    note = ""
    if deprecation_warnings:
        note = (" Note: gradient_checkpointing_enable() is the deprecated name (Transformers warns that it will be "
                "removed in v6); prefer activation_checkpointing_enable().")
    return (f"kept for backward {before.saved_bytes / MiB:.2f} MiB before, {after.saved_bytes / MiB:.2f} MiB after "
            f"({before.saved_bytes / after.saved_bytes:.1f}x less), with identical gradients.{note}")
