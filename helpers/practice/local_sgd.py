"""Checks for notebooks/practice/03_local_sgd_practice.ipynb (lesson 03).

Every check measures. The training loops run for real, on 2 processes started like lesson 3's
(``helpers.launcher.run_in_processes``), and each process logs every all-reduce it issues (DDP's
gradients, told apart by the communication hook that sends them, or averaged parameters), the
optimizer steps it takes, and whether the two workers' weights are identical after each step.
A check compares the answer with the intended answer measured the same way (in the same launch
when the answer is a loop): exactly for what no hardware changes (bytes, steps, order), within
a tight tolerance for trained weights.

A small classifier, called like the lesson's model (``model(**batch).loss``), stands in for the
tiny DistilBERT: what is counted does not depend on the model's size, and a step takes milliseconds.
"""
import contextlib
import functools
import io
import numbers
from types import SimpleNamespace

import torch
from accelerate.local_sgd import LocalSGD

from helpers.collectives import CollectiveCounter, weight_gap
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes
from helpers.practice.verdicts import Wrong, call_learner, checker, require_callable
from helpers.training import LEARNING_RATE

FEATURES, HIDDEN, CLASSES = 8, 16, 2  # the small classifier: 3 layers, 6 parameter tensors, 1,800 bytes
MICRO_BATCH_SIZE = 4  # examples per micro-batch and process: what is counted does not depend on it
LAUNCH_TIMEOUT_S = 180  # the whole check; far above what a check takes, so only a hang reaches it
# Two loops that do the same arithmetic end with the same weights, up to rounding (~1e-7); one that
# trains differently moves some weight by a good share of an AdamW step, which is up to the learning
# rate (3e-3): the near misses of tests/test_practice_03.py move them by 1e-3 and more.
WEIGHTS_TOLERANCE = LEARNING_RATE / 100
BEFORE_THE_LOOP, AFTER_THE_LOOP = "before the loop", "after the loop"

# Exercise 3.1: (steps, local_sgd_steps); exercise 3.2: (micro-batches, gradient_accumulation_steps, k)
PREDICTION_CASES = [(16, 8), (12, 8), (5, 8), (3, 1)]
ACCUMULATION_CASES = [(16, 2, 4), (12, 4, 3)]
# Exercise 3.3: the loop to fix runs 16 micro-batches, 2 per optimizer step, and averages every 8 micro-batches
FIX_MICRO_BATCHES, FIX_ACCUMULATION, FIX_LOCAL_SGD_STEPS = 16, 2, 8
# Exercise 3.4: the Local SGD loop that calls the learner's averaging
AVERAGING_MICRO_BATCHES, AVERAGING_LOCAL_SGD_STEPS = 16, 4


class SmallClassifier(torch.nn.Module):
    """Three linear layers, called like the lessons' model: ``model(**batch).loss``."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                          torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                          torch.nn.Linear(HIDDEN, CLASSES))

    def forward(self, inputs, labels):
        logits = self.layers(inputs)  # (batch, CLASSES)
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)


def make_examples(count):
    """``count`` labelled examples, the same on every process (the prepared data loader shares them out)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(count, FEATURES, generator=generator)
    labels = (inputs[:, 0] + inputs[:, 1] > 0).long()
    return [{"inputs": x, "labels": y} for x, y in zip(inputs, labels)]


# --- the intended loops (what the checks compare with) -----------------------------------------

def lesson_loop(local_sgd_steps):
    """Lesson 3's loop, cut to its core: local_sgd.step() after every micro-batch's zero_grad."""
    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps,
                      enabled=True) as local_sgd:
            for batch in dataloader:
                with accelerator.accumulate(model):
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    local_sgd.step()
    return loop


def ddp_loop(accelerator, model, optimizer, dataloader):
    """The same loop without Local SGD: DDP all-reduces the gradients of every optimizer step."""
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()


def local_sgd_loop_with(average_parameters, local_sgd_steps):
    """Local SGD written out, with ``average_parameters`` as its averaging.

    As Accelerate's LocalSGD does it (accelerate/local_sgd.py), less its barrier: DDP's gradient
    all-reduce off for the whole loop (``model.no_sync()``), an averaging every ``local_sgd_steps``
    micro-batches, and one more at the end.
    """
    def loop(accelerator, model, optimizer, dataloader):
        with model.no_sync():
            for number, batch in enumerate(dataloader, 1):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
                if number % local_sgd_steps == 0:
                    average_parameters(accelerator, model)
            average_parameters(accelerator, model)
    return loop


