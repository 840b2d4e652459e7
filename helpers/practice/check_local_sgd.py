"""Checks for notebooks/practice/03_local_sgd_practice.ipynb (lesson 03).

Every check measures. The training loops run for real, on 2 processes (3 for exercise
3.4) started like lesson 3's (``helpers.launcher.run_in_processes``), and each process
logs every all-reduce it issues (DDP's gradients, told apart by the communication hook
that sends them, or averaged parameters), the optimizer steps it takes, the gradients
each step applies, and whether the workers' weights are identical after each step. A
check compares the answer with the intended answer measured the same way (in the same
launch when the answer is a loop): exactly for what no hardware changes (bytes, steps,
order), within a tight tolerance for gradients and trained weights.

A small classifier, called like the lesson's model (``model(**batch).loss``), with
dropout as DistilBERT has, stands in for the tiny DistilBERT: what is counted does not
depend on the model's size, and a step takes milliseconds. Exercises 3.1 and 3.2 also
measure a wider one, in cases that no text names, so that only a prediction computed
from the arguments passes.
"""
import contextlib
import functools
import io
import math
import numbers
from types import SimpleNamespace

import torch
from accelerate.local_sgd import LocalSGD

from helpers.collectives import CollectiveCounter, weight_gap
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes
from helpers.practice.verdicts import Wrong, call_learner, checker, require_callable
from helpers.training import LEARNING_RATE

# the small classifier: 3 linear layers, 6 parameter tensors, 1,800 bytes
FEATURES, HIDDEN, CLASSES = 8, 16, 2
# the second classifier of exercises 3.1 and 3.2 (3,464 bytes), in cases no text names
WIDER_HIDDEN = 24
# as DistilBERT's: a loop that switches the model to eval mode trains differently
DROPOUT = 0.1
# Features of standard deviation 6: the gradients' norm then exceeds 1 at every
# optimizer step of exercise 3.3's loop (tests/test_practice_03.py checks it), so
# clipping at the usual max_grad_norm=1.0 changes them.
INPUT_SCALE = 6.0
# examples per micro-batch and process: what is counted does not depend on it
MICRO_BATCH_SIZE = 4
# the whole check; far above what a check takes, so only a hang reaches it
LAUNCH_TIMEOUT_S = 180
# Two loops that do the same arithmetic apply the same gradients and end with the same
# weights, up to rounding. The final weights alone are not enough: AdamW divides each
# step by the gradients' running root mean square, so a loop whose gradients are all
# scaled by a constant (a loss divided once more by the accumulation, or multiplied by
# 10) ends within rounding distance of the intended weights. So the checks compare the
# gradients before every optimizer step (relative to their largest entry), and then the
# final weights, to within a hundredth of the learning rate.
GRADIENT_TOLERANCE = 1e-5
# exercise 3.4's probe, of the largest sum: a float32 mean's rounding is far below it
PROBE_TOLERANCE = 1e-6
WEIGHTS_TOLERANCE = LEARNING_RATE / 100
BEFORE_THE_LOOP, AFTER_THE_LOOP = "before the loop", "after the loop"

# Exercise 3.1: (steps, local_sgd_steps, hidden width). The text names neither the cases
# nor the wider model.
PREDICTION_CASES = [(16, 8, HIDDEN), (12, 8, HIDDEN), (5, 8, HIDDEN), (3, 1, HIDDEN),
                    (10, 3, WIDER_HIDDEN)]
# Exercise 3.2: (micro-batches, gradient_accumulation_steps, k, hidden width); k need
# not divide the micro-batches
ACCUMULATION_CASES = [(16, 2, 4, HIDDEN), (12, 4, 3, HIDDEN), (12, 2, 5, HIDDEN),
                      (18, 3, 4, WIDER_HIDDEN)]
# Exercise 3.3: the loop to fix runs 16 micro-batches, 2 per optimizer step, and
# averages every 8 micro-batches
FIX_MICRO_BATCHES, FIX_ACCUMULATION, FIX_LOCAL_SGD_STEPS = 16, 2, 8
# Exercise 3.4: the Local SGD loop that calls the learner's averaging, on 3 processes: a
# function that divides by 2 instead of by the number of processes would pass on 2
AVERAGING_MICRO_BATCHES, AVERAGING_LOCAL_SGD_STEPS, AVERAGING_PROCESSES = 16, 4, 3


class SmallClassifier(torch.nn.Module):
    """Three linear layers with dropout between them, called like the lessons' model:
    ``model(**batch).loss``."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden),
                                          torch.nn.ReLU(), torch.nn.Dropout(DROPOUT),
                                          torch.nn.Linear(hidden, hidden),
                                          torch.nn.ReLU(), torch.nn.Dropout(DROPOUT),
                                          torch.nn.Linear(hidden, CLASSES))

    def forward(self, inputs, labels):
        logits = self.layers(inputs)  # (batch, CLASSES)
        return SimpleNamespace(
            loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits
        )


def make_examples(count):
    """``count`` labelled examples, the same on every process (the prepared data loader
    shares them out)."""
    generator = torch.Generator().manual_seed(0)
    inputs = INPUT_SCALE * torch.randn(count, FEATURES, generator=generator)
    labels = (inputs[:, 0] + inputs[:, 1] > 0).long()
    return [{"inputs": x, "labels": y} for x, y in zip(inputs, labels)]


# --- the intended loops (what the checks compare with)
# -----------------------------------------

def lesson_loop(local_sgd_steps):
    """Lesson 3's loop, cut to its core: local_sgd.step() after every micro-batch's
    zero_grad."""
    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(accelerator=accelerator, model=model,
                      local_sgd_steps=local_sgd_steps, enabled=True) as local_sgd:
            for batch in dataloader:
                with accelerator.accumulate(model):
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    local_sgd.step()
    return loop


def ddp_loop(accelerator, model, optimizer, dataloader):
    """The same loop without Local SGD: DDP all-reduces the gradients of every optimizer
    step."""
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()


def local_sgd_loop_with(average_parameters, local_sgd_steps):
    """Local SGD written out, with ``average_parameters`` as its averaging.

    As Accelerate's LocalSGD does it (accelerate/local_sgd.py), less its barrier: DDP's
    gradient all-reduce off for the whole loop (``model.no_sync()``), an averaging every
    ``local_sgd_steps`` micro-batches, and one more at the end. An averaging that leaves
    the parameters in another dtype, shape or device stops the run
    (``ParametersChanged``): the next forward pass would fail.
    """
    def loop(accelerator, model, optimizer, dataloader):
        def average():
            before = parameter_kinds(model)
            average_parameters(accelerator, model)
            changed = [(was, now) for was, now in zip(before, parameter_kinds(model))
                       if was != now]
            if changed or len(before) != len(parameter_kinds(model)):
                was, now = (changed[0] if changed
                            else (f"{len(before)} tensors", "another number"))
                raise ParametersChanged(f"your averaging left a parameter as {now}, "
                                        f"where it was {was}")

        with model.no_sync():
            for number, batch in enumerate(dataloader, 1):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                optimizer.zero_grad()
                if number % local_sgd_steps == 0:
                    average()
            average()
    return loop


class ParametersChanged(Exception):
    """An averaging changed the parameters' dtype, shape or device (every process raises
    it at the same point)."""


def parameter_kinds(model):
    """Each parameter's dtype, shape and device, as text."""
    return [f"{p.dtype} {tuple(p.shape)} {p.device.type}" for p in model.parameters()]


