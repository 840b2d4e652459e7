"""Practice 3's checks (lesson 03): answers run on 2 real processes (3 in 3.4)."""
import contextlib
import functools
import io

import torch
from accelerate.local_sgd import LocalSGD
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from helpers.collectives import CollectiveCounter, weight_gap
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes
from helpers.local_sgd import measured
from helpers.practice import core, fixtures
from helpers.training import LEARNING_RATE

HIDDEN, WIDER, MICRO_BATCH = 16, 24, 4  # SmallClassifier's width, the wider one's
INPUT_SCALE = 6.0  # every gradient's norm then exceeds 1: clipping at 1.0 changes it
# Right and wrong apart: a float32 sum's order moves gradients 1e-7 of the largest, a
# misplaced line 50 %+; weights LR/100 (AdamW hides scaling); a float32 mean, 1e-7.
GRADIENT_TOLERANCE, WEIGHTS_TOLERANCE, MEAN_TOLERANCE = 1e-5, LEARNING_RATE / 100, 1e-6
FIX_SETUPS = ((16, 2), (8, 4))  # 3.3: (micro-batches, accumulation); the loop's k is 8
_kept = {}  # (measure, listed answer or case) -> its result, for the kernel
SAME_COLLECTIVES = ("every process must issue the same collectives in the same order: "
                    "none under `if accelerator.is_main_process:`.")
NEVER_JOINED_HINT = (("a process never joined", SAME_COLLECTIVES),)  # 3.3's and 3.4's


with torch.device("meta"):  # sizes only: the learner's random numbers stay undrawn
    BYTES = {h: 4 * sum(p.numel() for p in fixtures.SmallClassifier(h).parameters())
             for h in (HIDDEN, WIDER)}  # of float32 parameters: 1,800 and 3,464
P, P_WIDER = BYTES.values()
# 3.1: (steps, k, bytes of parameters); 3.2: (micro-batches, accumulation, k, bytes)
STEP_CASES = [(16, 8, P), (12, 8, P), (5, 8, P), (3, 1, P), (10, 3, P_WIDER)]
ACCUMULATION_CASES = [(12, 4, 3, P), (12, 2, 5, P), (18, 3, 4, P_WIDER)]


def fixed_train_loop(accelerator, model, optimizer, dataloader, local_sgd_steps=8,
                     enabled=True):
    """3.3's intended answer; lesson 3's loop for 3.1 and 3.2 (enabled=False: DDP)."""
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps,
                  enabled=enabled) as local_sgd:
        model.train()
        for batch in dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                accelerator.backward(outputs.loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()


FOR, OUTPUTS = "for batch in dataloader:", "outputs = model(**batch)"
DDP_LOOP = functools.partial(fixed_train_loop, enabled=False)  # LocalSGD off: plain DDP


def run_loop(accelerator, loop, m=None, accumulation=1, hidden=HIDDEN):
    """``loop`` on ``m`` micro-batches a process: what it sent, applied and left."""
    if m is None:  # 3.3's runs: on each of FIX_SETUPS
        return [run_loop(accelerator, loop, m, a) for m, a in FIX_SETUPS]
    accelerator.gradient_accumulation_steps = accumulation
    accelerator.step = 0  # Accelerate's count towards the next step: an earlier run's
    torch.manual_seed(0)  # in the worker: the notebook's generators are not touched
    model = fixtures.SmallClassifier(hidden)
    x = INPUT_SCALE * torch.randn(m * MICRO_BATCH * accelerator.num_processes,
                                  model[0].in_features)
    examples = [{"inputs": row, "labels": (row[0] + row[1] > 0).long()} for row in x]
    model, optimizer, loader = accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE),
        torch.utils.data.DataLoader(examples, batch_size=MICRO_BATCH))
    counter, gradients, identical = CollectiveCounter(), [], []

    def ddp_hook(state, bucket):  # DDP's all-reduce, through a hook the counter sees
        future = allreduce_hook(None, bucket)
        counter.events[-1]["collective"] = "gradients"  # the hook's one all_reduce
        return future

    def batches():
        yield from measured(loader, optimizer, counter, lambda step: identical.append(
            weight_gap(accelerator, model, counter) == 0.0))
        counter.step = "end"

    model.register_comm_hook(state=None, hook=ddp_hook)
    optimizer.optimizer.register_step_pre_hook(lambda *_: gradients.append(
        parameters_to_vector(p.grad if p.grad is not None else torch.zeros_like(p)
                             for p in model.parameters()).tolist()))
    with counter:
        loop(accelerator, model, optimizer, batches())
    return {"sent": [[e["collective"], e["step"], e["bytes"]] for e in counter.events],
            "identical": identical + [weight_gap(accelerator, model, counter) == 0.0],
            "gradients": gradients,
            "weights": parameters_to_vector(model.parameters()).tolist()}


