"""Start worker processes from a notebook, safely (introduced in lesson 03, used by its
practice checks).

``run_in_processes(worker, args)`` forks ``num_processes`` processes with Accelerate's
``notebook_launcher`` and, in each, runs ``worker(accelerator, *args)`` with an
Accelerator made for it; it returns what the worker returned on process 0. A worker only
trains and returns its results: this module owns the rest of the protocol.

- One thread per process (they share the machine's cores).
- The processes meet on a port of their own: ``port``, else ``$MASTER_PORT`` (the
  variable PyTorch's launchers read), else one free now; a taken one is replaced by a
  free one. Another launch may take a free port before these processes listen on it
  (two notebooks launching at the same moment, both on 29500: "address already in
  use", in 16 of 108 launches made side by side): the launch then starts again on
  another.
- ``Accelerator(cpu=True)`` when there is no GPU: without it each process would run
  alone. Accelerate's "Launching training on 2 CPUs." then names that device, whatever
  the torch build. A collective that waits longer than ``COLLECTIVE_TIMEOUT_S`` fails
  instead of hanging.
- A worker that raises writes its own traceback before its peers lose their connection
  to it, and ``WorkerFailedError`` shows that root cause in the notebook.
- A watchdog follows the workers. When some have waited ``NOTICE_S`` seconds for
  another (to join them, or to finish), it says so in the notebook at once, with where
  that process is; when one has failed, it stops the others within seconds (torch
  would give each 30 s to stop after its SIGTERM, which a process blocked in a
  collective never answers: with the collective's 60 s timeout, a launch waited a
  minute and a half without a word). Workers still running after ``timeout_s`` are
  stopped; ``WorkerTimeoutError`` shows where each one was waiting.
- Fork hygiene: what a forked process inherits from the notebook's process must not
  block it. Objects are frozen across the fork (their destructors would wait for threads
  that only exist in the parent), tqdm's locks are replaced, and a forked worker does
  not destroy its gloo process group on the way out (that join can deadlock; the
  process's exit frees it).
"""
import contextlib
import faulthandler
import gc
import json
import linecache
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch

# far above what any launch of the course takes, so that only a hang reaches it
LAUNCH_TIMEOUT_S = 300
COLLECTIVE_TIMEOUT_S = 60  # no single collective of the course takes more than a second
# run_in_processes(collective_timeout_s=...) tells the forked workers through it
COLLECTIVE_TIMEOUT_ENV = "COURSE_COLLECTIVE_TIMEOUT_S"
# a process waiting this long for another is news (processes start within a second of
# each other even on a loaded machine: 0.3 s at most in 150 launches)
NOTICE_S = 10
# launches started again when another program took their port first
PORT_ATTEMPTS = 3
# set in the processes that run_in_processes forks
FORKED_WORKER_ENV = "COURSE_FORKED_WORKER"


def run_in_processes(worker, worker_args=(), num_processes=2, port=None,
                     timeout_s=LAUNCH_TIMEOUT_S, preload=True,
                     collective_timeout_s=COLLECTIVE_TIMEOUT_S):
    """Run ``worker(accelerator, *worker_args)`` in ``num_processes`` forked processes;
    return process 0's result.

    The result must be JSON-serialisable (it travels through a file). A worker that
    raises is raised here as a ``WorkerFailedError``; workers still running after
    ``timeout_s`` seconds are stopped, and a ``WorkerTimeoutError`` says where each one
    was. ``preload=False`` skips importing DistilBERT's and the data's code before the
    fork, for workers that use neither. A collective that waits longer than
    ``collective_timeout_s`` fails in the processes that wait (a practice check whose
    usual mistake is a collective one process never joins says so in seconds).
    """
    if (isinstance(num_processes, bool) or not isinstance(num_processes, int)
        or num_processes < 2):
        raise ValueError("run_in_processes starts at least 2 processes, got "
                         f"num_processes={num_processes!r}; to run a worker alone, "
                         "call it with an Accelerator of your own")
    for name, seconds in (("timeout_s", timeout_s),
                          ("collective_timeout_s", collective_timeout_s)):
        if not seconds or seconds <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, "
                             f"got {seconds!r}")
    require_loopback()
    reset_accelerate_state()
    if preload:
        # once, before the fork: the workers share it instead of each importing it
        _preload_training_modules()
    if port is None:
        port = default_port()
    for attempt in range(PORT_ATTEMPTS):
        if port is None or port_is_busy(port):
            port = free_port()
        try:
            with _environment(COLLECTIVE_TIMEOUT_ENV, str(collective_timeout_s)):
                return _launch(worker, worker_args, num_processes, port, timeout_s)
        except torch.distributed.DistNetworkError as error:
            if "EADDRINUSE" not in str(error) or attempt == PORT_ATTEMPTS - 1:
                raise
            port = None  # taken between our look and the listen: another, free now