# --- measuring, in each worker process
# ---------------------------------------------------------

def flat_gradients(model):
    """Every parameter's gradient in one 1-D tensor (zeros where a parameter has none);
    None if none has one."""
    parameters = list(model.parameters())
    if all(p.grad is None for p in parameters):
        return None
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
         for p in parameters]
    )


class TracedBatches:
    """The prepared data loader, as the learner's loop sees it, noting where each
    all-reduce happens.

    Each logged collective is labelled ``[micro-batch, optimizer steps done]``:
    micro-batch 0 is before the loop draws its first batch, ``len + 1`` after it drew
    its last. After each optimizer step (seen when the next batch is drawn, or the
    batches run out) it records whether the workers' weights are identical. Before each
    optimizer step it records what the step applies (``at_steps``): the gradients,
    whether every module was in training mode, whether the gradients changed since the
    last ``accelerator.backward`` returned (clipping changes them), and whether they
    were cleared between two backward passes of the step (zero_grad before backward,
    under accumulation). ``close()`` gives the accelerator its own ``backward`` back.
    """

    def __init__(self, accelerator, model, optimizer, dataloader, counter):
        self.accelerator, self.model, self.dataloader, self.counter = (accelerator,
                                                                       model,
                                                                       dataloader,
                                                                       counter)
        self.micro_batch, self.steps_done, self.checked_steps = 0, 0, 0
        self.steps_at_draw = []  # optimizer steps done when each micro-batch was drawn
        # optimizer step -> the workers' weights identical after it
        self.identical_after = {}
        # one dict per optimizer step, recorded just before it is taken
        self.at_steps = []
        # the gradients when accelerator.backward last returned, in this step
        self.after_backward = None
        # the gradients were cleared between two backward passes of this step
        self.cleared = False
        # inside Accelerate's wrapper: only the steps really taken
        inner = optimizer.optimizer
        inner.register_step_pre_hook(self._stepping)
        inner.register_step_post_hook(self._stepped)
        self.backward = accelerator.backward
        # an attribute of this Accelerator only, until close()
        accelerator.backward = self._recorded_backward
        self._label()

    def _recorded_backward(self, *args, **kwargs):
        # a backward of this step already ran: its gradients must still be there
        if self.after_backward is not None:
            gradients = flat_gradients(self.model)
            self.cleared = self.cleared or gradients is None or not gradients.any()
        result = self.backward(*args, **kwargs)
        self.after_backward = flat_gradients(self.model)
        return result

    def close(self):
        del self.accelerator.backward

    def _label(self):
        self.counter.step = [self.micro_batch, self.steps_done]

    def _stepping(self, *args):
        gradients = flat_gradients(self.model)
        seen = self.after_backward
        self.at_steps.append({
            "gradients": None if gradients is None else gradients.cpu().tolist(),
            "training": all(module.training for module in self.model.modules()),
            "changed_since_backward": (None if gradients is None or seen is None
                                       else not torch.equal(gradients, seen)),
            "norm_after_backward": None if seen is None else seen.norm().item(),
            "cleared_during_accumulation": self.cleared})
        self.after_backward, self.cleared = None, False

    def _stepped(self, *args):
        self.steps_done += 1
        self._label()

    def _check_weights(self):
        if self.steps_done > self.checked_steps:
            self.checked_steps = self.steps_done
            self.identical_after[self.steps_done] = (
                weight_gap(self.accelerator, self.model, self.counter) == 0.0
            )

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
    """Route DDP's gradient all-reduce through PyTorch's default hook, and mark its
    events as gradients."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        logged = len(counter.events)
        future = allreduce_hook(None, bucket)
        for event in counter.events[logged:]:
            event["kind"] = "gradients"
        return future

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(state=None, hook=hook)


def prepared_run(
    accelerator, micro_batches, gradient_accumulation_steps, hidden=HIDDEN
):
    """A fresh model, optimizer and data loader of ``micro_batches`` micro-batches per
    process, prepared."""
    accelerator.gradient_accumulation_steps = gradient_accumulation_steps
    # Accelerate's count of micro-batches towards the next optimizer step
    accelerator.step = 0
    # in the worker process: the notebook's generators are not touched
    torch.manual_seed(0)
    model = SmallClassifier(hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    examples = make_examples(
        micro_batches * MICRO_BATCH_SIZE * accelerator.num_processes
    )
    dataloader = torch.utils.data.DataLoader(examples, batch_size=MICRO_BATCH_SIZE)
    return accelerator.prepare(model, optimizer, dataloader)


def parameter_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def measure_run(
    accelerator, loop, micro_batches, gradient_accumulation_steps=1, hidden=HIDDEN
):
    """Run ``loop(accelerator, model, optimizer, dataloader)`` once; what this process
    communicated.

    A run that an averaging stopped (``ParametersChanged``) returns only ``{"stopped":
    why}``.
    """
    from helpers.models import flat_parameters

    model, optimizer, dataloader = prepared_run(
        accelerator, micro_batches, gradient_accumulation_steps, hidden
    )
    counter = CollectiveCounter()
    count_gradients(model, counter)
    batches = TracedBatches(accelerator, model, optimizer, dataloader, counter)
    try:
        with counter:
            loop(accelerator, model, optimizer, batches)
    except ParametersChanged as change:
        return {"stopped": str(change)}
    finally:
        batches.close()
    final_gap = weight_gap(accelerator, model, counter)
    return {
        "micro_batches": micro_batches,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "parameter_bytes": parameter_bytes(model),
        "parameter_tensors": len(list(model.parameters())),
        "optimizer_steps": batches.steps_done,
        "steps_at_draw": batches.steps_at_draw + [batches.steps_done],
        "events": [
            {"where": event["step"], "collective": event["collective"],
             "bytes": event["bytes"], "kind": event.get("kind", "parameters")}
            for event in counter.events
        ],
        "identical_after": sorted(batches.identical_after.items()),
        "identical_at_end": final_gap == 0.0,
        "at_steps": batches.at_steps,
        "final_parameters": flat_parameters(model).cpu().tolist(),
    }


def probe_averaging(accelerator, average_parameters):
    """Give each process its own parameters, call ``average_parameters`` once; what it
    did to them.

    ``off`` says how far the parameters ended from each thing a near miss leaves in them
    (0 where they hold it): the mean over the processes, their sum, the process's own,
    the sum over 2, and the mean divided once more by the number of processes.
    ``tensors`` gives each parameter tensor's name and what it holds ("mean", "own" or
    "other").
    """
    from helpers.models import flat_parameters

    model, _, _ = prepared_run(accelerator, 1, 1)
    processes = accelerator.num_processes
    own = {rank: torch.randn(sum(p.numel() for p in model.parameters()),
                             generator=torch.Generator().manual_seed(1000 + rank))
           for rank in range(processes)}
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(
            own[accelerator.process_index].to(accelerator.device), model.parameters()
        )
    names = [name.removeprefix("module.") for name, _ in model.named_parameters()]
    sizes = [p.numel() for p in model.parameters()]
    dtypes_before, bytes_before = ([str(p.dtype) for p in model.parameters()],
                                   parameter_bytes(model))
    counter = CollectiveCounter()
    with counter:
        average_parameters(accelerator, model)
    dtypes_after = [str(p.dtype) for p in model.parameters()]
    # judge_probe says so; values cannot be compared
    if [p.numel() for p in model.parameters()] != sizes:
        return {"processes": processes, "sizes_before": sizes,
                "sizes_after": [p.numel() for p in model.parameters()]}
    after = flat_parameters(model).cpu().double()
    mine = own[accelerator.process_index].double()
    total = sum(own.values()).double()
    mean = total / processes
    tolerance = PROBE_TOLERANCE * total.abs().max().item()

    def off(target):
        return (after - target).abs().max().item()

    def holds(part, target):
        return (part - target).abs().max().item() <= tolerance

    tensors = []
    for name, part, part_mean, part_own in zip(
        names, after.split(sizes), mean.split(sizes), mine.split(sizes)
    ):
        tensors.append(
            [name, "mean" if holds(part, part_mean) else "own" if holds(part, part_own)
             else "other"]
        )
    return {
        "processes": processes,
        "tolerance": tolerance,
        "off": {"mean": off(mean), "sum": off(total), "own": off(mine),
                "sum over 2": off(total / 2),
                "mean over processes": off(mean / processes)},
        "relative_off_mean": off(mean) / mean.abs().max().item(),
        "tensors": tensors,
        "dtypes_before": dtypes_before,
        "dtypes_after": dtypes_after,
        "collectives": [
            [event["collective"], event["bytes"]] for event in counter.events
        ],
        "parameter_bytes": bytes_before,
        "parameter_tensors": len(sizes),
    }


def practice_worker(accelerator, runs, averagings=()):
    """What every process runs: each probe of ``averagings``, then each of ``runs``.

    A run is ``(loop, micro_batches, gradient_accumulation_steps[, hidden])``.

    The probes come first: one that changes the parameters' dtype is reported as that,
    not as the error a forward pass would raise later.
    """
    probes = [probe_averaging(accelerator, average) for average in averagings]
    return {"runs": [measure_run(accelerator, *run) for run in runs], "probes": probes}


def import_what_workers_import():
    """Import here, once, the modules every worker would otherwise import after the fork
    (seconds each).

    ``preload=False`` spares the workers DistilBERT's code, but each one still imports
    torch._dynamo when it builds its first optimizer (Optimizer.__init__ calls
    add_param_group, which ``torch._disable_dynamo`` wraps: it imports torch._dynamo on
    its first call), and datasets when Accelerate prepares a data loader
    (accelerate/data_loader.py, prepare_data_loader). Forked processes share what this
    one has imported.
    """
    import torch._dynamo  # noqa: F401
    from accelerate.utils import is_datasets_available
    if is_datasets_available():
        import datasets  # noqa: F401


def launch(runs, averagings=(), num_processes=2):
    """Measure ``runs`` (and probe each function of ``averagings``) on ``num_processes``
    processes; process 0's."""
    import_what_workers_import()
    # the launcher's "Launching training on 2 CPUs."
    with contextlib.redirect_stdout(io.StringIO()):
        return run_in_processes(
            practice_worker,
            (list(runs), list(averagings)),
            num_processes=num_processes,
            timeout_s=LAUNCH_TIMEOUT_S,
            # the stand-in model needs neither DistilBERT nor the
            # data
            preload=False,
        )


