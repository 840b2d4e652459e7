"""Data-parallel training with and without Local SGD, on two or more real processes.

Introduced in lesson 03. The worker lives here, not in the notebook, so that the processes
that Accelerate's launcher starts can import it. The same training runs as a script:

    accelerate launch --multi_gpu --num_processes 2 helpers/local_sgd.py --local-sgd-steps 8

(``--multi_gpu`` makes Accelerate start the processes with torchrun; without a GPU the worker's
``Accelerator(cpu=True)`` connects them over gloo. With ``--cpu`` instead, Accelerate 1.x starts a
single process, and the worker refuses to run alone.)
"""
import argparse
import contextlib
import faulthandler
import gc
import json
import logging
import math
import os
import signal
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass
class RunConfig:
    """One training run. ``local_sgd_steps=None`` is plain data parallelism (DDP)."""
    name: str
    local_sgd_steps: int | None = None
    optimizer_steps: int = 250  # the same for every run, so that costs compare
    micro_batch_size: int = 64  # per process
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3e-3
    seed: int = 0
    track_drift: bool = False  # also measure how far apart the workers' weights are, every step
    fail_on_rank: int | None = None  # fault injection: this process raises at its first step

    def __post_init__(self):
        validate_local_sgd_steps(self.local_sgd_steps)


def validate_local_sgd_steps(local_sgd_steps):
    """``local_sgd_steps`` must be None (plain DDP) or a whole number >= 1."""
    if local_sgd_steps is None:
        return
    if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int):
        raise TypeError(f"local_sgd_steps must be a whole number of steps (an int), got {local_sgd_steps!r}")
    if local_sgd_steps < 1:
        raise ValueError(f"local_sgd_steps must be at least 1 (1 synchronizes every step), got {local_sgd_steps}")


class CollectiveCounter:
    """Counts the collective operations a process issues, and their payload bytes.

    While active it wraps torch.distributed's collectives, so it sees DDP's gradient
    all-reduce (once DDP's communication goes through a Python hook, see ``count_ddp``)
    and Local SGD's parameter averaging alike. ``paused()`` hides the lesson's own
    measurements (e.g. gathering weights to compare them).
    """
    COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                   "reduce_scatter_tensor", "barrier")

    def __init__(self):
        self.events = []  # (optimizer step, time, collective name, payload bytes)
        self.step = 0
        self._originals = {}
        self._paused = False
        self._start = time.perf_counter()

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            if not self._paused:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                payload = sum(t.numel() * t.element_size() for t in tensors[:1])  # the tensor sent
                self.events.append((self.step, time.perf_counter() - self._start, name, payload))
            return original(*args, **kwargs)
        return counted

    def __enter__(self):
        for name in self.COLLECTIVES:
            self._originals[name] = getattr(dist, name)
            setattr(dist, name, self._wrap(name, self._originals[name]))
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(dist, name, original)

    @contextlib.contextmanager
    def paused(self):
        self._paused, was = True, self._paused
        try:
            yield
        finally:
            self._paused = was

    def totals(self):
        return {"collectives": len(self.events), "bytes": sum(e[3] for e in self.events)}


def count_ddp(model):
    """Route DDP's gradient all-reduce through PyTorch's Python default hook, so it can be counted."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(state=None, hook=allreduce_hook)


def flat_parameters(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def weight_gap(accelerator, model, counter):
    """Largest absolute difference between the workers' weights (not counted as training traffic)."""
    with counter.paused():
        gathered = accelerator.gather(flat_parameters(model).unsqueeze(0))  # (processes, parameters)
    return (gathered.max(dim=0).values - gathered.min(dim=0).values).max().item()


