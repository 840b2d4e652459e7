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

This module starts the processes and runs the worker protocol; one job each, its other
rooms (their public names are importable from here too):
``launcher_fork`` (fork hygiene), ``launcher_watchdog`` (the watchdog),
``launcher_ports`` (where the processes meet), ``launcher_failures`` (tracebacks and the
error types). Each workaround's reason is beside it, with the test that fails without
it.
"""
import contextlib
import faulthandler
import gc
import json
import logging
import os
import signal
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch

from helpers.launcher_failures import (  # noqa: F401  (public names of the launcher)
    WorkerFailedError,
    WorkerTimeoutError,
    is_peer_failure,
    read_per_process,
    stack_path,
    traceback_path,
)
from helpers.launcher_fork import (  # noqa: F401
    bitsandbytes_out_of_sight,
    end_quietly_on_sigterm,
    fresh_progress_bar_locks,
    frozen_at_fork,
)
from helpers.launcher_ports import (  # noqa: F401
    PORT_ATTEMPTS,
    default_port,
    free_port,
    is_port_taken,
    port_is_busy,
    require_loopback,
)
from helpers.launcher_watchdog import NOTICE_S, Watchdog, innermost_frame  # noqa: F401
from helpers.timing_lock import LAUNCH, held

# far above what any launch of the course takes, so that only a hang reaches it
LAUNCH_TIMEOUT_S = 300
COLLECTIVE_TIMEOUT_S = 60  # no single collective of the course takes more than a second
# run_in_processes(collective_timeout_s=...) tells the forked workers through it
COLLECTIVE_TIMEOUT_ENV = "COURSE_COLLECTIVE_TIMEOUT_S"
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
    require_loopback()  # test_a_dead_loopback_interface_fails_fast_with_the_fix
    reset_accelerate_state()  # launched_despite_everything (an Accelerator made before)
    if preload:
        # once, before the fork: the workers share it instead of each importing it
        _preload_training_modules()
    if port is None:
        port = default_port()
    for attempt in range(PORT_ATTEMPTS):
        # test_a_port_something_listens_on_is_replaced_before_the_launch
        if port is None or port_is_busy(port):
            port = free_port()
        try:
            # under `make test`, no lesson times a step in the other worker meanwhile
            with _environment(COLLECTIVE_TIMEOUT_ENV, str(collective_timeout_s)), \
                    held(LAUNCH):
                return _launch(worker, worker_args, num_processes, port, timeout_s)
        except torch.distributed.DistNetworkError as error:
            if not is_port_taken(error) or attempt == PORT_ATTEMPTS - 1:
                raise
            # taken between our look and the listen: another, free now
            # (test_a_port_taken_before_the_processes_listen_on_it_is_replaced)
            port = None


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
        # launcher_fork.frozen_at_fork).
        gc.collect()
        failure = None
        watchdog = Watchdog(timeout_s, results_path, num_processes,
                            collective_timeout_s())
        try:
            with _one_thread_per_process(), _quiet_launcher_logs(), watchdog, \
                    frozen_at_fork(), bitsandbytes_out_of_sight(), \
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
    refuses: they use the CPU (gloo)
    (``test_a_worker_runs_on_two_processes_and_process_0_returns_its_result``).
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
    same way and say "2 CPUs". With a GPU for each worker, nothing changes
    (``test_the_launch_message_names_the_device_the_workers_use``).
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
            # process quietly, instead of printing a second traceback in the notebook.
            end_quietly_on_sigterm()
        raise
    # Wait for every process, then end without destroying the process group: destroying
    # a gloo group joins its worker thread while holding the GIL, and that thread may
    # still be freeing a finished collective's tensors, which needs the GIL (a deadlock
    # seen about once in ten launches; it cannot be made to happen on demand:
    # test_a_worker_ends_without_destroying_its_process_group keeps the destroy out).
    accelerator.wait_for_everyone()


def reset_accelerate_state():
    """Forget an Accelerator (or Trainer) made in this kernel: forked workers must not
    inherit it.

    Accelerate's notebook_launcher refuses to start while one exists ("the
    `Accelerator` should only be initialized inside your training function",
    accelerate/launchers.py:170-175); ``launched_despite_everything`` in
    tests/test_launcher.py launches after one.
    """
    from accelerate.state import AcceleratorState, GradientState, PartialState

    if AcceleratorState._shared_state or PartialState._shared_state:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


@contextlib.contextmanager
def _one_thread_per_process():
    """OMP_NUM_THREADS=1 for the workers, unless set (Accelerate would otherwise set the
    threads itself, with a warning in every worker, accelerate/state.py:264-279;
    ``test_workers_get_one_thread_each_without_accelerates_warning``)."""
    from accelerate.utils import patch_environment

    with patch_environment(omp_num_threads=os.environ.get("OMP_NUM_THREADS", "1")):
        yield


@contextlib.contextmanager
def _quiet_launcher_logs():
    """Torch elastic logs a failed worker's traceback with pids and times; we raise it
    ourselves (``test_a_failed_launch_shows_the_workers_traceback_once``)."""
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
