"""Checks for notebooks/practice/03_local_sgd_practice.ipynb (lesson 03), on the
practice core (core.py).

Every answer runs for real, on processes started as in lesson 3 (2; 3 in exercise 3.4,
where dividing by 2 would pass on 2). Each logs its collectives with the optimizer step
they belong to (``CollectiveCounter``, ``helpers.local_sgd.measured``), the gradients
before each step, whether the workers' weights are identical after each step, and the
final weights. One launch measures an answer with the intended answer and each listed
mistake not yet measured in this kernel. A small classifier called like the lesson's
model, with dropout as DistilBERT, stands in for it (what is counted does not depend on
the model); a wider one, whose size no text gives, is a second configuration.
"""
import contextlib
import functools
import io
import itertools
import textwrap
from types import SimpleNamespace

import torch
from accelerate.local_sgd import LocalSGD

from helpers.collectives import CollectiveCounter, weight_gap
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes
from helpers.local_sgd import measured
from helpers.practice import core
from helpers.practice.core import Wrong
from helpers.practice.fixtures import accelerate_loop as ddp_loop  # no LocalSGD
from helpers.training import LEARNING_RATE

FEATURES, HIDDEN, WIDER, CLASSES = 8, 16, 24, 2  # 1,800 and 3,464 bytes of parameters
DROPOUT = 0.1  # as DistilBERT's: a loop that switches to eval mode trains differently
# features of standard deviation 6: every step's gradient norm exceeds 1, so clipping
# at the usual max_grad_norm=1.0 changes them
INPUT_SCALE, MICRO_BATCH = 6.0, 4
# Tolerances, from the gap between right and wrong answers. Gradients: another order of
# a float32 sum moves them ~1e-7 of the largest entry, a misplaced line 50 % or more.
# Weights: a hundredth of the learning rate (AdamW hardly moves when every gradient is
# scaled: hence the gradients too). Averaging: a float32 mean is within 1e-7 of the
# exact one, a bfloat16 copy 4e-3 away.
GRADIENT_TOLERANCE, WEIGHTS_TOLERANCE, MEAN_TOLERANCE = 1e-5, LEARNING_RATE / 100, 1e-6
# 3.1: ((steps, k), ...) and 3.2: ((micro-batches, accumulation, k), ...), each on the
# named classifier, then on the wider one; k need not divide the steps
STEP_CASES = [(((16, 8), (12, 8), (5, 8), (3, 1)), HIDDEN), (((10, 3), (16, 4)), WIDER)]
ACCUMULATION_CASES = [(((16, 2, 4), (12, 4, 3), (12, 2, 5)), HIDDEN),
                      (((18, 3, 4),), WIDER)]
FIX_SETUPS = ((16, 2), (8, 4))  # 3.3: (micro-batches, accumulation); the loop's k is 8


class SmallClassifier(torch.nn.Module):
    """Three linear layers with dropout between them: ``model(**batch).loss``."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        linear, relu, drop = torch.nn.Linear, torch.nn.ReLU, torch.nn.Dropout
        self.layers = torch.nn.Sequential(
            linear(FEATURES, hidden), relu(), drop(DROPOUT), linear(hidden, hidden),
            relu(), drop(DROPOUT), linear(hidden, CLASSES))

    def forward(self, inputs, labels):
        logits = self.layers(inputs)
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels))


def parameter_bytes(hidden):
    return sum(p.numel() * 4 for p in SmallClassifier(hidden).parameters())  # float32


def from_source(source, *edits):
    """The function ``source`` defines, after each ``(old, new)`` edit of its text: the
    mistakes are the intended answer with a learner's lines in it."""
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"torch": torch, "LocalSGD": LocalSGD}
    exec(textwrap.dedent(source), namespace)
    return namespace[source.split("def ", 1)[1].split("(", 1)[0]]


FIXED_LOOP = """
def fixed_train_loop(accelerator, model, optimizer, dataloader):
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8,
                  enabled=True) as local_sgd:
        model.train()
        for batch in dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                accelerator.backward(outputs.loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()
"""


@functools.cache
def lesson_loop(k):  # lesson 3's loop: local_sgd.step() after each zero_grad
    return from_source(FIXED_LOOP, ("local_sgd_steps=8", f"local_sgd_steps={k}"))


