"""How a failed launch of lesson 03's launcher is reported in the notebook: each
worker's own traceback, the worker that failed first, and where stopped workers were
(one room of ``helpers.launcher``).

A worker that raises writes its traceback to a file of the launch's folder before it
closes its connections (``traceback_path``); a worker the watchdog stops writes its
threads' stacks (``stack_path``). ``WorkerFailedError`` reports the worker that failed
for its own reason, not a peer that failed because of it (``is_peer_failure``).
"""
from pathlib import Path


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


# What a worker's traceback holds when it failed only because a peer did.
PEER_FAILURE_SIGNS = (
    # gloo, when the peer process vanished: "Connection closed by peer", "Read error
    # ... Connection reset by peer" (test_the_root_cause_is_reported_not_the_peer_...)
    "by peer", "gloo/transport",
    # torch's SIGTERM handler, raised wherever this worker was once its peer failed: a
    # CI run of practice 6.3 showed "SignalException: Process 4866 got signal: 15"
    # instead of the learner's ValueError (test_a_peer_that_torch_stops_after_...)
    "SignalException",
)


def is_peer_failure(traceback_text):
    """Whether a worker failed only because a peer did: the peer process vanished
    (gloo's 'closed/reset by peer'), or torch stopped this worker with SIGTERM once the
    peer had failed (its SignalException, raised wherever this worker then was)."""
    return any(sign in traceback_text for sign in PEER_FAILURE_SIGNS)


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
