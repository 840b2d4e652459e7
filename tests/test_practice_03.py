"""Practice 3 (Local SGD): right answers pass; near misses get "not quite" and a hint
that names their cause.

The checks measure on real processes. A launch takes seconds, so each group of tests
shares one: the intended loops of 3.1 and 3.2 are measured once (as the check does,
cached), and one launch measures every loop of 3.3, another every averaging of 3.4 (on
the check's 3 processes), each judged several ways. Among the near misses are the
answers an adversarial review found fooling an earlier version of the checks (a loss
divided again for accumulation, a hard-coded 1,800, ...).
"""
import fractions
import math

import numpy as np
import pytest
import torch
from accelerate.local_sgd import LocalSGD
from practice_support import assert_verdict, draws_after_seeding

from helpers.practice import check_local_sgd as l3
from helpers.practice.verdicts import CORRECT, WRONG, checker


def judged(judge, *args):
    """The verdict of one judge function on measurements already made (no launch)."""
    @checker("test")
    def check():
        judge(*args)
        return "ok"
    return check.verdict()


def classifier_bytes(hidden):
    """The stand-in's parameter bytes, from its shapes (float32)."""
    return sum(
        p.numel() * p.element_size() for p in l3.SmallClassifier(hidden).parameters()
    )


# --- 3.1: predict the bytes
# -----------------------------------------------------------------

@pytest.fixture(scope="module")
def measured():
    """The intended loops of 3.1 and 3.2, measured in one launch (the checks reuse
    it)."""
    return l3.intended_measurements()


def test_the_two_classifiers_have_the_sizes_the_notebook_and_hints_name():
    assert (classifier_bytes(l3.HIDDEN) == 1800
            and classifier_bytes(l3.WIDER_HIDDEN) == 3464)
    assert len(list(l3.SmallClassifier().parameters())) == 6


def test_3_1_the_measurement_is_what_lesson_3_says(measured):
    for steps, k, hidden in l3.PREDICTION_CASES:
        run = measured[("local sgd", steps, 1, k, hidden)]
        table = l3.communication_table(run)
        p = classifier_bytes(hidden)
        assert run["parameter_bytes"] == p and run["optimizer_steps"] == steps
        assert (l3.averaged_after(table) == list(range(k, steps + 1, k))
                and table[l3.AFTER_THE_LOOP] == p)
        assert not l3.gradient_steps(table) and run["identical_at_end"]
    assert {hidden for _, _, hidden in l3.PREDICTION_CASES} == {l3.HIDDEN,
                                                                l3.WIDER_HIDDEN}