def launch(jobs, processes=2):
    """Each job's ``measure(accelerator, answer)`` on process 0, or its error."""
    def worker(accelerator):
        results = []
        for measure, answer in jobs:
            try:
                results.append(measure(accelerator, answer))
            except Exception as error:
                results.append({"raised": core.describe_error(error)})
        return results

    try:  # Accelerate says "Launching training on 2 CPUs." at each launch: not here
        with contextlib.redirect_stdout(io.StringIO()):
            return run_in_processes(worker, (), processes,  # preloads datasets
                                    collective_timeout_s=core.COLLECTIVE_TIMEOUT_S)
    except WorkerFailedError as error:  # a process ended without its results
        raise core.LearnerRaised(core.never_joined(error.worker_traceback)) from None
    except WorkerTimeoutError:
        raise core.Wrong(f"{core.NEVER_JOINED}. Hint: {SAME_COLLECTIVES}") from None


def launched(measure, answer, processes=2):
    """``measure(accelerator, answer)`` on process 0, launched with the LISTED left."""
    job = (measure, answer)  # last: an answer that upsets the processes spoils no other
    if _noting:  # LISTED being made (the foot of this file): the job noted, not run
        return LISTED[processes].append(job) or 0
    todo = [j for j in dict.fromkeys([*LISTED[processes], job]) if j not in _kept]
    _kept.update(zip(todo, launch(todo, processes) if todo else []))
    result = _kept[job] if job in LISTED[processes] else _kept.pop(job)
    if isinstance(result, dict) and "raised" in result:
        raise core.LearnerRaised(core.never_joined(result["raised"]))
    return result


def bytes_sent(accelerator, case):
    """The bytes lesson 3's loop (DDP's, where k is None) all-reduced."""
    m, a, k, p = case
    loop = functools.partial(fixed_train_loop, local_sgd_steps=k, enabled=bool(k))
    run = run_loop(accelerator, loop, m, a, HIDDEN if p == P else WIDER)
    return sum(size for _, _, size in run["sent"])


def predictions(answer, case):  # 3.1's and 3.2's measure: a number, or a pair of them
    return core.as_numbers(core.learner(answer, *case), "your prediction")


COUNT = "count the averagings (and DDP's steps), then the bytes of each."
NAMED = (f"your predictions fit the {P:,}-byte classifier the notebook names, not the "
         "wider one the check also runs. Hint: use the argument parameter_bytes.")
