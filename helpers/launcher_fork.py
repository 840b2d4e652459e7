"""Fork hygiene for lesson 03's launcher: what a forked worker inherits from the
notebook's process must not block it, and what the notebook's process holds must not
stop the fork (one room of ``helpers.launcher``; the Accelerator an earlier cell made is
forgotten there, ``reset_accelerate_state``, which lesson 05 calls too).

Each workaround below names the failure it prevents and the test that fails without it
(tests/test_launcher.py; tests/test_launcher_workarounds.py).
"""
import contextlib
import gc
import os
import signal
import sys
import threading

import torch


def fresh_progress_bar_locks():
    """Give tqdm (datasets' progress bars) locks of this process only (called in each
    worker).

    Inherited through fork, tqdm's lock is a semaphore shared with the notebook's
    process and with the other workers, plus a thread lock copied in whatever state
    another thread held it: a worker killed while holding it, or a copy taken mid-use,
    blocks every later progress bar, in every process
    (``test_a_progress_bar_in_a_worker_does_not_wait_for_the_notebooks_tqdm_lock``).
    """
    from tqdm import std

    classes = [std.tqdm]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if "_lock" in vars(cls) and cls is not std.tqdm:
            delattr(cls, "_lock")
    std.tqdm.set_lock(threading.RLock())


def end_quietly_on_sigterm():
    """Let torch's coming SIGTERM end this worker without a word (called in a worker
    that failed only because a peer did).

    torch's elastic agent registers a handler that raises ``SignalException``
    (torch/distributed/elastic/multiprocessing/api.py, ``_terminate_process_handler``),
    and the forked workers inherit it. Raised wherever the worker then is (under load,
    in torch's error-file writing, ``_wrap`` in torch/multiprocessing/spawn.py), it
    escaped, and multiprocessing printed that second traceback in the notebook
    (``test_a_worker_that_failed_because_of_a_peer_ends_without_a_second_traceback``).
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def bitsandbytes_out_of_sight():
    """Let a launch go ahead in a process that imported bitsandbytes (lesson 04), unless
    CUDA is initialized.

    Accelerate's notebook_launcher refuses to fork once ``bitsandbytes`` is in
    ``sys.modules`` (accelerate/launchers.py:176-185), because on a GPU its import can
    initialize CUDA, which a forked process cannot use. What matters is CUDA itself:
    when it is not initialized, the fork is safe, and the module is hidden from that
    check only, for the length of the launch
    (``test_bitsandbytes_imported_before_does_not_stop_the_launch_and_stays_imported``).
    """
    hidden = {}
    if not torch.cuda.is_initialized():
        hidden = {name: sys.modules.pop(name) for name in list(sys.modules)
                  if name == "bitsandbytes" or name.startswith("bitsandbytes.")}
    try:
        yield
    finally:
        sys.modules.update(hidden)


_freeze_at_fork = False


def _freeze_before_fork():
    if _freeze_at_fork:
        # the child inherits these objects as permanent: its collector never frees them
        gc.freeze()


def _unfreeze_in_parent():
    if _freeze_at_fork:
        gc.unfreeze()


@contextlib.contextmanager
def frozen_at_fork():
    """While active, a worker's garbage collector never frees objects it inherited from
    this process.

    The launcher makes objects (its rendezvous store among them) between its
    gc.collect() and the fork; freed in a worker, a store's destructor waits for a
    thread that only exists here, and the worker hangs in its own rendezvous (a failed
    launch leaves its store in a reference cycle).
    gc.freeze() before the fork is what Python's gc docs advise
    (``test_objects_made_before_the_fork_are_never_freed_in_a_worker``).
    """
    global _freeze_at_fork
    if not getattr(frozen_at_fork, "registered", False):
        os.register_at_fork(
            before=_freeze_before_fork, after_in_parent=_unfreeze_in_parent
        )
        frozen_at_fork.registered = True
    _freeze_at_fork = True
    try:
        yield
    finally:
        _freeze_at_fork = False