def launch_learners(runs, how_called, averagings=(), num_processes=2):
    """``launch``, with a worker's failure or a hang turned into one sentence that says
    what to look at.

    ``how_called`` says how each worker called the learner's function, e.g.
    ``average_parameters(accelerator, model)``.
    """
    name = how_called.split("(")[0]
    try:
        return launch(runs, averagings, num_processes)
    except WorkerFailedError as error:
        last_line = error.worker_traceback.strip().splitlines()[-1]
        raise Wrong(f"{name} failed in a worker process with {last_line}. Hint: "
                    f"{failure_hint(last_line, how_called)}") from None
    except WorkerTimeoutError:
        raise Wrong(f"{name} had not finished after {LAUNCH_TIMEOUT_S} s, so the "
                    "check stopped it. Hint: every "
                    "process must issue the same collectives in the same order; a "
                    "step that only one "
                    "process takes (under `if accelerator.is_main_process:`) leaves "
                    "the others waiting.") from None


def failure_hint(last_line, how_called):
    if "'local_sgd'" in last_line:
        return ("local_sgd is the name that `with LocalSGD(...) as local_sgd:` gives; "
                "keep that line.")
    if "LocalSGD" in last_line:
        return "import it first: from accelerate.local_sgd import LocalSGD."
    # stopped because another process failed
    if "SignalException" in last_line or "got signal" in last_line:
        return ("another worker process failed in a collective (it waited too long, "
                "or lost its peer), and the "
                "others were stopped: every process must call the same collectives, "
                "in the same order (no "
                "`if accelerator.is_main_process:` around them).")
    if "timeout" in last_line.lower() or "timed out" in last_line.lower():
        return ("one process waited for a collective that another never issued: every "
                "process must call "
                "the same collectives, in the same order (no `if "
                "accelerator.is_main_process:` around them).")
    return f"each worker process called {how_called}; that error came from it."


# --- reading a run: where each all-reduce happened
# -------------------------------------------