def _launch(worker, worker_args, num_processes, port, timeout_s):
    """One launch on ``port``: run_in_processes's, once."""
    from accelerate import notebook_launcher
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,
        record,
    )

    with tempfile.TemporaryDirectory() as folder:
        results_path = Path(folder) / "results.json"
        # Objects left over from an earlier launch (a failed one leaves its rendezvous
        # store in a reference cycle) must be freed here, not in a worker (see
        # _frozen_at_fork).
        gc.collect()
        failure = None
        watchdog = Watchdog(timeout_s, results_path, num_processes)
        try:
            with _one_thread_per_process(), _quiet_launcher_logs(), watchdog, \
                    _frozen_at_fork(), _bitsandbytes_out_of_sight(), \
                    _launched_as_the_workers_run(num_processes):
                notebook_launcher(record(_forked_worker),
                                  args=(worker, tuple(worker_args), str(results_path)),
                                  num_processes=num_processes, use_port=str(port))
        except ChildFailedError as error:
            if watchdog.fired:
                failure = WorkerTimeoutError(
                    timeout_s, read_per_process(stack_path, results_path, num_processes)
                )
            else:
                failure = WorkerFailedError(
                    error, read_per_process(traceback_path, results_path, num_processes)
                )
        # no gc.collect() here (0.3 s in a kernel): the next launch's frees what this
        # one left, before its fork
        if failure is not None:
            # outside the except block: it does not keep the launcher's frames alive
            raise failure
        return json.loads(results_path.read_text())["result"]



@contextlib.contextmanager
def _environment(name, value):
    """``os.environ[name] = value`` while the block runs (the forked workers inherit
    it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def collective_timeout_s():
    """The seconds a collective may wait in this launch's workers."""
    return float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S))


def _preload_training_modules():
    """Import the model's and the data's code now, once (seconds), before the fork:
    each worker then shares it instead of importing DistilBERT's modeling code, datasets
    and the tokenizer classes again (and torch._dynamo, which AdamW's first step
    imports)."""
    import datasets  # noqa: F401
    import torch._dynamo  # noqa: F401
    import transformers.models.distilbert.modeling_distilbert  # noqa: F401
    from transformers import AutoTokenizer, DataCollatorWithPadding  # noqa: F401


