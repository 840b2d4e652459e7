"""Checks for notebooks/practice/03_local_sgd_practice.ipynb (lesson 03).

The learner's training loops run for real, in 2 processes started like lesson 3's
(``helpers.launcher.run_in_processes``), and the checks count the collectives they issue.
"""
import contextlib
import io

import torch

from helpers.collectives import CollectiveCounter, count_ddp, weight_gap
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes
from helpers.practice.verdicts import NotDone, Wrong, call_learner, checker, is_unfinished, require_callable
from helpers.training import LEARNING_RATE

MICRO_BATCH_SIZE = 4  # per process: what is counted (collectives, bytes) does not depend on it
LAUNCH_TIMEOUT_S = 180  # the whole check; far above what a check takes, so only a hang reaches it


def expected_rounds(local_sgd_steps_calls, local_sgd_steps):
    """Parameter averagings of a LocalSGD block: one every k calls of step(), and one more when the block ends."""
    return local_sgd_steps_calls // local_sgd_steps + 1


def practice_worker(accelerator, loops, micro_batches, gradient_accumulation_steps):
    """What every process runs: each learner loop on the tiny DistilBERT, with its collectives counted."""
    from helpers.data import load_tokenized, make_dataloader
    from helpers.models import build_model

    accelerator.gradient_accumulation_steps = gradient_accumulation_steps
    tokenized, tokenizer = load_tokenized()
    examples = tokenized["train"].select(range(micro_batches * MICRO_BATCH_SIZE * accelerator.num_processes))
    results = []
    for loop in loops:
        model = build_model("tiny", seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        counter = CollectiveCounter()
        optimizer_steps = []

        def count_step(*args):
            optimizer_steps.append(1)
            counter.step = len(optimizer_steps)  # collectives from now on belong after this step

        optimizer.register_step_post_hook(count_step)
        dataloader = make_dataloader(examples, tokenizer, MICRO_BATCH_SIZE)
        model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
        count_ddp(model)
        with counter:
            loop(accelerator, model, optimizer, dataloader)
        all_reduces = [(event["step"], event["bytes"]) for event in counter.events
                       if event["collective"] == "all_reduce"]
        results.append({"all_reduce_bytes": sum(n for _, n in all_reduces),
                        "sync_steps": sorted({step for step, _ in all_reduces}),
                        "optimizer_steps": len(optimizer_steps),
                        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                        "final_gap": weight_gap(accelerator, model, counter)})
    return results


def measure_loops(loops, micro_batches, gradient_accumulation_steps=1):
    """Run each ``loop(accelerator, model, optimizer, dataloader)`` on 2 processes; what each communicated."""
    with contextlib.redirect_stdout(io.StringIO()):  # the launcher's "Launching training on 2 CPUs."
        runs = run_in_processes(practice_worker, (list(loops), micro_batches, gradient_accumulation_steps),
                                timeout_s=LAUNCH_TIMEOUT_S)
    for run in runs:
        run["rounds"] = run["all_reduce_bytes"] / run["parameter_bytes"]
    return runs


def measure_learner_loop(loop, name, micro_batches, gradient_accumulation_steps=1):
    try:
        return measure_loops([loop], micro_batches, gradient_accumulation_steps)[0]
    except WorkerFailedError as error:
        last_line = error.worker_traceback.strip().splitlines()[-1]
        if "'local_sgd'" in last_line:
            hint = "local_sgd is the name that `with LocalSGD(...) as local_sgd:` gives; open that block around the loop."
        elif "LocalSGD" in last_line:
            hint = "import it first: from accelerate.local_sgd import LocalSGD."
        else:
            hint = "compare your loop with lesson 3's, line by line; both processes must run the same steps."
        raise Wrong(f"{name} failed in a worker process with {last_line}. Hint: {hint}") from None
    except WorkerTimeoutError:
        raise Wrong(f"{name} had not finished after {LAUNCH_TIMEOUT_S} s, so the check stopped it. Hint: both "
                    "processes must run the same steps; one that skips a local_sgd.step() or a backward leaves "
                    "the other waiting for it.") from None


def steps_text(steps):
    return ", ".join(str(s) for s in steps) if steps else "none"


@checker("3.1")
def check_predicted_bytes(predicted_bytes):
    """``predicted_bytes(steps, local_sgd_steps, parameter_bytes)``: bytes each process sends to average parameters."""
    require_callable(predicted_bytes, "predicted_bytes")
    cases = [(24, 8, 1000), (20, 8, 1000), (10, 1, 500), (7, 8, 4)]
    for steps, k, parameter_bytes in cases:
        answer = call_learner(predicted_bytes, steps, k, parameter_bytes, name="predicted_bytes")
        truth = expected_rounds(steps, k) * parameter_bytes
        if answer == truth:
            continue
        where = f"for {steps} steps with local_sgd_steps={k} and {parameter_bytes:,} bytes of parameters"
        if answer == steps // k * parameter_bytes:
            hint = "you count the averagings every k steps; leaving the `with LocalSGD(...)` block averages once more."
        elif answer == steps * parameter_bytes:
            hint = "that is DDP, which all-reduces every step; Local SGD averages every k steps."
        elif answer in (steps / k * parameter_bytes, (steps / k + 1) * parameter_bytes):
            hint = "the averagings are a whole number: one every k full steps (use //), plus one at the end."
        else:
            hint = "how many times are the parameters averaged, and how many bytes is each averaging?"
        shown = f"{answer:,}" if isinstance(answer, (int, float)) else repr(answer)
        raise Wrong(f"{where}, you predicted {shown} bytes; Local SGD sends {truth:,}. Hint: {hint}")
    return ("your formula gives (steps // k + 1) x parameter bytes: one averaging every k steps and one when the "
            "LocalSGD block ends. Exercise 3.2 measures it.")


@checker("3.2")
def check_local_sgd_loop(train_loop, predicted_bytes=None, micro_batches=24, local_sgd_steps=8):
    """``train_loop(accelerator, model, optimizer, dataloader, local_sgd_steps)``: the loop with Local SGD, on 2 processes."""
    require_callable(train_loop, "train_loop")

    def loop(accelerator, model, optimizer, dataloader):
        train_loop(accelerator, model, optimizer, dataloader, local_sgd_steps)

    run = measure_learner_loop(loop, "train_loop", micro_batches)
    judge_local_sgd_run(run, micro_batches, local_sgd_steps)
    measured = run["all_reduce_bytes"]
    message = (f"measured on 2 processes: the parameters were averaged after steps {steps_text(run['sync_steps'])} "
               f"and when the block ended, {run['rounds']:.0f} averagings, {measured:,} bytes all-reduced per process "
               f"(DDP would all-reduce {micro_batches * run['parameter_bytes']:,}); the workers ended with identical weights.")
    if predicted_bytes is None or is_unfinished(predicted_bytes):
        return message
    with contextlib.suppress(NotDone, Wrong):
        prediction = call_learner(predicted_bytes, micro_batches, local_sgd_steps, run["parameter_bytes"],
                                  name="predicted_bytes")
        agrees = "matches" if prediction == measured else "does not match; see exercise 3.1"
        return message + f" Your prediction from exercise 3.1: {prediction:,} bytes, which {agrees}."
    return message


def judge_local_sgd_run(run, micro_batches, local_sgd_steps):
    rounds = run["rounds"]
    if run["optimizer_steps"] != micro_batches:
        raise Wrong(f"the optimizer took {run['optimizer_steps']} steps for {micro_batches} batches. Hint: keep "
                    "lesson 2's loop as it is (forward, accelerator.backward, step, zero_grad for every batch).")
    if rounds == micro_batches and run["sync_steps"] == list(range(micro_batches)):
        raise Wrong(f"the gradients were all-reduced at every one of the {micro_batches} steps: that is plain DDP. "
                    "Hint: put the loop inside `with LocalSGD(accelerator=accelerator, model=model, "
                    "local_sgd_steps=local_sgd_steps, enabled=True) as local_sgd:` and call local_sgd.step() "
                    "after optimizer.zero_grad().")
    if rounds == 1:
        raise Wrong("the parameters were averaged only once, when the LocalSGD block ended. Hint: call "
                    "local_sgd.step() after optimizer.zero_grad(), at every step.")
    expected = expected_rounds(micro_batches, local_sgd_steps)
    if rounds != expected:
        raise Wrong(f"the parameters were averaged after steps {steps_text(run['sync_steps'])} ({rounds:.0f} averagings); "
                    f"with local_sgd_steps={local_sgd_steps} expect every {local_sgd_steps} steps plus once at the "
                    f"end: {expected}. Hint: pass local_sgd_steps to LocalSGD, and call local_sgd.step() once per step.")
    if run["final_gap"] != 0.0:
        raise Wrong(f"the two workers ended with different weights (largest gap {run['final_gap']:.2e}). Hint: keep "
                    "the whole loop inside the `with LocalSGD(...)` block, so that leaving it averages them.")


@checker("3.3")
def check_sync_every_8_optimizer_steps(train_loop_with_accumulation, micro_batches=32, gradient_accumulation_steps=2):
    """``train_loop_with_accumulation(accelerator, model, optimizer, dataloader)``: average every 8 optimizer steps."""
    require_callable(train_loop_with_accumulation, "train_loop_with_accumulation")
    run = measure_learner_loop(train_loop_with_accumulation, "train_loop_with_accumulation", micro_batches,
                               gradient_accumulation_steps)
    optimizer_steps = micro_batches // gradient_accumulation_steps
    judge_accumulation_run(run, optimizer_steps)
    return (f"with gradient_accumulation_steps={gradient_accumulation_steps}, {micro_batches} micro-batches made "
            f"{run['optimizer_steps']} optimizer steps, and the parameters were averaged after optimizer steps "
            f"{steps_text(run['sync_steps'])} (then once more as the block ended): every 8 optimizer steps.")


def judge_accumulation_run(run, optimizer_steps, every=8):
    if run["optimizer_steps"] != optimizer_steps:
        raise Wrong(f"the optimizer took {run['optimizer_steps']} steps instead of {optimizer_steps}. Hint: keep the "
                    "step inside `with accelerator.accumulate(model):`.")
    synced = [s for s in run["sync_steps"] if s < optimizer_steps] + [optimizer_steps]
    wanted = list(range(every, optimizer_steps + 1, every))
    if run["rounds"] == 1:
        raise Wrong("the parameters were averaged only once, when the block ended. Hint: call local_sgd.step().")
    if synced[0] < every and all(s % synced[0] == 0 for s in synced):
        raise Wrong(f"the parameters were averaged after optimizer steps {steps_text(synced)}: every "
                    f"{synced[0]} optimizer steps, not every {every}. Hint: local_sgd_steps counts calls of "
                    "local_sgd.step(), here one per micro-batch, and 2 micro-batches make one optimizer step.")
    if sorted(set(synced)) != wanted or run["rounds"] != len(wanted) + 1:
        raise Wrong(f"the parameters were averaged after optimizer steps {steps_text(synced)} ({run['rounds']:.0f} "
                    f"averagings); every {every} optimizer steps means after {steps_text(wanted)}, then once more at the "
                    "end. Hint: what does local_sgd_steps count?")
    if run["final_gap"] != 0.0:
        raise Wrong("the two workers ended with different weights. Hint: keep the loop inside the LocalSGD block.")