PREDICT = core.Exercise(
    number="3.1", name="predicted_bytes", configs=STEP_CASES, measure=predictions,
    intended=lambda s, k, p: launched(bytes_sent, (s, 1, k, p)),
    label="steps={}, local_sgd_steps={}, parameter_bytes={}", describe=COUNT,
    correct=("your predictions match the bytes lesson 3's loop all-reduced on 2 "
             "processes, on both classifiers: one averaging after every k-th step "
             "and one more as the block ends, each of all the parameters."), mistakes=[
        ("you count one averaging every k steps, but leaving the `with LocalSGD(...)` "
         "block averages once more. Hint: add it.", lambda s, k, p: s // k * p),
        ("you round steps / k up. Hint: one averaging after every k-th step (//), "
         "and one as the block ends.", lambda s, k, p: -(-s // k) * p),
        ("that is DDP, which all-reduces every step. Hint: Local SGD averages every k "
         "steps.", lambda s, k, p: s * p),
        (NAMED, lambda s, k, p: (s // k + 1) * P)])


@core.checker(PREDICT)
def check_predicted_bytes(predicted_bytes):
    """``predicted_bytes(steps, local_sgd_steps, parameter_bytes)``."""


PREDICT_BOTH = core.Exercise(
    number="3.2", name="predicted_bytes_with_accumulation", measure=predictions,
    configs=ACCUMULATION_CASES, intended=lambda m, a, k, p: tuple(
        launched(bytes_sent, (m, a, kk, p)) for kk in (None, k)),
    label="micro_batches={}, gradient_accumulation_steps={}, local_sgd_steps={}, "
    "parameter_bytes={}", describe=COUNT,
    correct=("your predictions match DDP's and Local SGD's bytes, measured on 2 "
             "processes on both classifiers: k counts micro-batches, so a k below "
             "the accumulation averages more often than DDP all-reduces."), mistakes=[
        ("under accelerator.accumulate, DDP all-reduces the gradients only in the "
         "micro-batch that completes an optimizer step. Hint: once per step.",
         lambda m, a, k, p: (m * p, (m // k + 1) * p)),
        ("local_sgd_steps counts calls of local_sgd.step(), once per micro-batch in "
         "the slide's loop. Hint: every k micro-batches, not k optimizer steps.",
         lambda m, a, k, p: (m // a * p, (m // a // k + 1) * p)),
        (NAMED, lambda m, a, k, p: (m // a * P, (m // k + 1) * P))])


@core.checker(PREDICT_BOTH)
def check_predicted_bytes_with_accumulation(predicted_bytes_with_accumulation):
    """(DDP's bytes, Local SGD's bytes), under gradient accumulation."""


def difference(mine, its):
    """The first thing that differs between two runs of a loop, in words; else ""."""
    if mine["sent"] != its["sent"] or mine["identical"] != its["identical"]:
        return "it all-reduces other bytes or at other steps, or its workers differ"
    for step, (g, t) in enumerate(zip(mine["gradients"], its["gradients"]), 1):
        largest = max(map(abs, t), default=0)
        if not core.same_values(g, t, 0, GRADIENT_TOLERANCE * largest):
            return f"optimizer step {step} applies other gradients"
    same = core.same_values(mine["weights"], its["weights"], 0, WEIGHTS_TOLERANCE)
    return "" if same else "its final weights differ"


STEP_FIRST = (("local_sgd.step()", ""),  # the colleague's
              ("optimizer.step()", "local_sgd.step()\noptimizer.step()"))
FIX = core.Exercise(
    number="3.3", name="fixed_train_loop", intended=fixed_train_loop,
    measure=lambda answer, config: launched(run_loop, answer),
    same=lambda got, expected: not any(map(difference, got, expected)),
    describe=lambda got, expected, config: next(
        f"on {m} micro-batches, accumulating {a}, {said}, unlike the fixed loop. Hint: "
        "show_communication(fixed_train_loop) shows it; move only the misplaced lines."
        for (m, a), said in zip(FIX_SETUPS, map(difference, got, expected)) if said),
    error_hints=NEVER_JOINED_HINT,
    correct=("measured on 2 processes, your loop sent no gradients, averaged the "
             "parameters every 4 optimizer steps and as the block ended, with the "
             "workers' weights identical after each averaging; each step applied "
             "the intended loop's gradients, and the final weights match (also with "
             "accumulation 4 on 8 micro-batches)."), mistakes=[
        ("the for loop runs after the `with LocalSGD(...)` block: entering it switches "
         "DDP's gradient all-reduce off, leaving it averages. Hint: indent the loop.",
         core.edited(fixed_train_loop, *STEP_FIRST, (FOR, FOR, -1))),  # -1: dedented
        ("the parameters are averaged before the optimizer step, so each worker then "
         "takes its own step and the weights differ at once. Hint: call "
         "local_sgd.step() after optimizer.step().",
         core.edited(fixed_train_loop, *STEP_FIRST)),
        ("zero_grad before backward clears the gradients between the micro-batches a "
         "step accumulates. Hint: call it after optimizer.step().",
         core.edited(fixed_train_loop, ("optimizer.zero_grad()", ""),
                     (OUTPUTS, "optimizer.zero_grad()\n" + OUTPUTS)))])


@core.checker(FIX)
def check_fixed_local_sgd_loop(fixed_train_loop):
    """``fixed_train_loop(accelerator, model, optimizer, dataloader)``."""


check_fixed_loop = check_fixed_local_sgd_loop  # the name practice 3's notebooks call


def show_communication(train_loop):
    """Run ``train_loop`` as 3.3's check does: what it all-reduced, step by step."""
    run, ddp = launch([(lambda acc, loop: run_loop(acc, loop, *FIX_SETUPS[0]), loop)
                       for loop in (train_loop, DDP_LOOP)])
    if "raised" in run:
        return print(f"{train_loop.__name__} raised {run['raised']}")
    print(f"{train_loop.__name__} on 2 processes, {FIX_SETUPS[0][0]} micro-batches, "
          f"accumulation {FIX_SETUPS[0][1]}; what each process all-reduced:")
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


def probe(accelerator, average):
    """What ``average`` leaves, and sends, given parameters that differ by process."""
    n, rank = accelerator.num_processes, accelerator.process_index
    holds, dtypes, sent = [], set(), []
    for hidden, size in BYTES.items():
        model = fixtures.SmallClassifier(hidden)  # not in DDP: its set-up takes time
        own = torch.randn(n, size // 4, generator=torch.Generator().manual_seed(0))
        vector_to_parameters(own[rank].clone(), model.parameters())  # views of a copy
        with CollectiveCounter() as counter:
            average(accelerator, model)
        total = own.double().sum(0)
        values = parameters_to_vector(model.parameters()).double()
        targets = {"the mean": total / n, "the sum": total, "the sum over 2": total / 2,
                   "their own values": own[rank].double()}
        near = MEAN_TOLERANCE * total.abs().max().item()
        holds.append(next((name for name, target in targets.items() if core.same_values(
            values, target, 0, near)), "other values"))
        dtypes |= {str(p.dtype).split(".")[1] for p in model.parameters()}
        sent += [[e["collective"], e["bytes"]] for e in counter.events
                 if e["collective"] != "barrier"]
    everyone = [None] * n  # every process's parameters, not process 0's alone
    torch.distributed.all_gather_object(everyone, core.listed(dict.fromkeys(holds)))
    held = "; ".join(f"on process {r}, {what}" for r, what in enumerate(everyone))
    return {"the parameters hold": everyone[0] if len(set(everyone)) == 1 else held,
            "dtypes": sorted(dtypes), "collectives": sent}


def average_parameters(accelerator, model):  # 3.4's intended answer
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        flat = accelerator.reduce(flat, reduction="mean")
        torch.nn.utils.vector_to_parameters(flat, model.parameters())


REDUCE = 'flat = accelerator.reduce(flat, reduction="mean")'
COPY_BACK = "torch.nn.utils.vector_to_parameters(flat, model.parameters())"
miss = functools.partial(core.edited, average_parameters)  # a near miss of 3.4's
AVERAGING = core.Exercise(
    number="3.4", name="average_parameters", intended=average_parameters,
    measure=lambda answer, config: launched(probe, answer, 3),
    error_hints=NEVER_JOINED_HINT,
    describe=("every parameter should end as its mean over the processes, in float32, "
              "after one all-reduce of all of them (a flat tensor), nothing else."),
    correct=(f"measured on 3 processes: your function leaves every parameter at its "
             f"mean over the processes with one all-reduce of {P:,} bytes ({P_WIDER:,} "
             "on the wider classifier), where LocalSGD issues one per tensor (6) and a "
             "barrier."), mistakes=[
        ("the parameters hold the sum over the processes, not the mean: "
         "accelerator.reduce sums unless told. Hint: reduction=\"mean\".",
         miss((REDUCE, "flat = accelerator.reduce(flat)"))),
        ("the parameters hold the sum divided by 2, but this check runs 3 processes. "
         "Hint: divide by accelerator.num_processes.",
         miss((REDUCE, "flat = accelerator.reduce(flat) / 2"))),
        ("your function left the parameters as they were: it averaged a flat copy "
         "(parameters_to_vector makes one). Hint: copy it back (vector_to_parameters).",
         miss((COPY_BACK, ""))),
        ("only process 0's parameters hold the mean; the others kept their own: "
         "every process must copy the mean back. Hint: no `if accelerator."
         "is_main_process:` around vector_to_parameters.",
         miss((COPY_BACK, "if accelerator.is_main_process:\n    " + COPY_BACK))),
        ("you all-reduce one tensor at a time, as LocalSGD does. Hint: put all the "
         "parameters in one flat tensor first (parameters_to_vector).",
         miss((REDUCE, ""), (COPY_BACK, "for p in model.parameters():\n    p.copy_("
                                        "accelerator.reduce(p, reduction='mean'))")))])


@core.checker(AVERAGING)
def check_average_parameters(average_parameters):
    """``average_parameters(accelerator, model)``."""


LISTED, _noting = {2: [], 3: []}, True  # launched()'s jobs for every known answer
for exercise in [v for v in list(globals().values()) if isinstance(v, core.Exercise)]:
    for answer in (exercise.intended, *[wrong for _, wrong in exercise.mistakes]):
        for config in exercise.configs:  # 3.1's and 3.2's intended answers launch too
            exercise.measure(answer, config)
del exercise, answer, config
_noting = False  # from now on, the first launch of a kernel runs LISTED's jobs