# --- measuring, in each worker process ---------------------------------------------------------

class TracedBatches:
    """The prepared data loader, as the learner's loop sees it, noting where each all-reduce happens.

    Each logged collective is labelled ``[micro-batch, optimizer steps done]``: micro-batch 0 is
    before the loop draws its first batch, ``len + 1`` after it drew its last. After each optimizer
    step (seen when the next batch is drawn, or the batches run out) it records whether the two
    workers' weights are identical.
    """

    def __init__(self, accelerator, model, optimizer, dataloader, counter):
        self.accelerator, self.model, self.dataloader, self.counter = accelerator, model, dataloader, counter
        self.micro_batch, self.steps_done, self.checked_steps = 0, 0, 0
        self.steps_at_draw = []  # optimizer steps done when each micro-batch was drawn
        self.identical_after = {}  # optimizer step -> the two workers' weights identical after it
        optimizer.optimizer.register_step_post_hook(self._stepped)  # inside Accelerate's wrapper: real steps
        self._label()

    def _label(self):
        self.counter.step = [self.micro_batch, self.steps_done]

    def _stepped(self, *args):
        self.steps_done += 1
        self._label()

    def _check_weights(self):
        if self.steps_done > self.checked_steps:
            self.checked_steps = self.steps_done
            self.identical_after[self.steps_done] = weight_gap(self.accelerator, self.model, self.counter) == 0.0

    def __len__(self):
        return len(self.dataloader)

    def __iter__(self):
        for batch in self.dataloader:
            self._check_weights()
            self.micro_batch += 1
            self.steps_at_draw.append(self.steps_done)
            self._label()
            yield batch
        self._check_weights()
        self.micro_batch = len(self.dataloader) + 1
        self._label()


def count_gradients(model, counter):
    """Route DDP's gradient all-reduce through PyTorch's default hook, and mark its events as gradients."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        logged = len(counter.events)
        future = allreduce_hook(None, bucket)
        for event in counter.events[logged:]:
            event["kind"] = "gradients"
        return future

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(state=None, hook=hook)


def prepared_run(accelerator, micro_batches, gradient_accumulation_steps):
    """A fresh model, optimizer and data loader of ``micro_batches`` micro-batches per process, prepared."""
    accelerator.gradient_accumulation_steps = gradient_accumulation_steps
    accelerator.step = 0  # Accelerate's count of micro-batches towards the next optimizer step
    torch.manual_seed(0)  # in the worker process: the notebook's generators are not touched
    model = SmallClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    examples = make_examples(micro_batches * MICRO_BATCH_SIZE * accelerator.num_processes)
    dataloader = torch.utils.data.DataLoader(examples, batch_size=MICRO_BATCH_SIZE)
    return accelerator.prepare(model, optimizer, dataloader)


def measure_run(accelerator, loop, micro_batches, gradient_accumulation_steps=1):
    """Run ``loop(accelerator, model, optimizer, dataloader)`` once; what this process communicated."""
    from helpers.models import flat_parameters

    model, optimizer, dataloader = prepared_run(accelerator, micro_batches, gradient_accumulation_steps)
    counter = CollectiveCounter()
    count_gradients(model, counter)
    batches = TracedBatches(accelerator, model, optimizer, dataloader, counter)
    with counter:
        loop(accelerator, model, optimizer, batches)
    final_gap = weight_gap(accelerator, model, counter)
    return {"micro_batches": micro_batches, "gradient_accumulation_steps": gradient_accumulation_steps,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "parameter_tensors": len(list(model.parameters())),
            "optimizer_steps": batches.steps_done, "steps_at_draw": batches.steps_at_draw + [batches.steps_done],
            "events": [{"where": event["step"], "collective": event["collective"], "bytes": event["bytes"],
                        "kind": event.get("kind", "parameters")} for event in counter.events],
            "identical_after": sorted(batches.identical_after.items()), "identical_at_end": final_gap == 0.0,
            "final_parameters": flat_parameters(model).cpu().tolist()}


def probe_averaging(accelerator, average_parameters):
    """Give each process its own parameters, call ``average_parameters`` once; what it did to them."""
    from helpers.models import flat_parameters

    model, _, _ = prepared_run(accelerator, 1, 1)
    own = {rank: torch.randn(sum(p.numel() for p in model.parameters()),
                             generator=torch.Generator().manual_seed(1000 + rank))
           for rank in range(accelerator.num_processes)}
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(own[accelerator.process_index].to(accelerator.device),
                                            model.parameters())
    counter = CollectiveCounter()
    with counter:
        average_parameters(accelerator, model)
    after = flat_parameters(model).cpu()
    total = sum(own.values())

    def off(target):
        return (after - target).abs().max().item()

    return {"off_mean": off(total / accelerator.num_processes), "off_sum": off(total),
            "off_own": off(own[accelerator.process_index]), "scale": total.abs().max().item(),
            "collectives": [[event["collective"], event["bytes"]] for event in counter.events],
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "parameter_tensors": len(list(model.parameters()))}


def practice_worker(accelerator, runs, averagings=()):
    """What every process runs: each ``(loop, micro_batches, gradient_accumulation_steps)``, then each probe."""
    return {"runs": [measure_run(accelerator, *run) for run in runs],
            "probes": [probe_averaging(accelerator, average) for average in averagings]}


def launch(runs, averagings=()):
    """Measure ``runs`` (and probe each function of ``averagings``) on 2 processes; process 0's measurements."""
    with contextlib.redirect_stdout(io.StringIO()):  # the launcher's "Launching training on 2 CPUs."
        return run_in_processes(practice_worker, (list(runs), list(averagings)), timeout_s=LAUNCH_TIMEOUT_S,
                                preload=False)  # the stand-in model needs neither DistilBERT nor the data


