"""Practice 3 (Local SGD): right answers pass; near misses get "not quite" and a hint that names their cause.

The checks measure on 2 real processes. A launch takes seconds, so each group of tests shares one:
the intended loops of 3.1 and 3.2 are measured once (as the check does, cached), and one launch
measures every loop of 3.3, another every averaging of 3.4, each judged several ways.
"""
import math

import pytest
import torch
from accelerate.local_sgd import LocalSGD

from helpers.practice import local_sgd as l3
from helpers.practice.verdicts import CORRECT, WRONG, checker

from practice_support import assert_verdict, draws_after_seeding


def judged(judge, *args):
    """The verdict of one judge function on measurements already made (no launch)."""
    @checker("test")
    def check():
        judge(*args)
        return "ok"
    return check.verdict()


# --- 3.1: predict the bytes -----------------------------------------------------------------

@pytest.fixture(scope="module")
def measured():
    """The intended loops of 3.1 and 3.2, measured in one launch (the checks reuse it)."""
    return l3.intended_measurements()


def test_3_1_the_measurement_is_what_lesson_3_says(measured):
    for steps, k in l3.PREDICTION_CASES:
        run = measured[("local sgd", steps, 1, k)]
        table = l3.communication_table(run)
        assert run["parameter_bytes"] == 1800 and run["optimizer_steps"] == steps
        assert l3.averaged_after(table) == list(range(k, steps + 1, k)) and table[l3.AFTER_THE_LOOP] == 1800
        assert not l3.gradient_steps(table) and run["identical_at_end"]