def train_one_run(accelerator, config, tokenized, tokenizer):
    """Train with DDP or Local SGD, as on the slide; return what was measured on this process."""
    from accelerate.local_sgd import LocalSGD
    from transformers import get_linear_schedule_with_warmup

    from helpers.data import make_dataloader
    from helpers.models import build_model
    from helpers.training import evaluate

    model = build_model("tiny", seed=config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    dataloader = make_dataloader(tokenized["train"], tokenizer, config.micro_batch_size, shuffle=True,
                                 seed=config.seed)
    # A prepared scheduler advances once per process at every optimizer step (Accelerate
    # assumes it was sized for one process), so size it for all of them.
    total = config.optimizer_steps * accelerator.num_processes
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(0.1 * total), total)
    model, optimizer, dataloader, lr_scheduler = accelerator.prepare(model, optimizer, dataloader, lr_scheduler)
    count_ddp(model)
    use_local_sgd = config.local_sgd_steps is not None
    counter, losses, gaps, step = CollectiveCounter(), [], [], 0
    start = time.perf_counter()
    with counter, LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=config.local_sgd_steps or 1,
                           enabled=use_local_sgd) as local_sgd:
        while step < config.optimizer_steps:
            for batch in dataloader:
                counter.step = step + 1  # the optimizer step this micro-batch belongs to
                if config.fail_on_rank == accelerator.process_index:
                    raise RuntimeError(f"injected failure on process {accelerator.process_index}")
                with accelerator.accumulate(model):
                    outputs = model(**batch)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                    local_sgd.step()  # counts micro-batches: under accumulation, calls, not optimizer steps
                losses.append(loss.item())
                if accelerator.sync_gradients:
                    step += 1
                    if config.track_drift:
                        gaps.append((step, weight_gap(accelerator, model, counter)))
                if step >= config.optimizer_steps:
                    break
    # leaving the LocalSGD block averaged the weights one last time (counted above)
    seconds = time.perf_counter() - start
    final_gap = weight_gap(accelerator, model, counter) if accelerator.num_processes > 1 else 0.0
    validation = make_dataloader(tokenized["validation"], tokenizer, batch_size=128)
    val_metrics = evaluate(accelerator.unwrap_model(model), validation, accelerator.device)
    return {"config": asdict(config), "seconds": seconds, **counter.totals(),
            "events": counter.events, "train_loss": sum(losses[-20:]) / len(losses[-20:]),
            "val_loss": val_metrics["loss"], "val_accuracy": val_metrics["accuracy"],
            "gaps": gaps, "final_gap": final_gap}


def train_worker(configs, results_path):
    """Entry point of every process: run each config, rank 0 writes all results as JSON."""
    from accelerate import Accelerator

    from helpers.data import load_tokenized

    torch.set_num_threads(1)  # one core per process: the processes share the machine
    # Without cpu=True on a machine with no GPU, each process runs alone and Local SGD
    # silently does nothing; with GPUs, the default uses them.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if accelerator.num_processes < 2:
        raise RuntimeError(
            f"only {accelerator.num_processes} process joined the training, so there is nothing to synchronize and "
            "LocalSGD would silently do nothing. Start it with helpers.local_sgd.launch(...), "
            "notebook_launcher(..., num_processes=2) or `accelerate launch --multi_gpu --num_processes 2`.")
    tokenized, tokenizer = load_tokenized()
    results = {"processes": accelerator.num_processes, "runs": []}
    for config in configs:
        config = RunConfig(**config) if isinstance(config, dict) else config
        try:
            run = train_one_run(accelerator, config, tokenized, tokenizer)
        except Exception:
            # Written before this process closes its connections, so before its peers fail
            # in turn: launch() reports this traceback, the root cause.
            traceback_path(results_path, accelerator.process_index).write_text(traceback.format_exc())
            raise
        all_events = accelerator.gather_for_metrics([run.pop("events")], use_gather_object=True)
        run["events_by_rank"] = all_events
        results["runs"].append(run)
    if accelerator.is_main_process:
        Path(results_path).write_text(json.dumps(results))
    finish_worker(accelerator)


FORKED_WORKER_ENV = "COURSE_FORKED_WORKER"  # set in processes that run_in_processes forked


def finish_worker(accelerator):
    """Wait for every process, then end. A script worker destroys its process group; a forked one must not.

    Destroying a gloo process group joins its worker thread while holding the GIL, and that thread may
    still be freeing the tensors of a finished collective, which needs the GIL: a deadlock, seen about
    once in ten launches. A forked worker ends with os._exit, which frees everything without that join.
    """
    accelerator.wait_for_everyone()
    if not os.environ.get(FORKED_WORKER_ENV):
        accelerator.end_training()


def traceback_path(results_path, rank):
    return Path(results_path).with_name(f"traceback-process-{rank}.txt")


def stack_path(results_path, rank):
    return Path(results_path).with_name(f"stack-process-{rank}.txt")


def forked(worker):
    """What a forked process runs: undo what it inherited from the notebook's process, then ``worker``."""
    def run_forked(*args):
        os.environ[FORKED_WORKER_ENV] = "1"
        fresh_progress_bar_locks()
        # On SIGUSR1 (sent by run_in_processes' watchdog) write where every thread is, for the error message.
        stack_file = open(stack_path(args[-1], int(os.environ.get("RANK", "0"))), "w")
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
        return worker(*args)
    return run_forked