def communication_table(run):
    """What a run all-reduced, by place: before the loop, at each optimizer step, after
    the loop.

    Each step's row: ``gradients`` (DDP's bytes for that step), ``before`` (parameters
    averaged in the micro-batch that takes the step, before it is taken), ``after``
    (averaged after the step, before the next micro-batch; row 0: before the first
    step), ``calls`` (parameter all-reduces), and ``identical`` (the workers' weights
    identical after the step and its averaging).
    """
    end = run["micro_batches"] + 1
    # optimizer steps done after micro-batch 1, 2, ...
    steps_after = run["steps_at_draw"][1:]
    rows = {}

    def row(step):
        return rows.setdefault(
            step,
            {"step": step, "gradients": 0, "before": 0, "after": 0, "calls": 0,
             "identical": None},
        )

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
            table[BEFORE_THE_LOOP if micro_batch == 0 else AFTER_THE_LOOP] += event[
                "bytes"
            ]
        else:
            # this micro-batch has yet to take its step
            step_to_come = steps_after[micro_batch - 1] > steps_done
            averaged = row(steps_done + 1) if step_to_come else row(steps_done)
            averaged["before" if step_to_come else "after"] += event["bytes"]
            averaged["calls"] += 1
    for step, identical in run["identical_after"]:
        row(step)["identical"] = identical
    table["steps"] = [rows[step] for step in sorted(rows)]
    return table


def averaged_after(table):
    """The optimizer steps after which the parameters were averaged (correctly: after
    the step)."""
    return [row["step"] for row in table["steps"] if row["after"]]


def averaged_before(table):
    return [row["step"] for row in table["steps"] if row["before"]]


def gradient_steps(table):
    return [row["step"] for row in table["steps"] if row["gradients"]]


def total_bytes(run):
    return sum(
        event["bytes"] for event in run["events"] if event["collective"] == "all_reduce"
    )


def steps_text(steps):
    if not steps:
        return "none"
    return (", ".join(str(s) for s in steps[:-1]) + (" and " if len(steps) > 1 else "")
            + str(steps[-1]))


def largest_weight_difference(run, reference):
    """Largest difference between two runs' final weights (process 0's)."""
    return max(abs(a - b)
               for a, b in zip(run["final_parameters"], reference["final_parameters"]))


def table_rows(run):
    """The rows ``show_communication`` prints: place, gradients, parameters averaged,
    weights after."""
    table = communication_table(run)

    def amount(bytes_, note=""):
        return f"{bytes_:,} B{note}" if bytes_ else "-"

    def weights(identical):
        return {True: "identical", False: "different", None: ""}[identical]

    rows = [(BEFORE_THE_LOOP, "-", amount(table[BEFORE_THE_LOOP]), "")]
    for row in table["steps"]:
        averaged = (
            ", ".join(
                text
                for text in (
                    amount(row["before"], " before the step") if row["before"] else "",
                    amount(row["after"]) if row["after"] else "",
                )
                if text
            )
            or "-"
        )
        place = f"optimizer step {row['step']}" if row["step"] else "before step 1"
        rows.append(
            (place, amount(row["gradients"]), averaged, weights(row["identical"]))
        )
    rows.append(
        (AFTER_THE_LOOP, "-", amount(table[AFTER_THE_LOOP]),
         weights(run["identical_at_end"]))
    )
    return rows


def show_communication(train_loop):
    """Run ``train_loop`` as exercise 3.3's check does, and print what it all-reduced,
    step by step."""
    require_callable(train_loop, "train_loop")
    run, ddp = launch([(train_loop, FIX_MICRO_BATCHES, FIX_ACCUMULATION),
                       (ddp_loop, FIX_MICRO_BATCHES, FIX_ACCUMULATION)])["runs"]
    print(f"{train_loop.__name__} on 2 processes: {FIX_MICRO_BATCHES} "
          "micro-batches, accumulation "
          f"{FIX_ACCUMULATION}, {run['optimizer_steps']} optimizer steps; what each "
          "process all-reduced:")
    line = "{:>16} | {:>15} | {:>27} | {}"
    print(line.format("", "gradients (DDP)", "parameters averaged", "weights after"))
    for row in table_rows(run):
        print(line.format(*row).rstrip(" |"))
    print(f"total: {total_bytes(run):,} bytes; plain DDP, measured in the same "
          f"launch: {total_bytes(ddp):,} bytes.")


# --- the checks
# ----------------------------------------------------------------------------------

@functools.cache
def intended_measurements():
    """The intended loops for exercises 3.1 and 3.2, measured once per kernel (one
    launch).

    Returns ``{("local sgd", steps, 1, k, hidden): run, ("ddp", micro_batches, a, None,
    hidden): run, ...}``.
    """
    cases = [
        ("local sgd", steps, 1, k, hidden) for steps, k, hidden in PREDICTION_CASES
    ]
    for micro_batches, accumulation, k, hidden in ACCUMULATION_CASES:
        cases += [("ddp", micro_batches, accumulation, None, hidden),
                  ("local sgd", micro_batches, accumulation, k, hidden)]
    runs = [
        (lesson_loop(k) if kind == "local sgd" else ddp_loop, micro_batches,
         accumulation, hidden)
        for kind, micro_batches, accumulation, k, hidden in cases
    ]
    return dict(zip(cases, launch(runs)["runs"]))


def named_parameter_bytes(measured):
    """The bytes of the classifier that the practice notebook names (the other one it
    does not)."""
    return next(
        run["parameter_bytes"] for case, run in measured.items() if case[-1] == HIDDEN
    )


def shown(answer):
    """An answer as a verdict shows it: a number with thousands separators, anything
    else as Python writes it."""
    if not is_number(answer):
        return repr(answer)
    # int() and float() also take Fractions and numpy's numbers, whose formats may not
    # accept ","
    try:
        return f"{int(answer):,}" if answer == int(answer) else f"{float(answer):,}"
    except (ValueError, OverflowError):  # nan, inf
        return repr(answer)


def number_hint(answer):
    """What to return instead of ``answer``, which is not a number."""
    if answer is None:
        return "it returned None: did you forget `return`?"
    if isinstance(answer, bool):
        return "return a number of bytes, not True or False."
    if isinstance(answer, str):
        return "return the number itself, not text (no quotes, no str())."
    # a tensor, a numpy array
    if isinstance(answer, torch.Tensor) or hasattr(answer, "item"):
        return ("return a Python number: .item() turns a one-element tensor or "
                "array into one.")
    return f"return a number (an int), not a {type(answer).__name__}."


LOOKUP_HINTS = [("KeyError", "the check also tries cases that no text lists: compute "
                             "the bytes from the "
                             "arguments.")]