@pytest.mark.parametrize("prediction", [
    lambda s, k, p: (s // k + 1) * p,
    lambda s, k, p: p * (math.floor(s / k) + 1),
    lambda s, k, p: float((s // k + 1) * p),
])
def test_3_1_accepts_the_formula_written_several_ways(measured, prediction):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), CORRECT, "16 steps, k=8: 5,400")


@pytest.mark.parametrize("prediction, fragments", [
    (lambda s, k, p: s // k * p, ("averages once more",)),
    (lambda s, k, p: math.ceil(s / k) * p, ("rounding steps / k up",)),
    (lambda s, k, p: s * p, ("that is DDP",)),
    (lambda s, k, p: (s / k + 1) * p, ("use //",)),
    (lambda s, k, p: s // k + 1, ("number of averagings",)),
    (lambda s, k, p: 2 * (s // k + 1) * p, ("ring all-reduce", "the payload itself")),
    (lambda s, k, p: (s // k + 1) * p if s >= k else 0, ("how many times",)),
    (lambda s, k, p: "many", ("how many times",)),
    (lambda s, k, p: True, ("how many times",)),
])
def test_3_1_rejects_near_misses(measured, prediction, fragments):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG, "measured on 2 processes", *fragments)


# --- 3.2: under accumulation, against DDP ------------------------------------------------------

def test_3_2_the_measurement_is_what_lesson_3_says(measured):
    for m, a, k in l3.ACCUMULATION_CASES:
        ddp, local = measured[("ddp", m, a, None)], measured[("local sgd", m, a, k)]
        assert l3.gradient_steps(l3.communication_table(ddp)) == list(range(1, m // a + 1))
        assert l3.total_bytes(ddp) == m // a * 1800 and l3.total_bytes(local) == (m // k + 1) * 1800
        assert not l3.gradient_steps(l3.communication_table(local))


def right_with_accumulation(m, a, k, p):
    return m // a * p, (m // k + 1) * p


def test_3_2_accepts_the_right_pair(measured):
    assert_verdict(l3.check_predicted_bytes_with_accumulation.verdict(right_with_accumulation), CORRECT,
                   "Local SGD sent 9,000 bytes and DDP 5,400")
    as_list = lambda m, a, k, p: list(right_with_accumulation(m, a, k, p))  # noqa: E731
    assert_verdict(l3.check_predicted_bytes_with_accumulation.verdict(as_list), CORRECT)


@pytest.mark.parametrize("prediction, fragment", [
    (lambda m, a, k, p: (m // a * p, (m // a // k + 1) * p), "not once per optimizer step"),
    (lambda m, a, k, p: (m * p, (m // k + 1) * p), "only in the backward of the micro-batch that completes"),
    (lambda m, a, k, p: (m // a * p, (m // k + 1 + m // a) * p), "does not all-reduce the gradients at all"),
    (lambda m, a, k, p: (m // a * p, m // k * p), "averages once more"),
    (lambda m, a, k, p: ((m // k + 1) * p, m // a * p), "you swapped them"),
    (lambda m, a, k, p: (m // a * p, (m // k + 1) * p * 2), "count the calls of local_sgd.step()"),
    (lambda m, a, k, p: (m // a * p, (m // k + 1) * p)[1], "should return two numbers"),
])
def test_3_2_rejects_near_misses(measured, prediction, fragment):
    assert_verdict(l3.check_predicted_bytes_with_accumulation.verdict(prediction), WRONG, fragment)


# --- 3.3: find the two misplaced lines ----------------------------------------------------------

def fix_loop(inside=True, step_after=True, k=8, enabled=True, zero_grad=True, guard=False, step_in_loop=True,
             before_zero_grad=False):
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
            if step_after and step_in_loop and not before_zero_grad and (accelerator.sync_gradients or not guard):
                local_sgd.step()

    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=k, enabled=enabled) as local_sgd:
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


FIX_VARIANTS = {
    "fixed": fix_loop(),
    "fixed, step() only on optimizer steps with k=4": fix_loop(k=4, guard=True),
    "fixed, step() before zero_grad": fix_loop(before_zero_grad=True),
    "as given": fix_loop(inside=False, step_after=False),
    "only the block fixed": fix_loop(step_after=False),
    "only step() moved": fix_loop(inside=False),
    "step() after the for loop": fix_loop(step_in_loop=False),
    "k=4 counted in micro-batches": fix_loop(k=4),
    "enabled=False": fix_loop(enabled=False),
    "zero_grad dropped": fix_loop(zero_grad=False),
}


@pytest.fixture(scope="module")
def fix_runs():
    """One launch: the intended fix, then every variant, on 16 micro-batches at accumulation 2."""
    runs = [(l3.intended_fix(), l3.FIX_MICRO_BATCHES, l3.FIX_ACCUMULATION)]
    runs += [(loop, l3.FIX_MICRO_BATCHES, l3.FIX_ACCUMULATION) for loop in FIX_VARIANTS.values()]
    reference, *variants = l3.launch(runs)["runs"]
    return reference, dict(zip(FIX_VARIANTS, variants))


def test_3_3_the_intended_fix_averages_after_steps_4_and_8(fix_runs):
    reference, _ = fix_runs
    table = l3.communication_table(reference)
    assert reference["optimizer_steps"] == 8 and l3.averaged_after(table) == [4, 8]
    assert not l3.gradient_steps(table) and not l3.averaged_before(table) and table[l3.BEFORE_THE_LOOP] == 0
    assert [row["identical"] for row in table["steps"]] == [False, False, False, True] * 2
    assert table[l3.AFTER_THE_LOOP] == 1800 and l3.total_bytes(reference) == 3 * 1800


@pytest.mark.parametrize("variant", ["fixed", "fixed, step() only on optimizer steps with k=4",
                                     "fixed, step() before zero_grad"])
def test_3_3_accepts_fixes_that_do_the_same(fix_runs, variant):
    reference, runs = fix_runs
    assert_verdict(judged(l3.judge_fixed_loop, runs[variant], reference), CORRECT)


@pytest.mark.parametrize("variant, fragments", [
    ("as given", ("DDP all-reduced the gradients at optimizer steps 1, 2", "averaged before the first batch",
                  "outside the `with LocalSGD(...)` block")),
    ("only step() moved", ("DDP all-reduced the gradients", "outside the `with LocalSGD(...)` block")),
    ("only the block fixed", ("averaged before optimizer steps 4 and 8 were taken", "after optimizer.step()")),
    ("step() after the for loop", ("averaged at no optimizer step and once after the loop",
                                   "one local_sgd.step() per micro-batch")),
    ("k=4 counted in micro-batches", ("after optimizer steps 2, 4, 6 and 8", "keep local_sgd_steps=8")),
    ("enabled=False", ("never averaged", "enabled=True")),
    ("zero_grad dropped", ("trains differently", "keep zero_grad")),
])
def test_3_3_rejects_near_misses(fix_runs, variant, fragments):
    reference, runs = fix_runs
    assert_verdict(judged(l3.judge_fixed_loop, runs[variant], reference), WRONG, *fragments)


def test_3_3_a_different_training_is_far_outside_the_weights_tolerance(fix_runs):
    reference, runs = fix_runs
    assert l3.largest_weight_difference(runs["fixed"], reference) == 0.0  # the same arithmetic, same machine
    assert l3.largest_weight_difference(runs["zero_grad dropped"], reference) > 10 * l3.WEIGHTS_TOLERANCE


def test_3_3_the_table_shows_what_the_given_loop_sends(capsys):
    l3.show_communication(fix_loop(inside=False, step_after=False))
    printed = capsys.readouterr().out
    assert " before the loop |               - |                     1,800 B\n" in printed
    assert "optimizer step 4 |         1,800 B |     1,800 B before the step | identical\n" in printed
    assert "  after the loop |               - |                           - | identical\n" in printed
    assert "total: 19,800 bytes; plain DDP, measured in the same launch: 14,400 bytes." in printed


def step_without_the_block(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()  # noqa: F821, the `with LocalSGD(...) as local_sgd:` line is missing


def test_3_3_a_failing_worker_is_one_sentence_not_a_traceback():
    assert_verdict(l3.check_fixed_loop.verdict(step_without_the_block), WRONG,
                   "failed in a worker process with NameError", "'local_sgd'", "keep that line")


def test_3_3_whole_check_passes_and_leaves_the_learners_random_numbers_alone():
    assert draws_after_seeding(lambda: l3.check_fixed_loop.verdict(fix_loop())) == draws_after_seeding()


# --- 3.4: one all-reduce per averaging ----------------------------------------------------------

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


def averaging_all_reduce(accelerator, model):  # ReduceOp.AVG: NCCL has it, and gloo in torch 2.13
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.AVG)
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def per_tensor(accelerator, model):  # what LocalSGD does, without its barrier
    for param in model.parameters():
        param.data = accelerator.reduce(param.data, reduction="mean")


def flat_sum(accelerator, model):  # Accelerator.reduce sums by default
    with torch.no_grad():
        flat = accelerator.reduce(torch.nn.utils.parameters_to_vector(model.parameters()))
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


def in_float64(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).double()
        flat = accelerator.reduce(flat, reduction="mean").float()
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


def shuffled_back(accelerator, model):  # averaged in one all-reduce, but copied back in the wrong places
    with torch.no_grad():
        flat = accelerator.reduce(torch.nn.utils.parameters_to_vector(model.parameters()), reduction="mean")
        torch.nn.utils.vector_to_parameters(flat.flip(0), model.parameters())


AVERAGINGS = {"flat mean": flat_mean, "flat sum, then divide": flat_sum_then_divide_in_place,
              "AVG all-reduce": averaging_all_reduce,
              "per tensor": per_tensor, "summed": flat_sum, "not copied back": not_copied_back,
              "gathered": gathered, "in float64": in_float64, "shuffled back": shuffled_back}


@pytest.fixture(scope="module")
def averaging_runs():
    """One launch: LocalSGD itself, Local SGD with each averaging, and each averaging probed."""
    k, m = l3.AVERAGING_LOCAL_SGD_STEPS, l3.AVERAGING_MICRO_BATCHES
    runs = [(l3.lesson_loop(k), m, 1)] + [(l3.local_sgd_loop_with(f, k), m, 1) for f in AVERAGINGS.values()]
    measured = l3.launch(runs, AVERAGINGS.values())
    reference, *variants = measured["runs"]
    return reference, dict(zip(AVERAGINGS, variants)), dict(zip(AVERAGINGS, measured["probes"]))


def judge_averaging(run, reference, probe):
    l3.judge_probe(probe)
    l3.judge_averaging_runs(run, reference)


@pytest.mark.parametrize("variant", ["flat mean", "flat sum, then divide", "AVG all-reduce"])
def test_3_4_accepts_one_flat_all_reduce(averaging_runs, variant):
    reference, runs, probes = averaging_runs
    assert_verdict(judged(judge_averaging, runs[variant], reference, probes[variant]), CORRECT)
    assert l3.largest_weight_difference(runs[variant], reference) == 0.0


@pytest.mark.parametrize("variant, fragments", [
    ("per tensor", ("with 6 all-reduces", "one per parameter tensor, as LocalSGD does")),
    ("summed", ("sum of both processes' parameters", "reduction=\"mean\"")),
    ("not copied back", ("left the parameters as they were", "copy the result back")),
    ("gathered", ("with all_gather", "a gather receives every process's copy")),
    ("in float64", ("sent 3,600 bytes", "in their own dtype")),
    ("shuffled back", ("in its own place",)),
])
def test_3_4_rejects_near_misses(averaging_runs, variant, fragments):
    reference, runs, probes = averaging_runs
    assert_verdict(judged(judge_averaging, runs[variant], reference, probes[variant]), WRONG, *fragments)


def test_3_4_the_training_run_alone_catches_what_the_probe_would(averaging_runs):
    reference, runs, _ = averaging_runs
    for variant, fragment in [("per tensor", "all-reduces, not one"), ("not copied back", "not identical"),
                              ("summed", "other weights than LocalSGD's")]:
        assert_verdict(judged(l3.judge_averaging_runs, runs[variant], reference), WRONG, fragment)


def cat_of_a_generator(accelerator, model):
    flat = torch.cat(model.parameters())  # torch.cat wants a list or tuple
    flat = accelerator.reduce(flat, reduction="mean")
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def test_3_4_whole_check_passes_and_a_failing_worker_is_one_sentence():
    assert_verdict(l3.check_average_parameters.verdict(flat_mean), CORRECT, "in one all-reduce",
                   "LocalSGD issues 6 and a barrier")
    assert_verdict(l3.check_average_parameters.verdict(cat_of_a_generator), WRONG,
                   "average_parameters failed in a worker process with TypeError",
                   "each worker process called average_parameters(accelerator, model)")