def worker_accelerator(**kwargs):
    """The Accelerator a worker process trains with: one GPU per process when there are
    enough, else the CPU.

    Without ``cpu=True`` on a machine with no GPU, each process would decide it runs
    alone. With fewer GPUs than processes, two processes would share a GPU, which NCCL
    refuses: they use the CPU (gloo).
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=collective_timeout_s()))
    # set by notebook_launcher, torchrun, accelerate launch
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    return Accelerator(cpu=not workers_use_gpus(processes), kwargs_handlers=[timeout],
                       **kwargs)


def workers_use_gpus(num_processes):
    """Whether ``num_processes`` workers get one GPU each: only when there are at least
    as many GPUs.

    ``torch.cuda.device_count`` asks NVML and does not initialise CUDA, so a process may
    still fork after it.
    """
    return torch.cuda.device_count() >= num_processes


@contextlib.contextmanager
def _launched_as_the_workers_run(num_processes):
    """Workers that will run on the CPU are launched as a CPU build of torch launches
    them.

    Accelerate's notebook_launcher picks the launch and its message ("Launching training
    on 2 CUDAs.") from the device the torch *build* supports, GPU or not
    (accelerate/utils/environment.py, get_current_device_type). The package index's
    torch for Linux is a CUDA build, so on a machine without a GPU it said "2 CUDAs"
    while ``worker_accelerator`` put both processes on the CPU. Here it is told the
    truth: ("cpu", "NO"), what a CPU build of torch reports, so both builds launch the
    same way and say "2 CPUs". With a GPU for each worker, nothing changes.
    """
    if workers_use_gpus(num_processes):
        yield
        return
    import accelerate.launchers

    with mock.patch.object(accelerate.launchers, "get_current_device_type",
                           lambda: ("cpu", "NO")):
        yield


def _forked_worker(worker, worker_args, results_path):
    """What each forked process runs: undo what it inherited from the notebook's
    process, then ``worker``."""
    os.environ[FORKED_WORKER_ENV] = "1"
    fresh_progress_bar_locks()
    rank = int(os.environ.get("RANK", "0"))
    # On SIGUSR1 (sent by the watchdog) write where every thread is, for
    # WorkerTimeoutError and the watchdog's notice.
    stack_file = open(stack_path(results_path, rank), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    torch.set_num_threads(1)
    accelerator = worker_accelerator()
    try:
        result = worker(accelerator, *worker_args)
        if accelerator.is_main_process:
            Path(results_path).write_text(json.dumps({"result": result}))
    except Exception:
        # Written before this process closes its connections, so before its peers fail
        # in turn.
        failure = traceback.format_exc()
        traceback_path(results_path, accelerator.process_index).write_text(failure)
        if is_peer_failure(failure):
            # Failing only because a peer did: the SIGTERM torch sends next ends this
            # process quietly. Its own handler would raise SignalException wherever the
            # process then is (under load, in torch's error-file writing), and
            # multiprocessing would print that second traceback in the notebook.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise
    # Wait for every process, then end without destroying the process group: destroying
    # a gloo group joins its worker thread while holding the GIL, and that thread may
    # still be freeing a finished collective's tensors, which needs the GIL (a deadlock
    # seen about once in ten launches).
    accelerator.wait_for_everyone()


def reset_accelerate_state():
    """Forget an Accelerator (or Trainer) made in this kernel: forked workers must not
    inherit it.

    Accelerate's notebook_launcher refuses to start while one exists.
    """
    from accelerate.state import AcceleratorState, GradientState, PartialState

    if AcceleratorState._shared_state or PartialState._shared_state:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def traceback_path(results_path, rank):
    """Where the worker of process ``rank`` writes its traceback when it raises."""
    return Path(results_path).with_name(f"traceback-process-{rank}.txt")


def stack_path(results_path, rank):
    """Where the worker of process ``rank`` writes its threads' stacks when the watchdog
    stops it."""
    return Path(results_path).with_name(f"stack-process-{rank}.txt")


def read_per_process(path_of, results_path, num_processes):
    """{rank: text} of the per-process files (tracebacks or stacks) that the workers
    wrote."""
    paths = {rank: path_of(results_path, rank) for rank in range(num_processes)}
    return {rank: path.read_text() for rank, path in paths.items()
            if path.exists() and path.stat().st_size}


def fresh_progress_bar_locks():
    """Give tqdm (datasets' progress bars) locks of this process only.

    Inherited through fork, tqdm's lock is a semaphore shared with the notebook's
    process and with the other workers, plus a thread lock copied in whatever state
    another thread held it: a worker killed while holding it, or a copy taken mid-use,
    blocks every later progress bar, in every process.
    """
    from tqdm import std

    classes = [std.tqdm]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if "_lock" in vars(cls) and cls is not std.tqdm:
            delattr(cls, "_lock")
    std.tqdm.set_lock(threading.RLock())


def default_port():
    """``$MASTER_PORT`` if set, else None: a port free now (PyTorch's usual 29500 is
    where every other launch on the machine meets too)."""
    value = os.environ.get("MASTER_PORT")
    if value is None:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError("MASTER_PORT must be a TCP port number (1-65535), "
                         f"got {value!r}; "
                         "unset it to use a free port, or pass port= to choose one")
    return int(value)


def free_port():
    """A TCP port that nothing listens on now, for the processes to meet at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_busy(port):
    """Whether something already listens on ``port`` of the loopback interface."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", int(port))) == 0


def require_loopback():
    """The processes meet on 127.0.0.1: fail now, clearly, rather than wait for a
    rendezvous that cannot happen."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            socket.create_connection(server.getsockname(), timeout=2).close()
    except OSError as error:
        raise RuntimeError(
            "the worker processes talk over the loopback interface (127.0.0.1), "
            "which does not answer here "
            f"({error}). In a network namespace made with `unshare -n`, bring it up "
            "first: ip link set lo up") from None


@contextlib.contextmanager
def _one_thread_per_process():
    """OMP_NUM_THREADS=1 for the workers, unless set (Accelerate would otherwise set it,
    with a warning)."""
    from accelerate.utils import patch_environment

    with patch_environment(omp_num_threads=os.environ.get("OMP_NUM_THREADS", "1")):
        yield


@contextlib.contextmanager
def _quiet_launcher_logs():
    """Torch elastic logs a failed worker's traceback with pids and times; we raise it
    ourselves."""
    loggers = [logging.getLogger(name)
               for name in ("torch.distributed.elastic", "torch.multiprocessing")]
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
        # the child inherits these objects as permanent: its collector never frees them
        gc.freeze()


def _unfreeze_in_parent():
    if _freeze_at_fork:
        gc.unfreeze()


@contextlib.contextmanager
def _bitsandbytes_out_of_sight():
    """Let a launch go ahead in a process that imported bitsandbytes (lesson 04), unless
    CUDA is initialized.

    Accelerate's notebook_launcher refuses to fork once ``bitsandbytes`` is in
    ``sys.modules`` (accelerate/launchers.py:176-185), because on a GPU its import can
    initialize CUDA, which a forked process cannot use. What matters is CUDA itself:
    when it is not initialized, the fork is safe, and the module is hidden from that
    check only, for the length of the launch.
    """
    hidden = {}
    if not torch.cuda.is_initialized():
        hidden = {name: sys.modules.pop(name) for name in list(sys.modules)
                  if name == "bitsandbytes" or name.startswith("bitsandbytes.")}
    try:
        yield
    finally:
        sys.modules.update(hidden)


@contextlib.contextmanager
def _frozen_at_fork():
    """While active, a worker's garbage collector never frees objects it inherited from
    this process.

    The launcher makes objects (its rendezvous store among them) between our
    gc.collect() and the fork; freed in a worker, a store's destructor waits for a
    thread that only exists here, and the worker hangs in its own rendezvous.
    gc.freeze() before the fork is what Python's gc docs advise.
    """
    global _freeze_at_fork
    if not getattr(_frozen_at_fork, "registered", False):
        os.register_at_fork(
            before=_freeze_before_fork, after_in_parent=_unfreeze_in_parent
        )
        _frozen_at_fork.registered = True
    _freeze_at_fork = True
    try:
        yield
    finally:
        _freeze_at_fork = False


class Watchdog:
    """Follows the worker processes forked while it is active: says in the notebook when
    one has used no CPU for ``NOTICE_S`` seconds (it waits: for a peer, or for nothing),
    stops them all once one has failed, and after ``timeout_s``."""

    def __init__(self, timeout_s, results_path, num_processes):
        import psutil

        self.timeout_s, self.fired, self.told = timeout_s, False, False
        self.results_path, self.num_processes = results_path, num_processes
        self.me, self.done = psutil.Process(), threading.Event()
        self.busy = {}  # pid -> (its CPU seconds, when they last grew)
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def __enter__(self):
        # e.g. a notebook's other processes: not ours
        self.before = {p.pid for p in self.me.children()}
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    def workers(self):
        return [p for p in self.me.children() if p.pid not in self.before]

    def watch(self):
        failed_at = None
        while not self.done.wait(0.25):
            now = time.monotonic()
            if now - self.started > self.timeout_s:
                return self.stop_workers(timed_out=True)
            if read_per_process(traceback_path, self.results_path, self.num_processes):
                failed_at = failed_at or now
                if now - failed_at > 2:  # its traceback is written: stop the others
                    self.stop_workers(timed_out=False)
                    failed_at = float("inf")
            elif not self.told:
                # advice only: nothing in it may keep the watchdog from stopping a hang
                with contextlib.suppress(Exception):
                    self.tell_if_waiting(now)

    def tell_if_waiting(self, now):
        """Once a worker has used no CPU for NOTICE_S seconds: say so, and where each
        worker is (its stack, asked for with SIGUSR1)."""
        import psutil

        waiting = []
        for process in self.workers():
            with contextlib.suppress(psutil.Error):
                cpu = sum(process.cpu_times()[:2])
                last, since = self.busy.get(process.pid, (-1.0, now))
                if cpu > last + 0.01:
                    last, since = self.busy[process.pid] = cpu, now
                waiting += [process] if now - since > NOTICE_S else []
        if not waiting:
            return
        self.told = True
        # SIGUSR1 ends a process that has not yet registered faulthandler for it
        if all(stack_path(self.results_path, rank).exists()
               for rank in range(self.num_processes)):
            for process in self.workers():
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
        stacks = read_per_process(stack_path, self.results_path, self.num_processes)
        lines = [f"Still running after {now - self.started:.0f} s: "
                 f"{len(waiting)} of the {self.num_processes} worker processes used no "
                 f"CPU for {NOTICE_S} s: they wait. Where each process is:"]
        lines += [f"process {rank}: {innermost_frame(stack)}"
                  for rank, stack in sorted(stacks.items())]
        lines.append("A process that never issues a collective the others wait in "
                     "(one under `if accelerator.is_main_process:`) looks like this; "
                     f"the others give up after {collective_timeout_s():.0f} s, and "
                     f"the launch is stopped after {self.timeout_s} s.")
        print("\n".join(lines), file=sys.stderr, flush=True)

    def stop_workers(self, timed_out):
        """Ask each worker for its threads' stacks (see _forked_worker), then kill
        it."""
        import psutil

        workers = self.workers()
        self.fired = self.fired or timed_out
        for process in workers:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        for process in workers:
            with contextlib.suppress(psutil.Error):
                process.kill()


def innermost_frame(stack):
    """Where a faulthandler dump's main thread is: its innermost line of code outside
    Python's library, the installed packages and this module (file, line, function,
    code)."""
    threads = re.split(r"\n(?=Thread 0x|Current thread 0x)", stack)
    main = next((thread for thread in threads if "_forked_worker" in thread), "")
    frames = [line.strip() for line in main.splitlines()
              if line.strip().startswith("File ")]
    skipped = (f'"{__file__}"', f'"{os.path.dirname(os.__file__)}', "site-packages")
    ours = [frame for frame in frames if not any(s in frame for s in skipped)]
    if not (ours or frames):
        return "not known"
    file, line, function = re.match(r'File "(.*)", line (\d+) in (.*)',
                                    (ours or frames)[0]).groups()
    shown = os.path.relpath(file) if file.startswith(os.getcwd()) else file
    code = linecache.getline(file, int(line)).strip()
    return f"{shown}, line {line} in {function}" + (f": {code}" if code else "")


class WorkerTimeoutError(RuntimeError):
    """The worker processes ran past the time limit and were stopped; the message says
    where they were."""

    def __init__(self, timeout_s, stacks):
        where = "\n".join(
            f"process {rank}:\n{text.strip()}" for rank, text in sorted(stacks.items())
        )
        super().__init__(f"the worker processes were still running after {timeout_s} "
                         "s and were stopped. "
                         "A process waiting for a collective that another never "
                         f"joins looks like this.\n{where}")
        self.stacks = stacks


def is_peer_failure(traceback_text):
    """Whether a worker failed only because a peer did: the peer process vanished
    (gloo's 'closed/reset by peer'), or torch stopped this worker with SIGTERM once the
    peer had failed (its SignalException, raised wherever this worker then was)."""
    return any(sign in traceback_text
               for sign in ("by peer", "gloo/transport", "SignalException"))


class WorkerFailedError(RuntimeError):
    """A worker process raised: its traceback, as the worker wrote it."""

    def __init__(self, child_failed_error, tracebacks):
        # as the launcher recorded them
        for rank, failure in child_failed_error.failures.items():
            message = failure.message
            if isinstance(message, dict):
                message = message.get("extraInfo", {}).get(
                    "py_callstack"
                ) or message.get("message", "")
            tracebacks.setdefault(rank, str(message))
        # A worker whose peer vanished fails too, inside gloo ("Connection closed by
        # peer", "Read error ... reset by peer"), or when torch stops it with SIGTERM:
        # report the worker that failed for its own reason.
        rank = min(tracebacks, key=lambda r: (is_peer_failure(tracebacks[r]), r))
        super().__init__(f"worker process {rank} failed:\n{tracebacks[rank]}")
        self.worker_traceback = tracebacks[rank]
