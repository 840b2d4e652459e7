"""The launcher's workarounds that tests/test_launcher.py does not reach: each test
here fails when its workaround is taken out (helpers/launcher_fork.py,
helpers/launcher.py)."""
import gc
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import launcher_fork
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes

NOTEBOOK_PROCESS = os.getpid()


def _in_torchs_error_file_writing():
    """Whether the caller, the traceback module aside, is ``_wrap`` in
    torch/multiprocessing/spawn.py, which writes a failed worker's error file."""
    frame = sys._getframe(2)
    while frame and frame.f_code.co_filename.endswith("traceback.py"):
        frame = frame.f_back
    return bool(frame) and frame.f_code.co_filename.endswith(
        os.path.join("multiprocessing", "spawn.py"))


class SlowToName(type):
    """The exception's module takes seconds to read in torch's error-file writing: the
    window in which, in a loaded CI run, torch's SIGTERM reached a worker that had
    failed because of its peer. (Not its text: the traceback module catches whatever
    ``str()`` raises; the module of the exception's class it reads without a guard.)"""

    @property
    def __module__(cls):
        if _in_torchs_error_file_writing():
            time.sleep(10)  # torch's SIGTERM comes within a second or two
        return __name__


class PeerVanishedError(RuntimeError, metaclass=SlowToName):
    """gloo's error when a peer process vanished."""

    def __str__(self):
        return ("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                "[127.0.0.1]:28843.")


def fails_after_its_peer_while_process_0_writes_its_error(accelerator):
    if accelerator.process_index == 1:
        time.sleep(1)  # once process 0 is in torch's error-file writing
        raise RuntimeError("injected failure on process 1")
    raise PeerVanishedError()


def test_a_failed_launch_shows_the_workers_traceback_once(capfd, caplog):
    # launcher_fork.end_quietly_on_sigterm: without it, torch's SignalException escapes
    # from its own error-file writing in process 0, and multiprocessing prints it in the
    # notebook. launcher._quiet_launcher_logs: without it, torch elastic logs process
    # 1's traceback again, with pids and times.
    with caplog.at_level(logging.DEBUG), pytest.raises(
            WorkerFailedError, match="^worker process 1 failed"):
        run_in_processes(fails_after_its_peer_while_process_0_writes_its_error, (),
                         preload=False, timeout_s=60)
    printed = capfd.readouterr().err
    assert "SignalException" not in printed, printed
    assert "Traceback" not in printed, printed
    assert not [record for record in caplog.records
                if record.levelno >= logging.ERROR], caplog.text


class WaitsForTheNotebooksThread:
    """Unreachable as soon as made (it refers to itself: only the collector frees it);
    its destructor waits, in a worker, for what only the notebook's process has, as the
    destructor of torch's rendezvous store waits for its thread."""

    def __init__(self):
        self.cycle = self

    def __del__(self):
        if os.getpid() != NOTEBOOK_PROCESS:
            time.sleep(3600)


_garbage_at_fork = False


def _garbage_before_fork():
    if _garbage_at_fork:
        WaitsForTheNotebooksThread()  # made after the launcher's gc.collect()


def collects_garbage_and_counts_threads(accelerator, destroyed_marker):
    import torch

    destroy = torch.distributed.destroy_process_group

    def noted(*args, **kwargs):  # in this worker process only
        Path(destroyed_marker).write_text("destroyed")
        return destroy(*args, **kwargs)

    torch.distributed.destroy_process_group = noted
    gc.collect()
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


@pytest.fixture(scope="module")
def launched_where_each_workaround_is_needed():
    """One launch, checked several ways below, made where each of these workarounds is
    needed: an object made before the fork whose destructor hangs in a worker,
    OMP_NUM_THREADS unset, and something listening on the port asked for, with the
    retry after a failed launch switched off. {"result": process 0's, or the timeout
    error; "destroyed": whether a worker destroyed its process group}."""
    import socket

    from helpers import launcher

    global _garbage_at_fork
    if not getattr(_garbage_before_fork, "registered", False):
        with launcher_fork.frozen_at_fork():
            pass  # the launcher's hook registered first: it runs after this one
        os.register_at_fork(before=_garbage_before_fork)
        _garbage_before_fork.registered = True
    with pytest.MonkeyPatch.context() as patch, socket.socket() as taken, \
            tempfile.TemporaryDirectory() as folder:
        marker = Path(folder) / "destroyed"
        patch.delenv("OMP_NUM_THREADS", raising=False)
        patch.setattr(launcher, "is_port_taken", lambda error: False)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        _garbage_at_fork = True
        try:
            result = run_in_processes(collects_garbage_and_counts_threads,
                                      (str(marker),), preload=False,
                                      port=taken.getsockname()[1], timeout_s=20)
        except WorkerTimeoutError as error:
            result = error
        finally:
            _garbage_at_fork = False
        return {"result": result, "destroyed": marker.exists()}


def test_objects_made_before_the_fork_are_never_freed_in_a_worker(
        launched_where_each_workaround_is_needed):
    # launcher_fork.frozen_at_fork: without gc.freeze() at the fork, the worker's
    # collector frees the object and the worker hangs in its destructor until stopped
    result = launched_where_each_workaround_is_needed["result"]
    assert not isinstance(result, Exception), (
        f"a worker hung freeing an inherited object:\n{result}")


def test_workers_get_one_thread_each_without_accelerates_warning(
        launched_where_each_workaround_is_needed):
    # launcher._one_thread_per_process: with OMP_NUM_THREADS unset in a worker,
    # Accelerate sets the threads itself and warns in every worker (accelerate/state.py,
    # "OMP_NUM_THREADS/MKL_NUM_THREADS unset"), a new stderr warning in the notebook.
    # (Under pytest, a forked worker's warnings go to pytest's record, not to stderr:
    # the test reads the variable the warning depends on.)
    assert launched_where_each_workaround_is_needed["result"] == [1, "1"]


def test_a_port_something_listens_on_is_replaced_before_the_launch(
        launched_where_each_workaround_is_needed):
    # launcher_ports.port_is_busy, without the retry after a failed launch (switched
    # off here): a port taken now is replaced before the processes try it
    # (without it the launch fails with "EADDRINUSE", and the fixture raises that)
    assert isinstance(launched_where_each_workaround_is_needed["result"], list)


def test_a_worker_ends_without_destroying_its_process_group(
        launched_where_each_workaround_is_needed):
    # launcher._forked_worker ends with wait_for_everyone(), not a destroy: destroying
    # a gloo group joins its thread while holding the GIL, and a deadlock was seen about
    # once in ten launches (it cannot be made to happen on demand: this test keeps the
    # destroy from coming back)
    assert not launched_where_each_workaround_is_needed["destroyed"]