@pytest.mark.parametrize("prediction", [
    lambda s, k, p: (s // k + 1) * p,
    lambda s, k, p: p * (math.floor(s / k) + 1),
    lambda s, k, p: float((s // k + 1) * p),
    # a Fraction once made the check fail on Python 3.11
    lambda s, k, p: fractions.Fraction((s // k + 1) * p),
    lambda s, k, p: np.int64((s // k + 1) * p),
    lambda s, k, p: np.float32((s // k + 1) * p),
    lambda s, k, p: p * (divmod(s, k)[0] + 1),
    lambda s, k, p: p * (1 + sum(1 for step in range(1, s + 1) if step % k == 0)),
    lambda s, k, p: (max(s // k, 1) + (s >= k)) * p,  # the same numbers, by cases
])
def test_3_1_accepts_the_formula_written_several_ways(measured, prediction):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), CORRECT, "16 steps, "
                                                                          "k=8: 5,400",
                   "on the wider classifier (3,464 bytes of parameters)")


# what the check's message used to list
LISTED_CASES = {(16, 8): 5400, (12, 8): 3600, (5, 8): 1800, (3, 1): 7200}


@pytest.mark.parametrize(
    "prediction, fragments",
    [
        (lambda s, k, p: s // k * p, ("averages once more",)),
        (lambda s, k, p: math.ceil(s / k) * p, ("rounding steps / k up",)),
        (lambda s, k, p: fractions.Fraction(math.ceil(s / k) * p),
         ("you predicted 3,600 bytes", "rounding steps / k up")),
        (lambda s, k, p: s * p, ("that is DDP",)),
        (lambda s, k, p: (s / k + 1) * p, ("use //",)),
        (lambda s, k, p: s // k + 1, ("number of averagings",)),
        (lambda s, k, p: 2 * (s // k + 1) * p,
         ("ring all-reduce", "the payload itself")),
        (lambda s, k, p: np.float32(s // k * p), ("averages once more",)),
        (lambda s, k, p: (s // k + 1) * p if s >= k else 0, ("how many times",)),
        (lambda s, k, p: ((s - 1) // k + 2) * p, ("how many times",)),
        (lambda s, k, p: (s // k + 1) * 1800,
         ("3,464 bytes of parameters", "use the argument, not the 1,800 bytes")),
        (lambda s, k, p: LISTED_CASES[(s, k)],
         ("raised KeyError: (10, 3)", "cases that no text lists")),
    ],
)
def test_3_1_rejects_near_misses(measured, prediction, fragments):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG, *fragments)


@pytest.mark.parametrize(
    "prediction, fragments",
    [
        (lambda s, k, p: torch.tensor((s // k + 1) * p),
         ("returned tensor(5400)", ".item()")),
        (lambda s, k, p: str((s // k + 1) * p), ("returned '5400'", "not text")),
        (lambda s, k, p: None, ("returned None", "forget `return`")),
        (lambda s, k, p: True, ("not True or False",)),
        (lambda s, k, p: "many", ("not text",)),
    ],
)
def test_3_1_a_right_value_of_the_wrong_type_is_told_to_return_a_number(
    measured, prediction, fragments
):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG,
                   "should return a number of bytes", *fragments)


# --- 3.2: under accumulation, against DDP
# ------------------------------------------------------

def test_3_2_the_measurement_is_what_lesson_3_says(measured):
    for m, a, k, hidden in l3.ACCUMULATION_CASES:
        ddp, local = (measured[("ddp", m, a, None, hidden)],
                      measured[("local sgd", m, a, k, hidden)])
        p = classifier_bytes(hidden)
        assert l3.gradient_steps(l3.communication_table(ddp)) == list(
            range(1, m // a + 1)
        )
        assert (l3.total_bytes(ddp) == m // a * p
                and l3.total_bytes(local) == (m // k + 1) * p)
        assert not l3.gradient_steps(l3.communication_table(local))
    # rounding m / k up is caught
    assert any(m % k for m, _, k, _ in l3.ACCUMULATION_CASES)
    assert any(hidden == l3.WIDER_HIDDEN for *_, hidden in l3.ACCUMULATION_CASES)


def right_with_accumulation(m, a, k, p):
    return m // a * p, (m // k + 1) * p


@pytest.mark.parametrize(
    "prediction",
    [
        right_with_accumulation,
        lambda m, a, k, p: list(right_with_accumulation(m, a, k, p)),
        lambda m, a, k, p: (p * (m // a), p + p * (m // k)),
        lambda m, a, k, p: tuple(
            np.int64(n) for n in right_with_accumulation(m, a, k, p)
        ),
        lambda m, a, k, p: tuple(
            fractions.Fraction(n) for n in right_with_accumulation(m, a, k, p)
        ),
        # the same: m is a multiple of a
        lambda m, a, k, p: (m // a * p, ((m // a) * a // k + 1) * p),
    ],
)
def test_3_2_accepts_the_right_pair(measured, prediction):
    assert_verdict(l3.check_predicted_bytes_with_accumulation.verdict(prediction),
                   CORRECT, "in 4 cases", "Local SGD sent 9,000 bytes and DDP 5,400")


@pytest.mark.parametrize(
    "prediction, fragments",
    [
        (lambda m, a, k, p: (m // a * p, (m // a // k + 1) * p),
         ("not once per optimizer step",)),
        (lambda m, a, k, p: (m * p, (m // k + 1) * p),
         ("only in the backward of the micro-batch that completes",)),
        (
            lambda m, a, k, p: (fractions.Fraction(m * p),
                                fractions.Fraction((m // k + 1) * p)),
            ("you predicted DDP 28,800",
             "only in the backward of the micro-batch that completes"),
        ),
        (lambda m, a, k, p: (m // a * p, (m // k + 1 + m // a) * p),
         ("does not all-reduce the gradients at all",)),
        (lambda m, a, k, p: (m // a * p, m // k * p), ("averages once more",)),
        (lambda m, a, k, p: (m // a * p, (math.ceil(m / k) + 1) * p),
         ("local_sgd_steps=5", "rounding micro_batches / k up")),
        (lambda m, a, k, p: (m // a * p, (m / k + 1) * p),
         ("local_sgd_steps=5", "use //")),
        (lambda m, a, k, p: (m // a * 1800, (m // k + 1) * 1800),
         ("3,464 bytes of parameters", "not 1,800")),
        (lambda m, a, k, p: ((m // k + 1) * p, m // a * p), ("you swapped them",)),
        (lambda m, a, k, p: (m // a * p, (m // k + 1) * p * 2),
         ("count the calls of local_sgd.step()",)),
        (lambda m, a, k, p: ((m // a + 1) * p, (m // k + 1) * p),
         ("how many optimizer steps are there",)),
        (
            lambda m, a, k, p: {(16, 2, 4): (14400, 9000), (12, 4, 3): (5400, 9000)}[
                (m, a, k)
            ],
            ("raised KeyError: (12, 2, 5)", "cases that no text lists"),
        ),
    ],
)
def test_3_2_rejects_near_misses(measured, prediction, fragments):
    assert_verdict(l3.check_predicted_bytes_with_accumulation.verdict(prediction),
                   WRONG, *fragments)


@pytest.mark.parametrize(
    "prediction, fragments",
    [
        (lambda m, a, k, p: right_with_accumulation(m, a, k, p)[1],
         ("should return two numbers",)),
        (lambda m, a, k, p: np.array(right_with_accumulation(m, a, k, p)),
         ("should return two numbers", "array(")),
        (
            lambda m, a, k, p: tuple(
                torch.tensor(n) for n in right_with_accumulation(m, a, k, p)
            ),
            ("should return two numbers", ".item()"),
        ),
        (
            lambda m, a, k, p: dict(
                zip(("ddp", "local"), right_with_accumulation(m, a, k, p))
            ),
            ("should return two numbers",),
        ),
    ],
)
def test_3_2_a_pair_of_the_wrong_type_is_told_to_return_two_numbers(
    measured, prediction, fragments
):
    assert_verdict(l3.check_predicted_bytes_with_accumulation.verdict(prediction),
                   WRONG, *fragments)


# --- 3.3: find the two misplaced lines
# ----------------------------------------------------------

def fix_loop(inside=True, step_after=True, k=8, enabled=True, zero_grad=True,
             guard=False, step_in_loop=True, before_zero_grad=False):
    """Exercise 3.3's loop, fixed (the defaults) or with some of its mistakes."""
    def one_micro_batch(accelerator, model, optimizer, batch, local_sgd):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            if not step_after and step_in_loop:
                local_sgd.step()
            optimizer.step()
            if before_zero_grad:
                local_sgd.step()
            if zero_grad:
                optimizer.zero_grad()
            if (step_after and step_in_loop and not before_zero_grad
                and (accelerator.sync_gradients or not guard)):
                local_sgd.step()

    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(
            accelerator=accelerator, model=model, local_sgd_steps=k, enabled=enabled
        ) as local_sgd:
            model.train()
            if inside:
                for batch in dataloader:
                    one_micro_batch(accelerator, model, optimizer, batch, local_sgd)
                if not step_in_loop:
                    local_sgd.step()
        if not inside:
            for batch in dataloader:
                one_micro_batch(accelerator, model, optimizer, batch, local_sgd)
    return loop


def fixed_with_body(body):
    """The fixed loop, with ``body(accelerator, model, optimizer, batch)`` as each
    micro-batch's training step."""
    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(
            accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True
        ) as local_sgd:
            model.train()
            for batch in dataloader:
                with accelerator.accumulate(model):
                    body(accelerator, model, optimizer, batch)
                    local_sgd.step()
    return loop


# accelerator.backward already divides it
def loss_divided_again(accelerator, model, optimizer, batch):
    accelerator.backward(model(**batch).loss / accelerator.gradient_accumulation_steps)
    optimizer.step()
    optimizer.zero_grad()


def loss_times_ten(accelerator, model, optimizer, batch):
    accelerator.backward(model(**batch).loss * 10)
    optimizer.step()
    optimizer.zero_grad()


def two_forward_passes(accelerator, model, optimizer, batch):
    accelerator.backward(model(**batch).loss + model(**batch).loss)
    optimizer.step()
    optimizer.zero_grad()


def clipped(accelerator, model, optimizer, batch):  # Trainer's default max_grad_norm
    accelerator.backward(model(**batch).loss)
    if accelerator.sync_gradients:
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


def in_eval_mode(accelerator, model, optimizer, batch):
    model.eval()
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    optimizer.zero_grad()


# clears the first micro-batch's gradients
def zero_grad_first(accelerator, model, optimizer, batch):
    optimizer.zero_grad()
    accelerator.backward(model(**batch).loss)
    optimizer.step()


def zero_grad_before_step(accelerator, model, optimizer, batch):
    accelerator.backward(model(**batch).loss)
    optimizer.zero_grad()
    optimizer.step()


# loss.backward() skips the division
def plain_backward(accelerator, model, optimizer, batch):
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def step_outside_accumulate(accelerator, model, optimizer, dataloader):
    with LocalSGD(
        accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True
    ) as local_sgd:
        model.train()
        for batch in dataloader:
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
            local_sgd.step()


def entered_and_left_by_hand(accelerator, model, optimizer, dataloader):
    local_sgd = LocalSGD(
        accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True
    ).__enter__()
    model.train()
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
    local_sgd.__exit__(None, None, None)


# no accumulate block, the same arithmetic
def accumulation_by_hand(accelerator, model, optimizer, dataloader):
    with LocalSGD(
        accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True
    ) as local_sgd:
        model.train()
        for number, batch in enumerate(dataloader, 1):
            accelerator.backward(model(**batch).loss)
            if number % accelerator.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
            local_sgd.step()


def block_per_micro_batch(accelerator, model, optimizer, dataloader):
    model.train()
    for batch in dataloader:
        with LocalSGD(
            accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True
        ) as local_sgd:
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()


def step_first_in_the_body(accelerator, model, optimizer, dataloader):
    with LocalSGD(
        accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True
    ) as local_sgd:
        model.train()
        for batch in dataloader:
            local_sgd.step()
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()


FIX_VARIANTS = {
    "fixed": fix_loop(),
    "fixed, step() only on optimizer steps with k=4": fix_loop(k=4, guard=True),
    "fixed, step() before zero_grad": fix_loop(before_zero_grad=True),
    "fixed, step() after the accumulate block": step_outside_accumulate,
    "fixed, block entered and left by hand": entered_and_left_by_hand,
    "fixed, accumulation by hand": accumulation_by_hand,
    "as given": fix_loop(inside=False, step_after=False),
    "only the block fixed": fix_loop(step_after=False),
    "only step() moved": fix_loop(inside=False),
    "step() after the for loop": fix_loop(step_in_loop=False),
    "k=4 counted in micro-batches": fix_loop(k=4),
    "step() only on optimizer steps with k=8": fix_loop(guard=True),
    "step() first in the body": step_first_in_the_body,
    "a block per micro-batch": block_per_micro_batch,
    "enabled=False": fix_loop(enabled=False),
    "zero_grad dropped": fix_loop(zero_grad=False),
    "loss divided again": fixed_with_body(loss_divided_again),
    "loss times 10": fixed_with_body(loss_times_ten),
    "two forward passes": fixed_with_body(two_forward_passes),
    "clipped at 1.0": fixed_with_body(clipped),
    "model.eval()": fixed_with_body(in_eval_mode),
    "zero_grad first": fixed_with_body(zero_grad_first),
    "zero_grad before step": fixed_with_body(zero_grad_before_step),
    "loss.backward()": fixed_with_body(plain_backward),
}


@pytest.fixture(scope="module")
def fix_runs():
    """One launch: the intended fix, then every variant, on 16 micro-batches at
    accumulation 2."""
    runs = [(l3.intended_fix(), l3.FIX_MICRO_BATCHES, l3.FIX_ACCUMULATION)]
    runs += [(loop, l3.FIX_MICRO_BATCHES, l3.FIX_ACCUMULATION)
             for loop in FIX_VARIANTS.values()]
    reference, *variants = l3.launch(runs)["runs"]
    return reference, dict(zip(FIX_VARIANTS, variants))


def test_3_3_the_intended_fix_averages_after_steps_4_and_8(fix_runs):
    reference, _ = fix_runs
    table = l3.communication_table(reference)
    assert reference["optimizer_steps"] == 8 and l3.averaged_after(table) == [4, 8]
    assert (not l3.gradient_steps(table) and not l3.averaged_before(table)
            and table[l3.BEFORE_THE_LOOP] == 0)
    assert [row["identical"] for row in table["steps"]] == [False, False, False,
                                                            True] * 2
    assert table[l3.AFTER_THE_LOOP] == 1800 and l3.total_bytes(reference) == 3 * 1800


def test_3_3_every_step_of_the_intended_fix_has_gradients_clipping_at_1_changes(
    fix_runs,
):
    reference, _ = fix_runs
    norms = [torch.tensor(record["gradients"]).norm().item()
             for record in reference["at_steps"]]
    # so clipping at the usual max_grad_norm=1.0 is seen
    assert len(norms) == 8 and min(norms) > 1.0
    assert all(record["training"] and not record["changed_since_backward"]
               and not record["cleared_during_accumulation"]
               for record in reference["at_steps"])


@pytest.mark.parametrize(
    "variant", [name for name in FIX_VARIANTS if name.startswith("fixed")]
)
def test_3_3_accepts_fixes_that_do_the_same(fix_runs, variant):
    reference, runs = fix_runs
    assert_verdict(judged(l3.judge_fixed_loop, runs[variant], reference), CORRECT)


@pytest.mark.parametrize(
    "variant, fragments",
    [
        (
            "as given",
            ("DDP all-reduced the gradients at optimizer steps 1, 2",
             "averaged before the first batch",
             "outside the `with LocalSGD(...)` block"),
        ),
        ("only step() moved",
         ("DDP all-reduced the gradients", "outside the `with LocalSGD(...)` block")),
        (
            "only the block fixed",
            ("averaged before optimizer steps 4 and 8 were taken",
             "after optimizer.step()"),
        ),
        (
            "step() first in the body",
            ("averaged before optimizer steps 4 and 8 were taken",
             "after optimizer.step()"),
        ),
        (
            "step() after the for loop",
            ("averaged at no optimizer step and once after the loop",
             "one local_sgd.step() per micro-batch"),
        ),
        ("k=4 counted in micro-batches",
         ("after optimizer steps 2, 4, 6 and 8", "keep local_sgd_steps=8")),
        (
            "step() only on optimizer steps with k=8",
            ("after optimizer step 8 and once after the loop, 2 times",
             "one local_sgd.step() per micro-batch"),
        ),
        (
            "a block per micro-batch",
            ("before the first optimizer step and after optimizer steps 1, 2",
             "16 times in all", "a block per micro-batch", "around the for loop"),
        ),
        ("enabled=False", ("never averaged", "enabled=True")),
        (
            "zero_grad dropped",
            ("at optimizer step 2", "gradients differ",
             "zero_grad after optimizer.step()"),
        ),
        (
            "loss divided again",
            ("at optimizer step 1", "0.5 times the fixed loop's",
             "already divides the loss by gradient_accumulation_steps (2)"),
        ),
        ("loss times 10",
         ("10 times the fixed loop's", "scaling the loss scales every gradient")),
        (
            "two forward passes",
            ("gradients differ",
             "one forward pass and one accelerator.backward(outputs.loss)"),
        ),
        (
            "clipped at 1.0",
            ("between accelerator.backward and optimizer step 1", "to 1)",
             "add no clipping"),
        ),
        ("model.eval()", ("evaluation mode", "dropout was off", "add no model.eval()")),
        (
            "zero_grad first",
            ("cleared between the micro-batches", "only the last micro-batch's",
             "zero_grad after optimizer.step()"),
        ),
        (
            "zero_grad before step",
            ("optimizer step 1 was taken, the parameters had no gradients",
             "changed nothing"),
        ),
        ("loss.backward()", ("2 times the fixed loop's", "loss.backward() does not")),
    ],
)
def test_3_3_rejects_near_misses(fix_runs, variant, fragments):
    reference, runs = fix_runs
    verdict = judged(l3.judge_fixed_loop, runs[variant], reference)
    assert_verdict(verdict, WRONG, *fragments)
    assert ("optimizer steps 0" not in verdict.message
            and "bytes or weights" not in verdict.message)


def test_3_3_the_gradients_catch_what_the_final_weights_cannot(fix_runs):
    reference, runs = fix_runs
    # the same arithmetic, same machine
    assert l3.largest_weight_difference(runs["fixed"], reference) == 0.0
    assert (l3.largest_weight_difference(runs["zero_grad dropped"], reference)
            > 10 * l3.WEIGHTS_TOLERANCE)
    # every gradient scaled by one number
    for variant in ("loss divided again", "loss times 10"):
        mine, intended = (torch.tensor(run["at_steps"][0]["gradients"])
                          for run in (runs[variant], reference))
        scale = (mine @ intended / (intended @ intended)).item()
        assert (torch.allclose(mine, scale * intended, rtol=1e-4, atol=1e-7)
                and abs(scale - 1) > 0.4)


def test_3_3_the_table_shows_what_the_given_loop_sends(capsys):
    l3.show_communication(fix_loop(inside=False, step_after=False))
    printed = capsys.readouterr().out
    assert (
        " before the loop |               - |                     1,800 B\n" in printed
    )
    assert ("optimizer step 4 |         1,800 B |     1,800 B before the "
            "step | identical\n") in printed
    assert ("  after the loop |               - |                           "
            "- | identical\n") in printed
    assert ("total: 19,800 bytes; plain DDP, measured in the same launch: 14,400 bytes."
            in printed)


def step_without_the_block(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()  # noqa: F821, the `with LocalSGD(...) as local_sgd:` line is missing


def test_3_3_a_failing_worker_is_one_sentence_not_a_traceback():
    assert_verdict(l3.check_fixed_local_sgd_loop.verdict(step_without_the_block), WRONG,
                   "failed in a worker process with NameError", "'local_sgd'",
                   "keep that line")


def test_3_3_whole_check_passes_and_leaves_the_learners_random_numbers_alone():
    def check_the_fix():
        return l3.check_fixed_local_sgd_loop.verdict(fix_loop())

    assert draws_after_seeding(check_the_fix) == draws_after_seeding()


# --- 3.4: one all-reduce per averaging
# ----------------------------------------------------------

def flat_mean(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        flat = accelerator.reduce(flat, reduction="mean")
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def flat_sum_then_divide_in_place(accelerator, model):
    parameters = list(model.parameters())
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in parameters])
        torch.distributed.all_reduce(flat)
        flat /= accelerator.num_processes
        for p, chunk in zip(parameters, flat.split([p.numel() for p in parameters])):
            p.copy_(chunk.view_as(p))


# ReduceOp.AVG: NCCL has it, and gloo in torch 2.13
def averaging_all_reduce(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.AVG)
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def without_no_grad(accelerator, model):
    flat = accelerator.reduce(
        torch.nn.utils.parameters_to_vector(model.parameters()), reduction="mean"
    )
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def barrier_then_one_all_reduce(accelerator, model):
    accelerator.wait_for_everyone()
    flat_mean(accelerator, model)


def flatten_dense(accelerator, model):
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    parameters = [p.data for p in model.parameters()]
    flat = _flatten_dense_tensors(parameters)
    torch.distributed.all_reduce(flat)
    flat.div_(torch.distributed.get_world_size())
    for p, synced in zip(parameters, _unflatten_dense_tensors(flat, parameters)):
        p.copy_(synced)


def through_the_state_dict(accelerator, model):  # the stand-in has no buffers
    tensors = list(model.state_dict().values())
    flat = accelerator.reduce(torch.cat([t.reshape(-1) for t in tensors]), "mean")
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def per_tensor(accelerator, model):  # what LocalSGD does, without its barrier
    for param in model.parameters():
        param.data = accelerator.reduce(param.data, reduction="mean")


def flat_sum(accelerator, model):  # Accelerator.reduce sums by default
    with torch.no_grad():
        flat = accelerator.reduce(
            torch.nn.utils.parameters_to_vector(model.parameters())
        )
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def divided_by_two(accelerator, model):  # right on 2 processes only
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.distributed.all_reduce(flat)
        torch.nn.utils.vector_to_parameters(flat / 2, model.parameters())


def averaged_then_divided(accelerator, model):  # divides twice
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.AVG)
        torch.nn.utils.vector_to_parameters(
            flat / accelerator.num_processes, model.parameters()
        )


def weights_only(accelerator, model):  # the biases are left out
    with torch.no_grad():
        weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
        flat = accelerator.reduce(
            torch.nn.utils.parameters_to_vector(weights), reduction="mean"
        )
        torch.nn.utils.vector_to_parameters(flat, weights)


def in_bfloat16(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).bfloat16()
        flat = accelerator.reduce(flat, reduction="mean").float()
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def not_copied_back(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.distributed.all_reduce(flat)
        flat /= accelerator.num_processes


def gathered(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        mean = accelerator.gather(flat.unsqueeze(0)).mean(dim=0)
        torch.nn.utils.vector_to_parameters(mean, model.parameters())


def then_broadcast(accelerator, model):  # one all-reduce, then a broadcast for nothing
    with torch.no_grad():
        flat = accelerator.reduce(
            torch.nn.utils.parameters_to_vector(model.parameters()), reduction="mean"
        )
        torch.distributed.broadcast(flat, 0)
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def in_float64(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).double()
        flat = accelerator.reduce(flat, reduction="mean").float()
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def left_in(dtype):
    def average_parameters(accelerator, model):  # the average is not cast back
        with torch.no_grad():
            flat = torch.nn.utils.parameters_to_vector(model.parameters()).to(dtype)
            flat = accelerator.reduce(flat, reduction="mean")
            torch.nn.utils.vector_to_parameters(flat, model.parameters())
    return average_parameters


def every_tensor_the_whole_vector(accelerator, model):  # the shapes are lost
    with torch.no_grad():
        flat = accelerator.reduce(
            torch.nn.utils.parameters_to_vector(model.parameters()), reduction="mean"
        )
        for param in model.parameters():
            param.data = flat


# averaged in one all-reduce, but copied back in the wrong places
def shuffled_back(accelerator, model):
    with torch.no_grad():
        flat = accelerator.reduce(
            torch.nn.utils.parameters_to_vector(model.parameters()), reduction="mean"
        )
        torch.nn.utils.vector_to_parameters(flat.flip(0), model.parameters())


RIGHT_AVERAGINGS = {"flat mean": flat_mean,
                    "flat sum, then divide": flat_sum_then_divide_in_place,
                    "AVG all-reduce": averaging_all_reduce,
                    "without no_grad": without_no_grad,
                    "barrier, then one all-reduce": barrier_then_one_all_reduce,
                    "flatten_dense": flatten_dense,
                    "through the state dict": through_the_state_dict}
AVERAGINGS = {**RIGHT_AVERAGINGS, "per tensor": per_tensor, "summed": flat_sum,
              "divided by 2": divided_by_two,
              "AVG, then divided": averaged_then_divided, "weights only": weights_only,
              "in bfloat16": in_bfloat16, "not copied back": not_copied_back,
              "gathered": gathered, "then broadcast": then_broadcast,
              "in float64": in_float64, "left in float64": left_in(torch.float64),
              "left in float16": left_in(torch.float16),
              "every tensor the whole vector": every_tensor_the_whole_vector,
              "shuffled back": shuffled_back}


@pytest.fixture(scope="module")
def averaging_runs():
    """One launch, on the check's processes: LocalSGD itself, Local SGD with each
    averaging, each averaging probed."""
    k, m = l3.AVERAGING_LOCAL_SGD_STEPS, l3.AVERAGING_MICRO_BATCHES
    runs = [(l3.lesson_loop(k), m, 1)] + [
        (l3.local_sgd_loop_with(f, k), m, 1) for f in AVERAGINGS.values()
    ]
    measured = l3.launch(
        runs, AVERAGINGS.values(), num_processes=l3.AVERAGING_PROCESSES
    )
    reference, *variants = measured["runs"]
    return (reference, dict(zip(AVERAGINGS, variants)),
            dict(zip(AVERAGINGS, measured["probes"])))


def judge_averaging(run, reference, probe):
    l3.judge_probe(probe)
    l3.judge_averaging_runs(run, reference)


def test_3_4_runs_on_more_than_2_processes(averaging_runs):
    _, _, probes = averaging_runs
    assert (l3.AVERAGING_PROCESSES > 2
            and probes["flat mean"]["processes"] == l3.AVERAGING_PROCESSES)


@pytest.mark.parametrize("variant", RIGHT_AVERAGINGS)
def test_3_4_accepts_one_flat_all_reduce(averaging_runs, variant):
    reference, runs, probes = averaging_runs
    assert_verdict(
        judged(judge_averaging, runs[variant], reference, probes[variant]), CORRECT
    )
    # Summed in another order than LocalSGD's per-tensor all-reduces (gloo splits a
    # buffer among the processes): the same weights up to rounding
    assert (
        l3.largest_weight_difference(runs[variant], reference) <= l3.WEIGHTS_TOLERANCE
    )


@pytest.mark.parametrize(
    "variant, fragments",
    [
        ("per tensor",
         ("with 6 all-reduces", "one per parameter tensor, as LocalSGD does")),
        ("summed", ("sum of the processes' parameters", "reduction=\"mean\"")),
        (
            "divided by 2",
            ("between the 3 processes", "sum divided by 2",
             "divide by accelerator.num_processes"),
        ),
        ("AVG, then divided",
         ("divided once more by the number of processes", "divide once")),
        (
            "weights only",
            ("layers.0.bias, layers.3.bias, layers.6.bias kept their own values",
             "weights and biases"),
        ),
        (
            "in bfloat16",
            ("near their mean", "all-reduced 900 bytes for 1,800 bytes",
             "lower-precision copy"),
        ),
        ("not copied back",
         ("left the parameters as they were", "copy the result back")),
        ("gathered", ("with all_gather", "a gather receives every process's copy")),
        (
            "then broadcast",
            ("with broadcast",
             "the broadcast sends the parameters once more for nothing"),
        ),
        ("in float64", ("sent 3,600 bytes", "in their own dtype")),
        (
            "left in float64",
            ("left the parameters in torch.float64; they were torch.float32",
             "cast the result back"),
        ),
        (
            "left in float16",
            ("left the parameters in torch.float16",
             "vector_to_parameters gives each parameter"),
        ),
        ("every tensor the whole vector",
         ("parameter tensors of [450, 450", "each in its own place and shape")),
        ("shuffled back", ("in its own place",)),
    ],
)
def test_3_4_rejects_near_misses(averaging_runs, variant, fragments):
    reference, runs, probes = averaging_runs
    verdict = judged(judge_averaging, runs[variant], reference, probes[variant])
    assert_verdict(verdict, WRONG, *fragments)


def test_3_4_the_training_run_alone_catches_what_the_probe_would(averaging_runs):
    reference, runs, _ = averaging_runs
    for variant, fragment in [
        ("per tensor", "all-reduces, not one"),
        ("not copied back", "not identical"),
        ("summed", "other weights than LocalSGD's"),
        ("left in float64", "so the run stopped there"),
        ("every tensor the whole vector", "left a parameter as torch.float32 (450,)"),
    ]:
        assert_verdict(
            judged(l3.judge_averaging_runs, runs[variant], reference), WRONG, fragment
        )


def cat_of_a_generator(accelerator, model):
    flat = torch.cat(model.parameters())  # torch.cat wants a list or tuple
    flat = accelerator.reduce(flat, reduction="mean")
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def test_3_4_whole_check_passes_and_a_failing_worker_is_one_sentence():
    assert_verdict(l3.check_average_parameters.verdict(flat_mean), CORRECT,
                   "measured on 3 processes", "in one all-reduce",
                   "LocalSGD issues 6 and a barrier")
    assert_verdict(l3.check_average_parameters.verdict(cat_of_a_generator), WRONG,
                   "average_parameters failed in a worker process with TypeError",
                   "each worker process called average_parameters(accelerator, model)")