def launch_learners(runs, how_called, averagings=()):
    """``launch``, with a worker's failure or a hang turned into one sentence that says what to look at.

    ``how_called`` says how each worker called the learner's function, e.g. ``average_parameters(accelerator, model)``.
    """
    name = how_called.split("(")[0]
    try:
        return launch(runs, averagings)
    except WorkerFailedError as error:
        last_line = error.worker_traceback.strip().splitlines()[-1]
        raise Wrong(f"{name} failed in a worker process with {last_line}. Hint: "
                    f"{failure_hint(last_line, how_called)}") from None
    except WorkerTimeoutError:
        raise Wrong(f"{name} had not finished after {LAUNCH_TIMEOUT_S} s, so the check stopped it. Hint: both "
                    "processes must issue the same collectives in the same order; a step that only one "
                    "process takes (under `if accelerator.is_main_process:`) leaves the other waiting.") from None


def failure_hint(last_line, how_called):
    if "'local_sgd'" in last_line:
        return "local_sgd is the name that `with LocalSGD(...) as local_sgd:` gives; keep that line."
    if "LocalSGD" in last_line:
        return "import it first: from accelerate.local_sgd import LocalSGD."
    if "timeout" in last_line.lower() or "timed out" in last_line.lower():
        return ("one process waited for a collective that the other never issued: every process must call "
                "the same collectives, in the same order (no `if accelerator.is_main_process:` around them).")
    return f"each worker process called {how_called}; that error came from it."


# --- reading a run: where each all-reduce happened -------------------------------------------