def fresh_progress_bar_locks():
    """Give tqdm (datasets' progress bars) locks of this process only.

    Inherited through fork, tqdm's lock is a semaphore shared with the notebook's process and with the
    other workers, plus a thread lock copied in whatever state another thread held it: a worker killed
    while holding it, or a copy taken mid-use, blocks every later progress bar, in every process.
    """
    from tqdm import std

    classes = [std.tqdm]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if "_lock" in vars(cls) and cls is not std.tqdm:
            delattr(cls, "_lock")
    std.tqdm.set_lock(threading.RLock())


def free_port():
    """A TCP port that nothing listens on now, for the processes to meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_loopback():
    """The processes meet on 127.0.0.1: fail now, clearly, rather than wait for a rendezvous that cannot happen."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            socket.create_connection(server.getsockname(), timeout=2).close()
    except OSError as error:
        raise RuntimeError(
            f"the worker processes talk over the loopback interface (127.0.0.1), which does not answer here "
            f"({error}). In a network namespace made with `unshare -n`, bring it up first: ip link set lo up") from None


def port_is_busy(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", int(port))) == 0


def launch(configs, num_processes=2, port=29500, timeout_s=300):
    """Start ``num_processes`` processes from a notebook and return rank 0's results.

    Handles what would otherwise break a notebook launch: an Accelerator or Trainer
    already made in this kernel (Accelerate's launcher refuses then), a busy port,
    a worker that fails (its traceback is raised here, at once, instead of a hang), and
    workers still running after ``timeout_s`` (the lesson's longest launch takes about 50 s).
    """
    configs = [asdict(c) if isinstance(c, RunConfig) else dict(c) for c in configs]
    for config in configs:
        RunConfig(**config)  # validates, in this process, before anything starts
    return run_in_processes(train_worker, (configs,), num_processes, port, timeout_s)


def run_in_processes(worker, worker_args, num_processes=2, port=29500, timeout_s=600):
    """Run ``worker(*worker_args, results_path)`` in ``num_processes`` forked processes; return the JSON
    that rank 0 wrote to ``results_path``. A worker that raises should first write its traceback to
    ``traceback_path(results_path, rank)``; it is then raised here as a WorkerFailedError. Workers still
    running after ``timeout_s`` seconds are stopped, and a WorkerTimeoutError says where each one was.
    """
    from accelerate import notebook_launcher
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import patch_environment
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if num_processes < 2:
        raise ValueError(f"Local SGD needs at least 2 processes, got num_processes={num_processes}")
    require_loopback()
    if AcceleratorState._shared_state or PartialState._shared_state:
        # An Accelerator (or a Trainer, which makes one) exists in this kernel: the forked
        # workers would inherit its state, so Accelerate refuses to launch. Reset it.
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    if port_is_busy(port):
        port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        results_path = Path(folder) / "results.json"
        # one thread per process (Accelerate would otherwise set it, with a warning)
        threads = os.environ.get("OMP_NUM_THREADS", "1")
        # Objects left over from an earlier launch (a failed one leaves its rendezvous store in
        # a reference cycle) must be freed here: freed in a forked worker, the store's
        # destructor waits forever for a thread that only exists in this process.
        gc.collect()
        failure = None
        watchdog = Watchdog(timeout_s)
        try:
            with patch_environment(omp_num_threads=threads), _quiet_launcher_logs(), watchdog, _frozen_at_fork():
                notebook_launcher(record_errors(forked(worker)), args=(*worker_args, str(results_path)),
                                  num_processes=num_processes, use_port=str(port))
        except ChildFailedError as error:
            if watchdog.fired:
                stacks = {rank: stack_path(results_path, rank).read_text() for rank in range(num_processes)
                          if stack_path(results_path, rank).exists()}
                failure = WorkerTimeoutError(timeout_s, stacks)
            else:
                tracebacks = {rank: traceback_path(results_path, rank).read_text()
                              for rank in range(num_processes) if traceback_path(results_path, rank).exists()}
                failure = WorkerFailedError(error, tracebacks)
        gc.collect()
        if failure is not None:
            raise failure  # outside the except block: it does not keep the launcher's frames alive
        return json.loads(results_path.read_text())


@contextlib.contextmanager
def _quiet_launcher_logs():
    """Torch elastic logs a failed worker's traceback with pids and times; we raise it ourselves."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


_freeze_at_fork = False


def _freeze_before_fork():
    if _freeze_at_fork:
        gc.freeze()  # the child inherits these objects as permanent: its collector never frees them


def _unfreeze_in_parent():
    if _freeze_at_fork:
        gc.unfreeze()


@contextlib.contextmanager
def _frozen_at_fork():
    """While active, a worker's garbage collector never frees objects it inherited from this process.

    The launcher makes objects (its rendezvous store among them) between our gc.collect() and the
    fork; freed in a worker, a store's destructor waits for a thread that only exists here, and the
    worker hangs in its own rendezvous. gc.freeze() before the fork is what Python's gc docs advise.
    """
    global _freeze_at_fork
    if not getattr(_frozen_at_fork, "registered", False):
        os.register_at_fork(before=_freeze_before_fork, after_in_parent=_unfreeze_in_parent)
        _frozen_at_fork.registered = True
    _freeze_at_fork = True
    try:
        yield
    finally:
        _freeze_at_fork = False


class Watchdog:
    """Stops the worker processes forked while it is active, if they run longer than ``timeout_s``."""

    def __init__(self, timeout_s):
        import psutil

        self.timeout_s, self.fired = timeout_s, False
        self.me = psutil.Process()
        self.timer = threading.Timer(timeout_s, self.stop_workers)
        self.timer.daemon = True

    def __enter__(self):
        self.before = {p.pid for p in self.me.children()}  # e.g. a notebook's other processes: not ours
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()

    def stop_workers(self):
        import psutil

        workers = [p for p in self.me.children() if p.pid not in self.before]
        self.fired = True
        for process in workers:  # each writes its threads' stacks (see forked())
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        for process in workers:
            with contextlib.suppress(psutil.Error):
                process.kill()


class WorkerTimeoutError(RuntimeError):
    """The worker processes ran past the time limit and were stopped; the message says where they were."""

    def __init__(self, timeout_s, stacks):
        where = "\n".join(f"process {rank}:\n{text.strip()}" for rank, text in sorted(stacks.items()))
        super().__init__(f"the worker processes were still running after {timeout_s} s and were stopped. "
                         f"A process waiting for a collective that another never joins looks like this.\n{where}")
        self.stacks = stacks


def is_peer_failure(traceback_text):
    return "by peer" in traceback_text or "gloo/transport" in traceback_text


class WorkerFailedError(RuntimeError):
    """A worker process raised: its traceback, as the worker printed it."""

    def __init__(self, child_failed_error, tracebacks):
        for rank, failure in child_failed_error.failures.items():  # as the launcher recorded them
            message = failure.message
            if isinstance(message, dict):
                message = message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
            tracebacks.setdefault(rank, str(message))
        # A worker whose peer vanished fails too, inside gloo ("Connection closed by peer",
        # "Read error ... reset by peer"): report the worker that failed for its own reason.
        rank = min(tracebacks, key=lambda r: (is_peer_failure(tracebacks[r]), r))
        super().__init__(f"worker process {rank} failed:\n{tracebacks[rank]}")
        self.worker_traceback = tracebacks[rank]


def record_errors(function):
    """Make the launcher keep a worker's traceback (torch elastic's @record)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(function)


def main():
    parser = argparse.ArgumentParser(description="Data-parallel training of the tiny DistilBERT, with Local SGD.")
    parser.add_argument("--local-sgd-steps", type=int, default=None, help="synchronize every K steps (default: DDP)")
    parser.add_argument("--optimizer-steps", type=int, default=RunConfig.optimizer_steps)
    parser.add_argument("--results", default="local_sgd_results.json", help="where rank 0 writes the results")
    args = parser.parse_args()
    name = f"Local SGD k={args.local_sgd_steps}" if args.local_sgd_steps else "DDP"
    config = RunConfig(name, args.local_sgd_steps, optimizer_steps=args.optimizer_steps)
    train_worker([asdict(config)], args.results)
    if int(os.environ.get("RANK", "0")) == 0:
        run = json.loads(Path(args.results).read_text())["runs"][0]
        print(f"{name}: {run['collectives']} collectives, {run['bytes']:,} bytes sent per process, "
              f"validation loss {run['val_loss']:.3f}")


if __name__ == "__main__":
    main()