def prediction_mistakes(named_bytes):
    """(what a learner may have computed, for (steps, k, parameter_bytes); the hint),
    most telling first."""
    return [
        (lambda s, k, p: s // k * p, "you count the averagings every k steps; leaving "
                                     "the `with LocalSGD(...)` "
                                     "block averages once more."),
        (lambda s, k, p: -(-s // k) * p, "rounding steps / k up is not it: one "
                                         "averaging after every k-th step "
                                         "(//), plus one as the block ends."),
        (lambda s, k, p: s * p, "that is DDP, which all-reduces every step; Local SGD "
                                "averages every k steps."),
        (lambda s, k, p: (s / k + 1) * p, "the averagings are a whole number: one "
                                          "every k full steps (use //), plus "
                                          "one as the block ends."),
        (lambda s, k, p: s // k + 1, "that is the number of averagings; each one "
                                     "sends all the parameters: "
                                     "parameter_bytes."),
        (lambda s, k, p: 2 * (s // k + 1) * p, "a ring all-reduce over N processes "
                                               "sends 2(N-1)/N times its "
                                               "payload from each: for N = 2, the "
                                               "payload itself."),
        (lambda s, k, p: (s // k + 1) * named_bytes,
         "each averaging sends parameter_bytes, and the check also tries a model of "
         "another size: use the "
         f"argument, not the {named_bytes:,} bytes of the classifier the "
         "notebook names."),
    ]


# for (micro_batches, gradient_accumulation_steps, k, parameter_bytes)
def ddp_mistakes(named_bytes):
    return [
        (lambda m, a, k, p: m * p, "under accelerator.accumulate, DDP all-reduces the "
                                   "gradients only in the "
                                   "backward of the micro-batch that completes an "
                                   "optimizer step."),
        (lambda m, a, k, p: m // a * named_bytes,
         "the check also tries a model of another size: use parameter_bytes, not "
         f"{named_bytes:,}."),
    ]


def local_sgd_mistakes(named_bytes):
    return [
        (lambda m, a, k, p: (m // a // k + 1) * p, "local_sgd_steps counts calls of "
                                                   "local_sgd.step(), and the "
                                                   "slide's loop calls it once per "
                                                   "micro-batch, not once per "
                                                   "optimizer step."),
        (lambda m, a, k, p: (m // k + 1 + m // a) * p, "inside the `with LocalSGD` "
                                                       "block DDP does not all-reduce "
                                                       "the gradients at all, not "
                                                       "even in the micro-batch that "
                                                       "completes a step: entering "
                                                       "the block switched that off "
                                                       "(model.no_sync())."),
        (lambda m, a, k, p: m // k * p, "leaving the `with LocalSGD(...)` block "
                                        "averages once more."),
        (lambda m, a, k, p: (-(-m // k) + 1) * p, "rounding micro_batches / k up is "
                                                  "not it: one averaging after "
                                                  "every k-th call of "
                                                  "local_sgd.step() (//), plus "
                                                  "one as the block "
                                                  "ends."),
        (lambda m, a, k, p: (m / k + 1) * p, "the averagings are a whole number: one "
                                             "every k full calls of "
                                             "local_sgd.step() (use //), plus one as "
                                             "the block ends."),
        (lambda m, a, k, p: (m // k + 1) * named_bytes,
         "the check also tries a model of another size: use parameter_bytes, not "
         f"{named_bytes:,}."),
    ]


def is_number(answer):
    # numpy's numbers too
    return isinstance(answer, numbers.Real) and not isinstance(answer, bool)


def same_number(answer, truth):
    return is_number(answer) and answer == truth


def diagnose(answers, mistakes, default):
    """The hint of the first mistake that explains every answer (``{args: answer}``),
    else ``default``."""
    for mistake, hint in mistakes:
        if all(same_number(answer, mistake(*args)) for args, answer in answers.items()):
            return hint
    return default


def case_text(steps_or_micro_batches, k, p, named_bytes, unit="steps"):
    size = "" if p == named_bytes else (f", on the wider classifier ({p:,} "
                                        "bytes of parameters)")
    return f"{steps_or_micro_batches} {unit}, k={k}{size}"


@checker("3.1")
def check_predicted_bytes(predicted_bytes):
    """``predicted_bytes(steps, local_sgd_steps, parameter_bytes)``, checked against
    lesson 3's loop, measured."""
    require_callable(predicted_bytes, "predicted_bytes")
    measured = intended_measurements()
    named_bytes = named_parameter_bytes(measured)
    answers, truths = {}, {}
    for steps, k, hidden in PREDICTION_CASES:
        run = measured[("local sgd", steps, 1, k, hidden)]
        p = run["parameter_bytes"]
        answers[(steps, k, p)] = call_learner(
            predicted_bytes, steps, k, p, name="predicted_bytes", hints=LOOKUP_HINTS
        )
        truths[(steps, k, p)] = total_bytes(run)
    for (steps, k, _), answer in answers.items():
        if not is_number(answer):
            raise Wrong("predicted_bytes should return a number of bytes, but for "
                        f"{steps} steps with "
                        f"local_sgd_steps={k} it returned {shown(answer)}. Hint: "
                        f"{number_hint(answer)}")
    for (steps, k, p), answer in answers.items():
        truth = truths[(steps, k, p)]
        if same_number(answer, truth):
            continue
        hint = diagnose(answers, prediction_mistakes(named_bytes),
                        "how many times are the parameters averaged, and how many "
                        "bytes is each averaging?")
        raise Wrong(f"for {steps} steps with local_sgd_steps={k} and {p:,} bytes of "
                    "parameters, you predicted "
                    f"{shown(answer)} bytes; measured on 2 processes, lesson 3's loop "
                    f"all-reduced {truth:,}. "
                    f"Hint: {hint}")
    cases = "; ".join(f"{case_text(steps, k, p, named_bytes)}: {truth:,}"
                      for (steps, k, p), truth in truths.items())
    return ("your predictions match the bytes lesson 3's loop all-reduced on 2 "
            f"processes ({cases}): one "
            "averaging after every k-th step and one more as the block ends, each of "
            "all the parameters.")


@checker("3.2")
def check_predicted_bytes_with_accumulation(predicted_bytes_with_accumulation):
    """``(ddp_bytes, local_sgd_bytes)``, given ``(micro_batches,
    gradient_accumulation_steps, k, parameter_bytes)``."""
    name = "predicted_bytes_with_accumulation"
    require_callable(predicted_bytes_with_accumulation, name)
    measured = intended_measurements()
    named_bytes = named_parameter_bytes(measured)
    answers, truths = {}, {}
    for m, a, k, hidden in ACCUMULATION_CASES:
        ddp, local = (measured[("ddp", m, a, None, hidden)],
                      measured[("local sgd", m, a, k, hidden)])
        p = ddp["parameter_bytes"]
        answer = call_learner(
            predicted_bytes_with_accumulation, m, a, k, p, name=name, hints=LOOKUP_HINTS
        )
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2
                and all(is_number(number) for number in answer)):
            if isinstance(answer, (tuple, list)) and len(answer) == 2:
                hint = number_hint(
                    next(number for number in answer if not is_number(number))
                )
            else:
                hint = ("return the pair as a tuple of two numbers: return ddp_bytes, "
                        "local_sgd_bytes.")
            raise Wrong(f"{name} should return two numbers, (DDP's bytes, Local SGD's "
                        "bytes), but it returned "
                        f"{answer!r}. Hint: {hint}")
        answers[(m, a, k, p)], truths[(m, a, k, p)] = (
            tuple(answer),
            (total_bytes(ddp), total_bytes(local)),
        )
    for (m, a, k, p), (ddp_answer, local_answer) in answers.items():
        ddp, local = truths[(m, a, k, p)]
        if same_number(ddp_answer, ddp) and same_number(local_answer, local):
            continue
        if all(answer == truth[::-1]
               for answer, truth in zip(answers.values(), truths.values())):
            hint = "you swapped them: return (DDP's bytes, Local SGD's bytes)."
        elif not same_number(ddp_answer, ddp):
            hint = diagnose({args: answer[0] for args, answer in answers.items()},
                            ddp_mistakes(named_bytes),
                            "DDP all-reduces the gradients once per optimizer step: "
                            "how many optimizer steps " "are there?")
        else:
            hint = diagnose({args: answer[1] for args, answer in answers.items()},
                            local_sgd_mistakes(named_bytes),
                            "count the calls of local_sgd.step(): one averaging every "
                            "k of them, one as the " "block ends.")
        raise Wrong(f"for {m} micro-batches with gradient_accumulation_steps={a}, "
                    f"local_sgd_steps={k} and {p:,} bytes "
                    f"of parameters, you predicted DDP {shown(ddp_answer)} and Local "
                    f"SGD {shown(local_answer)} bytes; "
                    f"measured on 2 processes: DDP {ddp:,} and Local SGD "
                    f"{local:,}. Hint: {hint}")
    (m, a, k, p), (ddp, local) = next(
        (case, truth) for case, truth in truths.items() if case[2] < case[1]
    )
    return (f"your predictions match the measurement on 2 processes, in {len(truths)} "
            f"cases. With {m} micro-batches, "
            f"accumulation {a} and local_sgd_steps={k}, Local SGD sent {local:,} "
            f"bytes and DDP {ddp:,}: k counts "
            "micro-batches, so a k below the accumulation averages more often than "
            "DDP all-reduces.")


def intended_fix():
    """The loop of exercise 3.3 as it should be: lesson 3's loop, averaging every 8
    micro-batches."""
    return lesson_loop(FIX_LOCAL_SGD_STEPS)


def averaging_places(table):
    """Where a run averaged the parameters during the loop, in words."""
    steps = averaged_after(table)
    later = [step for step in steps if step]
    # row 0: a micro-batch that took no step
    places = ["before the first optimizer step"] if 0 in steps else []
    if later:
        places.append(f"after optimizer step{'s' if len(later) > 1 else ''} "
                      f"{steps_text(later)}")
    return " and ".join(places) or "at no optimizer step"


def averagings(run, table):
    """How many times a run averaged the parameters, in all."""
    averaged = (table[BEFORE_THE_LOOP] + table[AFTER_THE_LOOP]
                + sum(row["before"] + row["after"] for row in table["steps"]))
    return averaged // run["parameter_bytes"]


def judge_gradients(run, reference):
    """Compare the gradients each optimizer step applied with the intended loop's; Wrong
    at the first that differs."""
    accumulation = run["gradient_accumulation_steps"]
    for step, (mine, intended) in enumerate(
        zip(run["at_steps"], reference["at_steps"]), 1
    ):
        if mine["gradients"] is None:
            raise Wrong(f"when optimizer step {step} was taken, the parameters had no "
                        "gradients, so it changed "
                        "nothing. Hint: zero_grad clears them: call it after "
                        "optimizer.step(), as the loop you were "
                        "given does.")
        gradients = torch.tensor(mine["gradients"], dtype=torch.float64)
        target = torch.tensor(intended["gradients"], dtype=torch.float64)
        largest = target.abs().max().item()
        difference = (gradients - target).abs().max().item()
        if difference <= GRADIENT_TOLERANCE * largest:
            continue
        where = f"at optimizer step {step}"
        if not mine["training"] and intended["training"]:
            raise Wrong(f"{where} the model was in evaluation mode, so its dropout "
                        "was off and the gradients were "
                        "not the fixed loop's. Hint: keep model.train() and add no "
                        "model.eval(): move lines, change "
                        "nothing else.")
        if mine["cleared_during_accumulation"]:
            raise Wrong(f"{where} the gradients were cleared between the "
                        "micro-batches that step accumulates, so it "
                        "applied only the last micro-batch's. Hint: call zero_grad "
                        "after optimizer.step(), as the "
                        "loop you were given does.")
        if mine["changed_since_backward"]:
            raise Wrong(f"between accelerator.backward and optimizer step {step} your "
                        "loop changed the gradients "
                        f"(their norm went from {mine['norm_after_backward']:.3g} to "
                        f"{gradients.norm().item():.3g}), "
                        "as clipping does. Hint: add no clipping: move the misplaced "
                        "lines, change nothing else.")
        scale = (gradients @ target / (target @ target)).item()
        if (
            gradients - scale * target
        ).abs().max().item() <= GRADIENT_TOLERANCE * largest * max(1.0, abs(scale)):
            if mine["norm_after_backward"] is None and math.isclose(
                scale, accumulation, rel_tol=1e-4
            ):
                hint = ("call accelerator.backward(outputs.loss), as given: it "
                        "divides the loss by "
                        f"gradient_accumulation_steps ({accumulation}); "
                        "loss.backward() does not.")
            elif math.isclose(scale, 1 / accumulation, rel_tol=1e-4):
                hint = ("accelerator.backward already divides the loss by "
                        "gradient_accumulation_steps "
                        f"({accumulation}), so dividing it yourself does it twice: "
                        "pass outputs.loss as it is.")
            else:
                hint = ("pass outputs.loss to accelerator.backward as it is (it "
                        "divides the loss by "
                        "gradient_accumulation_steps itself): scaling the loss scales "
                        "every gradient.")
            raise Wrong(f"{where} your loop's gradients were {scale:.3g} times the "
                        "fixed loop's. AdamW's steps hardly "
                        f"depend on that scale, but the gradients do. Hint: {hint}")
        raise Wrong(f"{where} your loop's gradients differ from the fixed loop's (by "
                    f"up to {difference:.1e}; their "
                    f"largest entry is {largest:.1e}). Hint: each optimizer step "
                    "applies the gradients of its "
                    f"{accumulation} micro-batches: one forward pass and one "
                    "accelerator.backward(outputs.loss) per "
                    "micro-batch, zero_grad after optimizer.step(). Move lines, "
                    "change nothing else.")


def judge_fixed_loop(run, reference):
    """Compare the learner's run of exercise 3.3 with the intended loop's, measured in
    the same launch."""
    table, intended = communication_table(run), communication_table(reference)
    if run["optimizer_steps"] != reference["optimizer_steps"]:
        raise Wrong(f"your loop took {run['optimizer_steps']} optimizer steps in "
                    f"{FIX_MICRO_BATCHES} micro-batches "
                    f"instead of {reference['optimizer_steps']}. Hint: keep backward, "
                    "optimizer.step() and "
                    "zero_grad inside `with accelerator.accumulate(model):`, once "
                    "per micro-batch.")
    gradients = gradient_steps(table)
    averaged_anywhere = (
        table[BEFORE_THE_LOOP]
        or table[AFTER_THE_LOOP]
        or any(row["before"] or row["after"] for row in table["steps"])
    )
    if gradients and not averaged_anywhere:
        raise Wrong("DDP all-reduced the gradients at optimizer steps "
                    f"{steps_text(gradients)} and the parameters "
                    "were never averaged: Local SGD did nothing. Hint: keep "
                    "enabled=True and the LocalSGD block "
                    "of the loop you were given; move lines, change nothing else.")
    if gradients or table[BEFORE_THE_LOOP]:
        what = []
        if gradients:
            what.append("DDP all-reduced the gradients at optimizer steps "
                        f"{steps_text(gradients)}")
        if table[BEFORE_THE_LOOP]:
            what.append("the parameters were averaged before the first batch")
        raise Wrong(f"{' and '.join(what)}. Hint: the loop runs outside the `with "
                    "LocalSGD(...)` block: entering the "
                    "block switches DDP's gradient all-reduce off and leaving it "
                    "averages the parameters, so "
                    "the for loop must be indented inside it.")
    before = averaged_before(table)
    if before:
        steps = (f"step {before[0]} was" if len(before) == 1
                 else f"steps {steps_text(before)} were")
        raise Wrong(f"the parameters were averaged before optimizer {steps} taken, so "
                    "each worker then applied its "
                    "own step and the weights differed right after the averaging. "
                    "Hint: call local_sgd.step() "
                    "after optimizer.step() (the lesson calls it after zero_grad).")
    if (averaged_after(table) != averaged_after(intended)
        or table[AFTER_THE_LOOP] != intended[AFTER_THE_LOOP]):
        end = "and once after the loop" if table[AFTER_THE_LOOP] else ("and not after "
                                                                       "the loop")
        count = averagings(run, table)
        if count >= FIX_MICRO_BATCHES and not table[AFTER_THE_LOOP]:
            hint = ("a `with LocalSGD(...)` block averages as it ends, so a block per "
                    "micro-batch averages after "
                    "every one: enter it once, around the for loop.")
        else:
            hint = ("move lines, change nothing else: keep local_sgd_steps=8 and one "
                    "local_sgd.step() per "
                    "micro-batch, inside the block.")
        raise Wrong(f"the parameters were averaged {averaging_places(table)} {end}, "
                    f"{count} times in all; the loop "
                    f"you were given averages {averaging_places(intended)} and once "
                    f"after the loop. Hint: {hint}")
    judge_gradients(run, reference)
    if table != intended or run["identical_at_end"] != reference["identical_at_end"]:
        differences = []
        if [row["identical"] for row in table["steps"]] != [
            row["identical"] for row in intended["steps"]
        ] or (run["identical_at_end"] != reference["identical_at_end"]):
            differences.append("the workers' weights were identical after other steps "
                               "than the fixed loop's")
        if [(row["after"], row["calls"]) for row in table["steps"]] != [
            (row["after"], row["calls"]) for row in intended["steps"]
        ]:
            differences.append("it all-reduced other bytes, or in other calls, "
                               "than the fixed loop")
        if table["other_collectives"] != intended["other_collectives"]:
            differences.append("it issued collectives other than all-reduces")
        raise Wrong("your loop applied the fixed loop's gradients and averaged "
                    "where it does, but "
                    f"{' and '.join(differences) or 'it communicated differently'}. "
                    "Hint: move lines, change "
                    "nothing else.")
    difference = largest_weight_difference(run, reference)
    if difference > WEIGHTS_TOLERANCE:
        raise Wrong("your loop communicates as intended and applies the fixed loop's "
                    "gradients, but trains "
                    "differently: its final weights differ from the fixed loop's by "
                    f"up to {difference:.1e}. Hint: "
                    "move the misplaced lines, change nothing else (one optimizer "
                    "step per accumulated gradient, "
                    "the optimizer as given).")


@checker("3.3")
def check_fixed_local_sgd_loop(fixed_train_loop):
    """``fixed_train_loop(accelerator, model, optimizer, dataloader)``: exercise 3.3's
    Local SGD loop, fixed."""
    require_callable(fixed_train_loop, "fixed_train_loop")
    runs = launch_learners([(fixed_train_loop, FIX_MICRO_BATCHES, FIX_ACCUMULATION),
                            (intended_fix(), FIX_MICRO_BATCHES, FIX_ACCUMULATION)],
                           "fixed_train_loop(accelerator, model, optimizer, "
                           "dataloader), all prepared, with "
                           f"gradient_accumulation_steps={FIX_ACCUMULATION}")["runs"]
    run, reference = runs
    judge_fixed_loop(run, reference)
    table = communication_table(run)
    return ("measured on 2 processes, your loop sent no gradients and averaged the "
            "parameters after optimizer "
            f"steps {steps_text(averaged_after(table))} and once as the block ended, "
            f"{total_bytes(run):,} bytes in "
            "all; the workers' weights were identical after every averaging, each "
            "optimizer step applied the "
            "intended loop's gradients, and its final weights match the "
            "intended loop's.")


# The name practice 3's notebooks call. Practice 2 and 3 each check a fixed loop:
# check_fixed_accumulation_loop (2.3) and check_fixed_local_sgd_loop (3.3).
check_fixed_loop = check_fixed_local_sgd_loop


def judge_probe(probe):
    """What ``average_parameters`` did to parameters that differ between the
    processes."""
    if "sizes_after" in probe:
        raise Wrong("your function left the model with parameter tensors of "
                    f"{probe['sizes_after']} elements; they "
                    f"had {probe['sizes_before']}. Hint: copy the average back into "
                    "the parameters, each in its own "
                    "place and shape: torch.nn.utils.vector_to_parameters(flat, "
                    "model.parameters()).")
    processes, off, tolerance = probe["processes"], probe["off"], probe["tolerance"]
    all_reduces = [
        n for collective, n in probe["collectives"] if collective == "all_reduce"
    ]
    others = sorted({collective for collective, _ in probe["collectives"]}
                    - {"all_reduce", "barrier"})
    changed = [(before, after)
               for before, after in zip(probe["dtypes_before"], probe["dtypes_after"])
               if before != after]
    if changed:
        (before, after), = set(changed) if len(set(changed)) == 1 else (changed[0],)
        raise Wrong(f"your function left the parameters in {after}; they were "
                    f"{before}, and the model's next "
                    "forward pass would fail. Hint: vector_to_parameters gives each "
                    "parameter the dtype of the "
                    "vector it copies from: average them in their own dtype "
                    f"({before}), or cast the result back "
                    "before copying it in.")
    if off["mean"] > tolerance:
        left_alone = [name for name, holds in probe["tensors"] if holds == "own"]
        if off["own"] <= tolerance:
            hint = ("your function left the parameters as they were. If you "
                    "all-reduce a flat copy (torch.cat "
                    "or parameters_to_vector makes a new tensor), copy the result "
                    "back into the parameters: "
                    "torch.nn.utils.vector_to_parameters(flat, model.parameters()).")
        elif off["sum"] <= tolerance:
            hint = ("the parameters hold the sum of the processes' parameters, not "
                    "their mean: divide by "
                    "accelerator.num_processes (Accelerator.reduce sums unless given "
                    "reduction=\"mean\").")
        elif processes != 2 and off["sum over 2"] <= tolerance:
            hint = ("the parameters hold the sum divided by 2, but this check runs "
                    f"{processes} processes: divide "
                    "by accelerator.num_processes, not by a number you know.")
        elif off["mean over processes"] <= tolerance:
            hint = ("the parameters hold the mean divided once more by the number of "
                    "processes: ReduceOp.AVG and "
                    "reduction=\"mean\" already divide by it; divide once.")
        elif left_alone and all(holds != "other" for _, holds in probe["tensors"]):
            hint = (f"{', '.join(left_alone)} kept "
                    f"{'its' if len(left_alone) == 1 else 'their'} own values while "
                    "the other tensors were averaged: average every parameter tensor, "
                    "weights and biases "
                    "(model.parameters() yields them all).")
        elif probe["relative_off_mean"] <= 1e-2:
            sent = sum(all_reduces)
            hint = ("the parameters are near their mean (up to "
                    f"{probe['relative_off_mean']:.0e} of its largest "
                    "value apart) but not equal to it, and you all-reduced "
                    f"{sent:,} bytes for "
                    f"{probe['parameter_bytes']:,} bytes of parameters: a "
                    "lower-precision copy (bfloat16, float16) "
                    "rounds every value. All-reduce the parameters in their own "
                    f"dtype ({probe['dtypes_before'][0]}).")
        else:
            hint = ("each parameter should end as the mean of that parameter over the "
                    "processes, in its own place.")
        raise Wrong(f"given parameters that differ between the {processes} processes, "
                    "your function did not leave "
                    f"every parameter equal to its mean over them. Hint: {hint}")
    if others:
        if all("gather" in collective for collective in others):
            hint = ("a gather receives every process's copy; one all-reduce sums them "
                    "in place, and every process "
                    "gets the sum.")
        elif "broadcast" in others:
            hint = ("after the all-reduce every process already holds the same "
                    "result: the broadcast sends the "
                    "parameters once more for nothing. One all-reduce, "
                    "and nothing else.")
        else:
            hint = ("one all-reduce of all the parameters, and nothing else (a "
                    "barrier does no harm).")
        raise Wrong("your function averaged the parameters, with "
                    f"{', '.join(others)}. Hint: {hint}")
    if len(all_reduces) != 1:
        per_tensor = len(all_reduces) == probe["parameter_tensors"]
        hint = ("that is one per parameter tensor, as LocalSGD does: put all the "
                "parameters in one flat tensor "
                "first (torch.nn.utils.parameters_to_vector)." if per_tensor
                else "flatten the parameters into one tensor and all-reduce it once.")
        raise Wrong("your function averaged the parameters correctly, with "
                    f"{len(all_reduces)} all-reduces; the "
                    f"exercise asks for one. Hint: {hint}")
    if all_reduces[0] != probe["parameter_bytes"]:
        raise Wrong(f"your all-reduce sent {all_reduces[0]:,} bytes; the parameters "
                    f"are {probe['parameter_bytes']:,} "
                    "bytes. Hint: all-reduce the parameters themselves, in their "
                    "own dtype, once.")


def judge_averaging_runs(run, reference):
    """Compare Local SGD with the learner's averaging against Accelerate's LocalSGD,
    same launch."""
    if "stopped" in run:
        raise Wrong(f"inside Local SGD, {run['stopped']}, so the run stopped there. "
                    "Hint: copy the average back "
                    "into the parameters in their own dtype and shape.")
    table, intended = communication_table(run), communication_table(reference)
    calls = {row["calls"] for row in table["steps"] if row["after"]}
    difference = largest_weight_difference(run, reference)
    if (averaged_after(table) != averaged_after(intended)
        or [r["after"] for r in table["steps"]]
        != [r["after"] for r in intended["steps"]]
        or table[AFTER_THE_LOOP] != intended[AFTER_THE_LOOP]):
        raise Wrong("inside Local SGD, your averaging did not all-reduce what "
                    "LocalSGD does where it does (all "
                    "the parameters, after every k-th step and at the end). Hint: one "
                    "all-reduce of all the "
                    "parameters, and nothing else.")
    if (not all(row["identical"] for row in table["steps"] if row["after"])
        or not run["identical_at_end"]):
        raise Wrong("inside Local SGD, the workers' weights were not identical after "
                    "your averaging. Hint: every "
                    "process must end with the same averaged values in its parameters.")
    if calls != {1}:
        raise Wrong("inside Local SGD, each averaging took "
                    f"{steps_text(sorted(calls))} all-reduces, not one. "
                    "Hint: all-reduce one flat tensor of all the parameters.")
    if difference > WEIGHTS_TOLERANCE:
        raise Wrong("inside Local SGD your averaging left other weights than "
                    f"LocalSGD's (up to {difference:.1e} "
                    "apart). Hint: every parameter must end as its own mean, "
                    "in its own place.")


@checker("3.4")
def check_average_parameters(average_parameters):
    """``average_parameters(accelerator, model)``: average the parameters over the
    processes in one all-reduce."""
    require_callable(average_parameters, "average_parameters")
    loop = local_sgd_loop_with(average_parameters, AVERAGING_LOCAL_SGD_STEPS)
    measured = launch_learners(
        [(loop, AVERAGING_MICRO_BATCHES, 1),
         (lesson_loop(AVERAGING_LOCAL_SGD_STEPS), AVERAGING_MICRO_BATCHES, 1)],
        "average_parameters(accelerator, model), with the model prepared (in DDP)",
        [average_parameters],
        num_processes=AVERAGING_PROCESSES,
    )
    (run, reference), (probe,) = measured["runs"], measured["probes"]
    judge_probe(probe)
    judge_averaging_runs(run, reference)
    intended = communication_table(reference)
    per_averaging = {row["calls"] for row in intended["steps"] if row["after"]}
    return (f"measured on {probe['processes']} processes: your function averages the "
            f"{probe['parameter_tensors']} "
            f"parameter tensors ({probe['parameter_bytes']:,} bytes) in one "
            "all-reduce, where LocalSGD issues "
            f"{steps_text(sorted(per_averaging))} and a barrier; in Local SGD with "
            f"k={AVERAGING_LOCAL_SGD_STEPS} it "
            "sends the same bytes and ends with LocalSGD's weights, to within a "
            "hundredth of the learning rate.")