def communication_table(run):
    """What a run all-reduced, by place: before the loop, at each optimizer step, after the loop.

    Each step's row: ``gradients`` (DDP's bytes for that step), ``before`` (parameters averaged in the
    micro-batch that takes the step, before it is taken), ``after`` (averaged after the step, before
    the next micro-batch; row 0: before the first step), ``calls`` (parameter all-reduces), and
    ``identical`` (the workers' weights identical after the step and its averaging).
    """
    end = run["micro_batches"] + 1
    steps_after = run["steps_at_draw"][1:]  # optimizer steps done after micro-batch 1, 2, ...
    rows = {}

    def row(step):
        return rows.setdefault(step, {"step": step, "gradients": 0, "before": 0, "after": 0, "calls": 0,
                                      "identical": None})

    for step in range(1, run["optimizer_steps"] + 1):
        row(step)
    table = {BEFORE_THE_LOOP: 0, AFTER_THE_LOOP: 0, "other_collectives": 0}
    for event in run["events"]:
        micro_batch, steps_done = event["where"]
        if event["collective"] != "all_reduce":
            table["other_collectives"] += event["collective"] != "barrier"
        elif event["kind"] == "gradients":
            row(steps_done + 1)["gradients"] += event["bytes"]
        elif micro_batch in (0, end):
            table[BEFORE_THE_LOOP if micro_batch == 0 else AFTER_THE_LOOP] += event["bytes"]
        else:
            step_to_come = steps_after[micro_batch - 1] > steps_done  # this micro-batch has yet to take its step
            averaged = row(steps_done + 1) if step_to_come else row(steps_done)
            averaged["before" if step_to_come else "after"] += event["bytes"]
            averaged["calls"] += 1
    for step, identical in run["identical_after"]:
        row(step)["identical"] = identical
    table["steps"] = [rows[step] for step in sorted(rows)]
    return table


def averaged_after(table):
    """The optimizer steps after which the parameters were averaged (correctly: after the step)."""
    return [row["step"] for row in table["steps"] if row["after"]]


def averaged_before(table):
    return [row["step"] for row in table["steps"] if row["before"]]


def gradient_steps(table):
    return [row["step"] for row in table["steps"] if row["gradients"]]


def total_bytes(run):
    return sum(event["bytes"] for event in run["events"] if event["collective"] == "all_reduce")


def steps_text(steps):
    if not steps:
        return "none"
    return ", ".join(str(s) for s in steps[:-1]) + (" and " if len(steps) > 1 else "") + str(steps[-1])


def largest_weight_difference(run, reference):
    """Largest difference between two runs' final weights (process 0's)."""
    return max(abs(a - b) for a, b in zip(run["final_parameters"], reference["final_parameters"]))


def table_rows(run):
    """The rows ``show_communication`` prints: place, gradients, parameters averaged, weights after."""
    table = communication_table(run)

    def amount(bytes_, note=""):
        return f"{bytes_:,} B{note}" if bytes_ else "-"

    def weights(identical):
        return {True: "identical", False: "different", None: ""}[identical]

    rows = [(BEFORE_THE_LOOP, "-", amount(table[BEFORE_THE_LOOP]), "")]
    for row in table["steps"]:
        averaged = ", ".join(text for text in (amount(row["before"], " before the step") if row["before"] else "",
                                               amount(row["after"]) if row["after"] else "") if text) or "-"
        place = f"optimizer step {row['step']}" if row["step"] else "before step 1"
        rows.append((place, amount(row["gradients"]), averaged, weights(row["identical"])))
    rows.append((AFTER_THE_LOOP, "-", amount(table[AFTER_THE_LOOP]), weights(run["identical_at_end"])))
    return rows


def show_communication(train_loop):
    """Run ``train_loop`` as exercise 3.3's check does, and print what it all-reduced, step by step."""
    require_callable(train_loop, "train_loop")
    run, ddp = launch([(train_loop, FIX_MICRO_BATCHES, FIX_ACCUMULATION),
                       (ddp_loop, FIX_MICRO_BATCHES, FIX_ACCUMULATION)])["runs"]
    print(f"{train_loop.__name__} on 2 processes: {FIX_MICRO_BATCHES} micro-batches, accumulation "
          f"{FIX_ACCUMULATION}, {run['optimizer_steps']} optimizer steps; what each process all-reduced:")
    line = "{:>16} | {:>15} | {:>27} | {}"
    print(line.format("", "gradients (DDP)", "parameters averaged", "weights after"))
    for row in table_rows(run):
        print(line.format(*row).rstrip(" |"))
    print(f"total: {total_bytes(run):,} bytes; plain DDP, measured in the same launch: {total_bytes(ddp):,} bytes.")


# --- the checks ----------------------------------------------------------------------------------