def prepared(accelerator, micro_batches, accumulation=1, hidden=HIDDEN):
    """A fresh model, AdamW and data loader (``micro_batches`` a process), prepared."""
    accelerator.gradient_accumulation_steps = accumulation
    accelerator.step = 0  # Accelerate's count towards the next step: an earlier run's
    torch.manual_seed(0)  # in the worker: the notebook's generators are not touched
    model = SmallClassifier(hidden)
    inputs = INPUT_SCALE * torch.randn(micro_batches * MICRO_BATCH
                                       * accelerator.num_processes, FEATURES)
    examples = [{"inputs": x, "labels": (x[0] + x[1] > 0).long()} for x in inputs]
    loader = torch.utils.data.DataLoader(examples, batch_size=MICRO_BATCH)
    return accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE), loader)


def flat(tensors):
    return torch.cat([t.detach().double().reshape(-1) for t in tensors])


def run_loop(accelerator, loop, micro_batches, accumulation=1, hidden=HIDDEN):
    """Run ``loop`` once: its collectives [what, step (0 before the loop, "end" after
    it), bytes], DDP's as "gradients"; the gradients before each step; whether the
    workers' weights were identical after each step; the final weights."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model, optimizer, loader = prepared(accelerator, micro_batches, accumulation,
                                        hidden)
    counter, gradients, identical = CollectiveCounter(), [], []

    def ddp_hook(state, bucket):  # DDP's all-reduce, through a hook the counter sees
        logged, future = len(counter.events), default_hooks.allreduce_hook(None, bucket)
        for event in counter.events[logged:]:
            event["collective"] = "gradients"
        return future

    def batches():
        yield from measured(loader, optimizer, counter, lambda step: identical.append(
            weight_gap(accelerator, model, counter) == 0.0))
        counter.step = "end"

    model.register_comm_hook(state=None, hook=ddp_hook)
    optimizer.optimizer.register_step_pre_hook(lambda *_: gradients.append(
        flat(p.grad if p.grad is not None else torch.zeros_like(p)
             for p in model.parameters()).tolist()))
    with counter:
        loop(accelerator, model, optimizer, batches())
    return {"sent": [[e["collective"], e["step"], e["bytes"]] for e in counter.events],
            "identical": identical + [weight_gap(accelerator, model, counter) == 0.0],
            "gradients": gradients, "weights": flat(model.parameters()).tolist()}


def worker(accelerator, jobs):
    """Each process runs each ``(measure, answer)``; an answer's exception (raised alike
    on every process) is its result (a launch's results travel as JSON)."""
    results = []
    for measure, answer in jobs:
        try:
            results.append(measure(accelerator, answer))
        except Exception as error:
            results.append({"raised": core.describe_error(error)})
    return results


def launch(jobs, processes=2):
    """The results of ``jobs`` on process 0; a failed or stuck launch, in one line."""
    try:  # Accelerate says "Launching training on 2 CPUs." at each launch: not here
        with contextlib.redirect_stdout(io.StringIO()):
            return run_in_processes(worker, (jobs,), processes, preload=False)
    except WorkerFailedError as error:
        last_line = error.worker_traceback.strip().splitlines()[-1]
        raise core.LearnerRaised(last_line) from None
    except WorkerTimeoutError:
        raise Wrong("the processes had not finished after minutes, and were stopped. "
                    "Hint: every process must issue the same collectives in the same "
                    "order (none under `if accelerator.is_main_process:`).") from None


_references = {}  # (exercise, intended answer or mistake) -> its result, kept


def launched(exercise, measure, answer, processes=2):
    """``measure(accelerator, answer)`` on process 0, in one launch with the exercise's
    intended answer and mistakes not yet measured."""
    known = [exercise.intended] + [wrong for _, wrong in exercise.mistakes]
    if not callable(answer):
        raise Wrong(f"{exercise.name} should be a function, not {answer!r}. Hint: give "
                    "its name, without calling it.")
    result = _references.get((exercise, answer))
    if result is None:  # the learner's answer is measured anew each time
        todo = [answer] + [f for f in known
                           if (exercise, f) not in _references and f is not answer]
        results = launch([(measure, f) for f in todo], processes)
        _references.update({(exercise, f): r for f, r in zip(todo, results)
                            if f in known})
        result = results[0]
    if isinstance(result, dict) and "raised" in result:
        raise core.LearnerRaised(result["raised"])
    return result


# --- 3.1 and 3.2: predict the bytes, measured on lesson 3's loops
# -----------------------------------------------------------------

def bytes_sent(accelerator, case):
    """What one loop all-reduced: case = (micro-batches, accumulation, k, hidden), k
    None for DDP."""
    m, a, k, hidden = case
    return sum(size for _, _, size in run_loop(
        accelerator, lesson_loop(k) if k else ddp_loop, m, a, hidden)["sent"])


@functools.cache
def bytes_measured():  # every loop of 3.1 and 3.2: one launch a kernel
    cases = [(s, 1, k, hidden) for group, hidden in STEP_CASES for s, k in group]
    cases += [(m, a, kk, hidden) for group, hidden in ACCUMULATION_CASES
              for m, a, k in group for kk in (None, k)]
    return dict(zip(cases, launch([(bytes_sent, case) for case in cases])))


def hidden_of(p):
    return HIDDEN if p == parameter_bytes(HIDDEN) else WIDER


def lesson_3_measured(steps, local_sgd_steps, p):  # 3.1's intended answer
    return bytes_measured()[(steps, 1, local_sgd_steps, hidden_of(p))]


def both_measured(micro_batches, accumulation, local_sgd_steps, p):  # 3.2's
    return tuple(bytes_measured()[(micro_batches, accumulation, k, hidden_of(p))]
                 for k in (None, local_sgd_steps))


def predicted(answer, config, name):
    """The answer's predictions for a group of cases (numbers, or pairs of them)."""
    def numbers(value):
        if isinstance(value, (tuple, list)):
            return tuple(core.as_number(number, name) for number in value)
        return core.as_number(value, name)
    cases, hidden = config
    return tuple(numbers(core.learner(answer, *case, parameter_bytes(hidden)))
                 for case in cases)


# bytes are whole: a wrong count is off by a whole averaging
exact = core.close(rel=0.0, abs_=0.5)


def shown(value):  # 5,400 or (2,400, 3,600)
    return (f"({', '.join(map(shown, value))})" if isinstance(value, tuple)
            else f"{value:,}")


def described(got, expected, config, names=("steps", "local_sgd_steps")):
    cases, hidden = config
    case, mine, truth = next(item for item in zip(cases, got, expected)
                             if not exact(item[1], item[2]))
    what = ", ".join(f"{name}={value}" for name, value in zip(names, case))
    return (f"for {what} and {parameter_bytes(hidden):,} bytes of parameters, you "
            f"predicted {shown(mine)}; measured on 2 processes, the loop all-reduced "
            f"{shown(truth)}. "
            "Hint: count the averagings (and DDP's steps), then the bytes of each.")


P = 1800  # bytes of parameters of the classifier the notebook names
NAMED = (f"your predictions fit the {P:,}-byte classifier the notebook names, not the "
         "wider one the check also runs. Hint: use the argument parameter_bytes.")
PREDICT = core.Exercise(
    number="3.1", name="predicted_bytes", intended=lesson_3_measured,
    measure=lambda answer, config: predicted(answer, config, "predicted_bytes"),
    configs=STEP_CASES, same=exact, describe=described,
    correct=lambda got, config: (
        "your predictions match the bytes lesson 3's loop all-reduced on 2 processes, "
        "on both classifiers: one averaging after every k-th step and one more as "
        "the block ends, each of all the parameters."),
    mistakes=[
        ("you count one averaging every k steps, but leaving the `with LocalSGD(...)` "
         "block averages once more. Hint: add it.", lambda s, k, p: s // k * p),
        ("you round steps / k up. Hint: one averaging after every k-th step (//), "
         "and one as the block ends.", lambda s, k, p: -(-s // k) * p),
        ("that is DDP, which all-reduces every step. Hint: Local SGD averages every k "
         "steps.", lambda s, k, p: s * p),
        ("your count of averagings has a fraction (steps / k). Hint: one averaging "
         "after every k full steps (//), and one as the block ends.",
         lambda s, k, p: (s / k + 1) * p),
        ("that is the number of averagings, not bytes. Hint: each averaging sends all "
         "the parameters, parameter_bytes.", lambda s, k, p: s // k + 1),
        ("you doubled the payload, as a ring all-reduce over many processes nearly "
         "does. Hint: a ring sends 2(N-1)/N times the payload: for N = 2, the "
         "payload itself.", lambda s, k, p: 2 * (s // k + 1) * p),
        (NAMED, lambda s, k, p: (s // k + 1) * P)])


@core.checker(PREDICT)
def check_predicted_bytes(predicted_bytes):
    """``predicted_bytes(steps, local_sgd_steps, parameter_bytes)``: the bytes
    lesson 3's loop all-reduces."""


PREDICT_BOTH = core.Exercise(
    number="3.2", name="predicted_bytes_with_accumulation", intended=both_measured,
    measure=lambda answer, config: predicted(answer, config, PREDICT_BOTH.name),
    configs=ACCUMULATION_CASES, same=exact, describe=functools.partial(
        described, names=("micro_batches", "gradient_accumulation_steps",
                          "local_sgd_steps")),
    correct=lambda got, config: (
        "your predictions match DDP's and Local SGD's bytes, measured on 2 processes "
        "on both classifiers: k counts micro-batches, so a k below the accumulation "
        "averages more often than DDP all-reduces."),
    mistakes=[
        ("under accelerator.accumulate, DDP all-reduces the gradients only in the "
         "micro-batch that completes an optimizer step. Hint: once per step.",
         lambda m, a, k, p: (m * p, (m // k + 1) * p)),
        ("local_sgd_steps counts calls of local_sgd.step(), once per micro-batch in "
         "the slide's loop. Hint: every k micro-batches, not k optimizer steps.",
         lambda m, a, k, p: (m // a * p, (m // a // k + 1) * p)),
        ("inside the `with LocalSGD` block DDP does not all-reduce the gradients: "
         "entering it switched that off (model.no_sync()). Hint: count only the "
         "averagings.", lambda m, a, k, p: (m // a * p, (m // k + 1 + m // a) * p)),
        ("leaving the `with LocalSGD(...)` block averages once more. Hint: add it.",
         lambda m, a, k, p: (m // a * p, m // k * p)),
        ("you swapped them. Hint: return (DDP's bytes, Local SGD's bytes).",
         lambda m, a, k, p: ((m // k + 1) * p, m // a * p)),
        (NAMED, lambda m, a, k, p: (m // a * P, (m // k + 1) * P))])


@core.checker(PREDICT_BOTH)
def check_predicted_bytes_with_accumulation(predicted_bytes_with_accumulation):
    """``predicted_bytes_with_accumulation(micro_batches,
    gradient_accumulation_steps, local_sgd_steps, parameter_bytes)``: (DDP's bytes,
    Local SGD's bytes)."""


# --- 3.3: the misplaced lines
# ------------------------------------------------------------------------------

LINE = "\n" + " " * 16  # a new line of the loop's body
# local_sgd.step() moved before optimizer.step(), as in the colleague's loop
STEP_FIRST = ((f"zero_grad(){LINE}local_sgd.step()", "zero_grad()"),
              ("optimizer.step()", f"local_sgd.step(){LINE}optimizer.step()"))


def runs_of(accelerator, loop):
    return [run_loop(accelerator, loop, m, a) for m, a in FIX_SETUPS]


def differing_step(mine, its):
    """The first optimizer step whose gradients differ; "end" when only the final
    weights do; None when neither."""
    for step, (g, t) in enumerate(zip(mine["gradients"], its["gradients"]), 1):
        g, t = torch.tensor(g), torch.tensor(t)
        if (g - t).abs().max() > GRADIENT_TOLERANCE * t.abs().max():
            return step
    if len(mine["gradients"]) != len(its["gradients"]):
        return min(len(mine["gradients"]), len(its["gradients"])) + 1
    weights = torch.tensor(mine["weights"]) - torch.tensor(its["weights"])
    return "end" if weights.abs().max() > WEIGHTS_TOLERANCE else None


def same_runs(got, expected):
    return all(mine["sent"] == its["sent"] and mine["identical"] == its["identical"]
               and differing_step(mine, its) is None
               for mine, its in zip(got, expected))


def sent_text(run):
    """Where a run all-reduced DDP's gradients and the parameters, in words."""
    said = []
    for kind, name in (("gradients", "DDP's gradients"), ("all_reduce", "parameters")):
        places = dict.fromkeys("the end" if s == "end" else "the start" if s == 0
                               else f"step {s}" for what, s, _ in run["sent"]
                               if what == kind)
        said += [f"all-reduced {name} at {', '.join(places)}"] if places else []
    return " and ".join(said) or "all-reduced nothing"


def fix_described(got, expected, config):
    (m, a), mine, its = next(item for item in zip(FIX_SETUPS, got, expected)
                             if not same_runs([item[1]], [item[2]]))
    where, step = f"on {m} micro-batches, accumulating {a}", differing_step(mine, its)
    if mine["sent"] != its["sent"] or mine["identical"] != its["identical"]:
        return (f"{where}, your loop {sent_text(mine)}; the fixed loop "
                f"{sent_text(its)} (or the workers' weights differed after other "
                "steps). Hint: show_communication(fixed_train_loop) shows where; move "
                "lines, change nothing else.")
    return (f"{where}, your loop communicates as the fixed loop does, but "
            + ("its final weights differ" if step == "end" else
               f"optimizer step {step} applied other gradients") + ". Hint: move the "
            "misplaced lines, change nothing else.")


FIX = core.Exercise(
    number="3.3", name="fixed_train_loop", intended=lesson_loop(8),
    measure=lambda answer, config: launched(FIX, runs_of, answer),
    same=same_runs, describe=fix_described, error_hints=[
        ("'local_sgd'", "local_sgd is the name `with LocalSGD(...) as local_sgd:` "
         "gives: call local_sgd.step() inside that block."),
        ("LocalSGD", "import it first: from accelerate.local_sgd import LocalSGD.")],
    correct=lambda got, config: (
        "measured on 2 processes, your loop sent no gradients, averaged the "
        "parameters every 4 optimizer steps and as the block ended, with the "
        "workers' weights identical after each averaging; each step applied the "
        "intended loop's gradients, and the final weights match (also with "
        "accumulation 4 on 8 micro-batches)."),
    mistakes=[
        ("the for loop runs after the `with LocalSGD(...)` block has ended: entering "
         "it switches DDP's gradient all-reduce off, and leaving it averages. Hint: "
         "indent the loop inside the block (then see where local_sgd.step() runs).",
         from_source(FIXED_LOOP, ("        for batch", "    for batch"), *STEP_FIRST)),
        ("the parameters are averaged before the optimizer step, so each worker then "
         "takes its own step and the weights differ at once. Hint: call "
         "local_sgd.step() after optimizer.step().",
         from_source(FIXED_LOOP, *STEP_FIRST)),
        ("local_sgd_steps counts calls of local_sgd.step(), once per micro-batch: 8 "
         "averages every 4 optimizer steps. Hint: keep local_sgd_steps=8.",
         from_source(FIXED_LOOP, ("local_sgd_steps=8", "local_sgd_steps=4"))),
        ("accelerator.backward already divides the loss by gradient_accumulation_steps"
         ": you divide it twice. Hint: pass outputs.loss as it is.",
         from_source(FIXED_LOOP, ("(outputs.loss)", "(outputs.loss / 2)"))),
        ("loss.backward() does not divide the loss by gradient_accumulation_steps, "
         "accelerator.backward does. Hint: keep accelerator.backward(outputs.loss).",
         from_source(FIXED_LOOP, ("accelerator.backward(outputs.loss)",
                                  "outputs.loss.backward()"))),
        ("the model trained in evaluation mode: dropout was off. Hint: keep "
         "model.train().", from_source(FIXED_LOOP, ("model.train()", "model.eval()"))),
        ("you clip the gradients, which changes them. Hint: add no clipping: move "
         "lines, change nothing else.", from_source(FIXED_LOOP, ("optimizer.step()",
         "accelerator.clip_grad_norm_(model.parameters(), 1.0)" + LINE
         + "optimizer.step()"))),
        ("zero_grad before backward clears the gradients between the micro-batches a "
         "step accumulates. Hint: call it after optimizer.step().",
         from_source(FIXED_LOOP, (" " * 16 + "optimizer.zero_grad()\n", ""),
                     ("outputs =", "optimizer.zero_grad()" + LINE + "outputs =")))])


@core.checker(FIX)
def check_fixed_local_sgd_loop(fixed_train_loop):
    """``fixed_train_loop(accelerator, model, optimizer, dataloader)``: exercise 3.3's
    Local SGD loop, its misplaced lines moved."""


# The name practice 3's notebooks call: practice 2 and 3 each check a fixed loop,
# check_fixed_accumulation_loop (2.3) and check_fixed_local_sgd_loop (3.3).
check_fixed_loop = check_fixed_local_sgd_loop


def show_communication(train_loop):
    """Run ``train_loop`` as exercise 3.3's check does; print what each process
    all-reduced, step by step."""
    run, ddp = launch([(lambda accelerator, loop: runs_of(accelerator, loop)[0], loop)
                       for loop in (train_loop, ddp_loop)])
    if "raised" in run:
        return print(f"{train_loop.__name__} raised {run['raised']}")
    m, a = FIX_SETUPS[0]
    print(f"{train_loop.__name__} on 2 processes, {m} micro-batches, accumulation {a}; "
          "what each process all-reduced:")
    row = "{:>16} | {:>15} | {:>19} | {}".format
    print(row("", "gradients (DDP)", "parameters averaged", "weights after"))
    for at, identical in zip([0, *range(1, len(run["gradients"]) + 1), "end"],
                             [None] + run["identical"]):
        sent = [sum(size for what, s, size in run["sent"] if what == kind and s == at)
                for kind in ("gradients", "all_reduce")]
        print(row({0: "before the loop", "end": "after the loop"}.get(
            at, f"optimizer step {at}"), *(f"{b:,} B" if b else "-" for b in sent),
            {True: "identical", False: "different", None: ""}[identical]).rstrip(" |"))
    print(f"total: {sum(s for _, _, s in run['sent']):,} bytes; plain DDP, measured in "
          f"the same launch: {sum(s for _, _, s in ddp['sent']):,} bytes.")


# --- 3.4: one all-reduce per averaging, on 3 processes
# ---------------------------------------------------------------

AVERAGE = """
def average_parameters(accelerator, model):
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        flat = accelerator.reduce(flat, reduction="mean")
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
"""


def probe(accelerator, average):
    """On each classifier: give every process its own parameters, call ``average`` once;
    what each parameter tensor then holds, their dtypes, the collectives issued."""
    results, n, rank = [], accelerator.num_processes, accelerator.process_index
    for hidden in (HIDDEN, WIDER):
        model = SmallClassifier(hidden)  # not wrapped in DDP: its set-up takes time
        own = torch.randn(n, parameter_bytes(hidden) // 4,
                          generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            # a copy: the parameters become views of it, which an answer may change
            torch.nn.utils.vector_to_parameters(own[rank].clone(), model.parameters())
        counter = CollectiveCounter()
        with counter:
            average(accelerator, model)
        total = own.double().sum(0)
        targets = {"the mean": total / n, "the sum": total, "the sum over 2": total / 2,
                   "the mean divided by N again": total / n / n,
                   "their own values": own[rank].double()}
        tolerance, holds = MEAN_TOLERANCE * total.abs().max(), []
        parts = [p.detach().double().reshape(-1) for p in model.parameters()]
        if sum(part.numel() for part in parts) != total.numel():
            parts, holds = [], ["tensors of other sizes"]
        for part, start in zip(parts, itertools.accumulate(
                [0] + [part.numel() for part in parts])):
            off = {name: (part - t[start:start + part.numel()]).abs().max()
                   for name, t in targets.items()}
            holds.append(next((name for name, gap in off.items() if gap <= tolerance),
                              "the mean, rounded" if off["the mean"] < 1e-2
                              * total.abs().max() / n else "other values"))
        results.append({"holds": holds, "dtypes": sorted({str(p.dtype).split(".")[1]
                                                          for p in model.parameters()}),
                        "sent": [[e["collective"], e["bytes"]] for e in counter.events
                                 if e["collective"] != "barrier"]})
    return results


def average_described(got, expected, config):
    (hidden, mine, its) = next(item for item in zip((HIDDEN, WIDER), got, expected)
                               if item[1] != item[2])
    if mine["holds"] != its["holds"]:
        held = " and ".join(dict.fromkeys(mine["holds"]))
        return (f"given parameters that differ between the 3 processes, your function "
                f"left them holding {held}, not each one's mean over the processes. "
                "Hint: every parameter should end as its mean, in its place.")
    if mine["dtypes"] != its["dtypes"]:
        return (f"your function left the parameters in {', '.join(mine['dtypes'])}; "
                "they were float32, and the next forward pass would fail. Hint: copy "
                "the mean back in their own dtype.")
    sent = ", ".join(f"{what} of {size:,} bytes" for what, size in mine["sent"])
    return (f"your function averaged correctly with {sent or 'no collective'}; the "
            "exercise asks for one all-reduce of all "
            f"{parameter_bytes(hidden):,} bytes of parameters. Hint: one flat tensor, "
            "one all-reduce, nothing else.")


REDUCE = 'accelerator.reduce(flat, reduction="mean")'
AVERAGING = core.Exercise(
    number="3.4", name="average_parameters", intended=from_source(AVERAGE),
    measure=lambda answer, config: launched(AVERAGING, probe, answer, processes=3),
    describe=average_described,
    correct=lambda got, config: (
        f"measured on 3 processes: your function leaves every parameter at its mean "
        f"over the processes with one all-reduce of {parameter_bytes(HIDDEN):,} bytes "
        f"({parameter_bytes(WIDER):,} on the wider classifier), where LocalSGD issues "
        "one per tensor (6) and a barrier."),
    mistakes=[
        ("the parameters hold the sum over the processes, not the mean: "
         "accelerator.reduce sums unless told. Hint: reduction=\"mean\".",
         from_source(AVERAGE, (REDUCE, "accelerator.reduce(flat)"))),
        ("the parameters hold the sum divided by 2, but this check runs 3 processes. "
         "Hint: divide by accelerator.num_processes.",
         from_source(AVERAGE, (REDUCE, "accelerator.reduce(flat) / 2"))),
        ("the parameters hold the mean divided once more by the number of processes: "
         "reduction=\"mean\" already divides. Hint: divide once.",
         from_source(AVERAGE, (REDUCE, REDUCE + " / accelerator.num_processes"))),
        ("your function left the parameters as they were: it averaged a flat copy "
         "(parameters_to_vector makes one). Hint: copy it back with "
         "vector_to_parameters(flat, model.parameters()).",
         from_source(AVERAGE, ("\n        torch.nn.utils.vector_to_parameters(flat, "
                                   "model.parameters())", ""))),
        ("you all-reduce one tensor at a time, as LocalSGD does. Hint: put all the "
         "parameters in one flat tensor first (parameters_to_vector).",
         from_source(AVERAGE, ("flat = torch", "for p in model.parameters():\n"
                               "            p.copy_(accelerator.reduce(p, "
                               "reduction='mean'))\n        flat = torch"),
                     (REDUCE, "flat"))),
        ("the parameters are near their mean but rounded: you all-reduced a "
         "lower-precision copy (bfloat16, float16). Hint: all-reduce them in float32.",
         from_source(AVERAGE, ("vector(model.parameters())",
                               "vector(model.parameters()).bfloat16()"),
                     ("(flat, model", "(flat.float(), model"))),
        ("your function left the parameters in float64; they were float32, and the "
         "next forward pass would fail. Hint: copy the mean back in float32.",
         from_source(AVERAGE, ("(flat, model", "(flat.double(), model"))),
        ("a gather receives every process's copy, 3 times the bytes. Hint: one "
         "all-reduce sums them in place, and every process gets the sum.",
         from_source(AVERAGE, (REDUCE, "accelerator.gather(flat[None]).mean(dim=0)"))),
        ("after the all-reduce every process already holds the mean: the broadcast "
         "sends it once more. Hint: one all-reduce, nothing else.",
         from_source(AVERAGE, (REDUCE, REDUCE + "\n        torch.distributed."
                                       "broadcast(flat, 0)"))),
        ("the biases kept their own values. Hint: average every parameter tensor "
         "(model.parameters() yields weights and biases).",
         from_source(AVERAGE, ("model.parameters()", "[p for p in model.parameters() "
                                                     "if p.dim() > 1]")))])


@core.checker(AVERAGING)
def check_average_parameters(average_parameters):
    """``average_parameters(accelerator, model)``: every parameter at its mean over
    the processes, with one all-reduce."""