@functools.cache
def intended_measurements():
    """The intended loops for exercises 3.1 and 3.2, measured once per kernel (one launch).

    Returns ``{("local sgd", steps, 1, k): run, ("ddp", micro_batches, a, None): run, ...}``.
    """
    cases = [("local sgd", steps, 1, k) for steps, k in PREDICTION_CASES]
    for micro_batches, accumulation, k in ACCUMULATION_CASES:
        cases += [("ddp", micro_batches, accumulation, None), ("local sgd", micro_batches, accumulation, k)]
    runs = [(lesson_loop(k) if kind == "local sgd" else ddp_loop, micro_batches, accumulation)
            for kind, micro_batches, accumulation, k in cases]
    return dict(zip(cases, launch(runs)["runs"]))


def shown(answer):
    return f"{answer:,}" if is_number(answer) else repr(answer)


PREDICTION_MISTAKES = [  # (what a learner may have computed, for (steps, k, parameter_bytes); the hint)
    (lambda s, k, p: s // k * p, "you count the averagings every k steps; leaving the `with LocalSGD(...)` block "
                                 "averages once more."),
    (lambda s, k, p: -(-s // k) * p, "rounding steps / k up is not it: one averaging after every k-th step (//), "
                                     "plus one as the block ends."),
    (lambda s, k, p: s * p, "that is DDP, which all-reduces every step; Local SGD averages every k steps."),
    (lambda s, k, p: (s / k + 1) * p, "the averagings are a whole number: one every k full steps (use //), plus one "
                                      "as the block ends."),
    (lambda s, k, p: s // k + 1, "that is the number of averagings; each one sends all the parameters: "
                                 "parameter_bytes."),
    (lambda s, k, p: 2 * (s // k + 1) * p, "a ring all-reduce over N processes sends 2(N-1)/N times its payload "
                                           "from each: for N = 2, the payload itself."),
]
DDP_MISTAKES = [  # for (micro_batches, gradient_accumulation_steps, k, parameter_bytes)
    (lambda m, a, k, p: m * p, "under accelerator.accumulate, DDP all-reduces the gradients only in the backward "
                               "of the micro-batch that completes an optimizer step."),
]
LOCAL_SGD_MISTAKES = [
    (lambda m, a, k, p: (m // a // k + 1) * p, "local_sgd_steps counts calls of local_sgd.step(), and the slide's "
                                               "loop calls it once per micro-batch, not once per optimizer step."),
    (lambda m, a, k, p: (m // k + 1 + m // a) * p, "inside the `with LocalSGD` block DDP does not all-reduce the "
                                                   "gradients at all, not even in the micro-batch that completes a "
                                                   "step: entering the block switched that off (model.no_sync())."),
    (lambda m, a, k, p: m // k * p, "leaving the `with LocalSGD(...)` block averages once more."),
]


def is_number(answer):
    return isinstance(answer, numbers.Real) and not isinstance(answer, bool)  # numpy's numbers too


def same_number(answer, truth):
    return is_number(answer) and answer == truth


def diagnose(answers, mistakes, default):
    """The hint of the first mistake that explains every answer (``{args: answer}``), else ``default``."""
    for mistake, hint in mistakes:
        if all(same_number(answer, mistake(*args)) for args, answer in answers.items()):
            return hint
    return default


@checker("3.1")
def check_predicted_bytes(predicted_bytes):
    """``predicted_bytes(steps, local_sgd_steps, parameter_bytes)``, checked against lesson 3's loop, measured."""
    require_callable(predicted_bytes, "predicted_bytes")
    measured = intended_measurements()
    runs = {(steps, k): measured[("local sgd", steps, 1, k)] for steps, k in PREDICTION_CASES}
    answers = {(steps, k, run["parameter_bytes"]): call_learner(predicted_bytes, steps, k, run["parameter_bytes"],
                                                                name="predicted_bytes")
               for (steps, k), run in runs.items()}
    for (steps, k, p), answer in answers.items():
        truth = total_bytes(runs[(steps, k)])
        if same_number(answer, truth):
            continue
        hint = diagnose(answers, PREDICTION_MISTAKES,
                        "how many times are the parameters averaged, and how many bytes is each averaging?")
        raise Wrong(f"for {steps} steps with local_sgd_steps={k} and {p:,} bytes of parameters, you predicted "
                    f"{shown(answer)} bytes; measured on 2 processes, lesson 3's loop all-reduced {truth:,}. "
                    f"Hint: {hint}")
    cases = "; ".join(f"{steps} steps, k={k}: {answer:,}" for (steps, k, _), answer in answers.items())
    return (f"your predictions match the bytes lesson 3's loop all-reduced on 2 processes ({cases}): one "
            "averaging after every k-th step and one more as the block ends, each of all the parameters.")


@checker("3.2")
def check_predicted_bytes_with_accumulation(predicted_bytes_with_accumulation):
    """``(ddp_bytes, local_sgd_bytes)`` for ``(micro_batches, gradient_accumulation_steps, local_sgd_steps, parameter_bytes)``."""
    name = "predicted_bytes_with_accumulation"
    require_callable(predicted_bytes_with_accumulation, name)
    measured = intended_measurements()
    answers, truths = {}, {}
    for m, a, k in ACCUMULATION_CASES:
        ddp, local = measured[("ddp", m, a, None)], measured[("local sgd", m, a, k)]
        p = ddp["parameter_bytes"]
        answer = call_learner(predicted_bytes_with_accumulation, m, a, k, p, name=name)
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2
                and all(is_number(number) for number in answer)):
            raise Wrong(f"{name} should return two numbers, (DDP's bytes, Local SGD's bytes), but it returned "
                        f"{answer!r}.")
        answers[(m, a, k, p)], truths[(m, a, k, p)] = tuple(answer), (total_bytes(ddp), total_bytes(local))
    for (m, a, k, p), (ddp_answer, local_answer) in answers.items():
        ddp, local = truths[(m, a, k, p)]
        if same_number(ddp_answer, ddp) and same_number(local_answer, local):
            continue
        if all(answer == truth[::-1] for answer, truth in zip(answers.values(), truths.values())):
            hint = "you swapped them: return (DDP's bytes, Local SGD's bytes)."
        elif not same_number(ddp_answer, ddp):
            hint = diagnose({args: answer[0] for args, answer in answers.items()}, DDP_MISTAKES,
                            "DDP all-reduces the gradients once per optimizer step: how many optimizer steps are there?")
        else:
            hint = diagnose({args: answer[1] for args, answer in answers.items()}, LOCAL_SGD_MISTAKES,
                            "count the calls of local_sgd.step(): one averaging every k of them, one as the block ends.")
        raise Wrong(f"for {m} micro-batches with gradient_accumulation_steps={a}, local_sgd_steps={k} and {p:,} bytes "
                    f"of parameters, you predicted DDP {shown(ddp_answer)} and Local SGD {shown(local_answer)} bytes; "
                    f"measured on 2 processes: DDP {ddp:,} and Local SGD {local:,}. Hint: {hint}")
    (m, a, k, p), (ddp, local) = list(truths.items())[-1]
    return (f"your predictions match the measurement on 2 processes. With {m} micro-batches, accumulation {a} and "
            f"local_sgd_steps={k}, Local SGD sent {local:,} bytes and DDP {ddp:,}: k counts micro-batches, so a k "
            "below the accumulation averages more often than DDP all-reduces.")


def intended_fix():
    """The loop of exercise 3.3 as it should be: lesson 3's loop, averaging every 8 micro-batches."""
    return lesson_loop(FIX_LOCAL_SGD_STEPS)


def judge_fixed_loop(run, reference):
    """Compare the learner's run of exercise 3.3 with the intended loop's, measured in the same launch."""
    table, intended = communication_table(run), communication_table(reference)
    if run["optimizer_steps"] != reference["optimizer_steps"]:
        raise Wrong(f"your loop took {run['optimizer_steps']} optimizer steps in {FIX_MICRO_BATCHES} micro-batches "
                    f"instead of {reference['optimizer_steps']}. Hint: keep backward, optimizer.step() and "
                    "zero_grad inside `with accelerator.accumulate(model):`, once per micro-batch.")
    gradients = gradient_steps(table)
    averaged_anywhere = (table[BEFORE_THE_LOOP] or table[AFTER_THE_LOOP]
                         or any(row["before"] or row["after"] for row in table["steps"]))
    if gradients and not averaged_anywhere:
        raise Wrong(f"DDP all-reduced the gradients at optimizer steps {steps_text(gradients)} and the parameters "
                    "were never averaged: Local SGD did nothing. Hint: keep enabled=True and the LocalSGD block "
                    "of the loop you were given; move lines, change nothing else.")
    if gradients or table[BEFORE_THE_LOOP]:
        what = []
        if gradients:
            what.append(f"DDP all-reduced the gradients at optimizer steps {steps_text(gradients)}")
        if table[BEFORE_THE_LOOP]:
            what.append("the parameters were averaged before the first batch")
        raise Wrong(f"{' and '.join(what)}. Hint: the loop runs outside the `with LocalSGD(...)` block: entering the "
                    "block switches DDP's gradient all-reduce off and leaving it averages the parameters, so "
                    "the for loop must be indented inside it.")
    before = averaged_before(table)
    if before:
        steps = f"step {before[0]} was" if len(before) == 1 else f"steps {steps_text(before)} were"
        raise Wrong(f"the parameters were averaged before optimizer {steps} taken, so each worker then applied its "
                    "own step and the weights differed right after the averaging. Hint: call local_sgd.step() "
                    "after optimizer.step() (the lesson calls it after zero_grad).")
    if averaged_after(table) != averaged_after(intended) or table[AFTER_THE_LOOP] != intended[AFTER_THE_LOOP]:
        during = (f"after optimizer steps {steps_text(averaged_after(table))}" if averaged_after(table)
                  else "at no optimizer step")
        end = "and once after the loop" if table[AFTER_THE_LOOP] else "and not after the loop"
        raise Wrong(f"the parameters were averaged {during} {end}; the loop you were given averages after steps "
                    f"{steps_text(averaged_after(intended))} and once after the loop. Hint: move lines, change "
                    "nothing else: keep local_sgd_steps=8 and one local_sgd.step() per micro-batch, inside the "
                    "block.")
    if table != intended or run["identical_at_end"] != reference["identical_at_end"]:
        raise Wrong("your loop communicated differently from the fixed loop (same steps and averagings, but not "
                    "the same bytes or weights after each step). Hint: move lines, change nothing else.")
    difference = largest_weight_difference(run, reference)
    if difference > WEIGHTS_TOLERANCE:
        raise Wrong(f"your loop communicates as intended, but trains differently: its final weights differ from the "
                    f"fixed loop's by up to {difference:.1e}. Hint: move the misplaced lines, change nothing else "
                    "(keep zero_grad, add no clipping or extra step).")


@checker("3.3")
def check_fixed_loop(fixed_train_loop):
    """``fixed_train_loop(accelerator, model, optimizer, dataloader)``: exercise 3.3's loop, fixed."""
    require_callable(fixed_train_loop, "fixed_train_loop")
    runs = launch_learners([(fixed_train_loop, FIX_MICRO_BATCHES, FIX_ACCUMULATION),
                            (intended_fix(), FIX_MICRO_BATCHES, FIX_ACCUMULATION)],
                           "fixed_train_loop(accelerator, model, optimizer, dataloader), all prepared, with "
                           f"gradient_accumulation_steps={FIX_ACCUMULATION}")["runs"]
    run, reference = runs
    judge_fixed_loop(run, reference)
    table = communication_table(run)
    return (f"measured on 2 processes, your loop sent no gradients and averaged the parameters after optimizer "
            f"steps {steps_text(averaged_after(table))} and once as the block ended, {total_bytes(run):,} bytes in "
            "all; the workers' weights were identical after every averaging, and its final weights are the "
            "intended loop's.")


def judge_probe(probe):
    """What ``average_parameters`` did to parameters that differ between the processes."""
    tolerance = 1e-6 * probe["scale"]
    all_reduces = [n for collective, n in probe["collectives"] if collective == "all_reduce"]
    others = sorted({collective for collective, _ in probe["collectives"]} - {"all_reduce", "barrier"})
    if probe["off_mean"] > tolerance:
        if probe["off_own"] == 0.0:
            hint = ("your function left the parameters as they were. If you all-reduce a flat copy (torch.cat "
                    "or parameters_to_vector makes a new tensor), copy the result back into the parameters: "
                    "torch.nn.utils.vector_to_parameters(flat, model.parameters()).")
        elif probe["off_sum"] <= tolerance:
            hint = ("the parameters hold the sum of both processes' parameters, not their mean: divide by "
                    "accelerator.num_processes (Accelerator.reduce sums unless given reduction=\"mean\").")
        else:
            hint = "each parameter should end as the mean of that parameter over the processes, in its own place."
        raise Wrong(f"given parameters that differ between the 2 processes, your function did not leave every "
                    f"parameter equal to its mean over them. Hint: {hint}")
    if others:
        raise Wrong(f"your function averaged the parameters, with {', '.join(others)}. Hint: a gather receives every "
                    "process's copy; one all-reduce sums them in place, and every process gets the sum.")
    if len(all_reduces) != 1:
        per_tensor = len(all_reduces) == probe["parameter_tensors"]
        hint = ("that is one per parameter tensor, as LocalSGD does: put all the parameters in one flat tensor "
                "first (torch.nn.utils.parameters_to_vector)." if per_tensor else "flatten the parameters into one "
                "tensor and all-reduce it once.")
        raise Wrong(f"your function averaged the parameters correctly, with {len(all_reduces)} all-reduces; the "
                    f"exercise asks for one. Hint: {hint}")
    if all_reduces[0] != probe["parameter_bytes"]:
        raise Wrong(f"your all-reduce sent {all_reduces[0]:,} bytes; the parameters are {probe['parameter_bytes']:,} "
                    "bytes. Hint: all-reduce the parameters themselves, in their own dtype, once.")


def judge_averaging_runs(run, reference):
    """Compare Local SGD with the learner's averaging against Accelerate's LocalSGD, same launch."""
    table, intended = communication_table(run), communication_table(reference)
    calls = {row["calls"] for row in table["steps"] if row["after"]}
    difference = largest_weight_difference(run, reference)
    if (averaged_after(table) != averaged_after(intended) or [r["after"] for r in table["steps"]]
            != [r["after"] for r in intended["steps"]] or table[AFTER_THE_LOOP] != intended[AFTER_THE_LOOP]):
        raise Wrong("inside Local SGD, your averaging did not all-reduce what LocalSGD does where it does (all "
                    "the parameters, after every k-th step and at the end). Hint: one all-reduce of all the "
                    "parameters, and nothing else.")
    if not all(row["identical"] for row in table["steps"] if row["after"]) or not run["identical_at_end"]:
        raise Wrong("inside Local SGD, the workers' weights were not identical after your averaging. Hint: every "
                    "process must end with the same averaged values in its parameters.")
    if calls != {1}:
        raise Wrong(f"inside Local SGD, each averaging took {steps_text(sorted(calls))} all-reduces, not one. "
                    "Hint: all-reduce one flat tensor of all the parameters.")
    if difference > WEIGHTS_TOLERANCE:
        raise Wrong(f"inside Local SGD your averaging left other weights than LocalSGD's (up to {difference:.1e} "
                    "apart). Hint: every parameter must end as its own mean, in its own place.")


@checker("3.4")
def check_average_parameters(average_parameters):
    """``average_parameters(accelerator, model)``: average the parameters over the processes in one all-reduce."""
    require_callable(average_parameters, "average_parameters")
    loop = local_sgd_loop_with(average_parameters, AVERAGING_LOCAL_SGD_STEPS)
    measured = launch_learners([(loop, AVERAGING_MICRO_BATCHES, 1),
                                (lesson_loop(AVERAGING_LOCAL_SGD_STEPS), AVERAGING_MICRO_BATCHES, 1)],
                               "average_parameters(accelerator, model), with the model prepared (in DDP)",
                               [average_parameters])
    (run, reference), (probe,) = measured["runs"], measured["probes"]
    judge_probe(probe)
    judge_averaging_runs(run, reference)
    intended = communication_table(reference)
    per_averaging = {row["calls"] for row in intended["steps"] if row["after"]}
    return (f"measured on 2 processes: your function averages the {probe['parameter_tensors']} parameter tensors "
            f"({probe['parameter_bytes']:,} bytes) in one all-reduce, where LocalSGD issues "
            f"{steps_text(sorted(per_averaging))} and a barrier; in Local SGD with k={AVERAGING_LOCAL_SGD_STEPS} it "
            "sends the same bytes and leaves the same weights as LocalSGD.")
