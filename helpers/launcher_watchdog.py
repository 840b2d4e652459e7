"""The watchdog of lesson 03's launcher: no launch waits without a word (one room of
``helpers.launcher``).

It follows the worker processes from a thread of the notebook's process. When some have
used no CPU for ``NOTICE_S`` seconds (they wait: for a peer, or for nothing), it says so
in the notebook at once, with where each process is. When one has failed, it stops the
others within seconds: torch gives each 30 s to answer its SIGTERM, which a process
blocked in a collective never does (with the collective's 60 s timeout, a launch waited
a minute and a half without a word;
``test_a_failed_worker_stops_a_peer_stuck_in_c_within_seconds``). Workers still running
after the launch's ``timeout_s`` are stopped, and say where they were
(``test_workers_that_never_finish_are_stopped_and_say_where_they_were``).
"""
import contextlib
import linecache
import os
import re
import signal
import sys
import threading
import time

from helpers.launcher_failures import read_per_process, stack_path, traceback_path

# a process waiting this long for another is news (processes start within a second of
# each other even on a loaded machine: 0.3 s at most in 150 launches)
NOTICE_S = 10
# once a worker's traceback is written, the others get this long to fail in turn
STOP_AFTER_FAILURE_S = 2
# this module and the launcher's other rooms: never where a worker "is"
_LAUNCHER_FILES = os.path.join(os.path.dirname(__file__), "launcher")


class Watchdog:
    """Follows the worker processes forked while it is active: says in the notebook when
    one has used no CPU for ``NOTICE_S`` seconds (it waits: for a peer, or for nothing),
    stops them all once one has failed, and after ``timeout_s``."""

    def __init__(self, timeout_s, results_path, num_processes, collective_timeout_s):
        import psutil

        self.timeout_s, self.fired, self.told = timeout_s, False, False
        self.results_path, self.num_processes = results_path, num_processes
        self.collective_timeout_s = collective_timeout_s
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
                if now - failed_at > STOP_AFTER_FAILURE_S:  # the others: stop them
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
                     f"the others give up after {self.collective_timeout_s:.0f} s, and "
                     f"the launch is stopped after {self.timeout_s} s.")
        print("\n".join(lines), file=sys.stderr, flush=True)

    def stop_workers(self, timed_out):
        """Ask each worker for its threads' stacks (see the launcher's
        ``_forked_worker``), then kill it: SIGKILL, which a process blocked in C cannot
        ignore, as it does torch's SIGTERM."""
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
    Python's library, the installed packages and the launcher's modules (file, line,
    function, code)."""
    threads = re.split(r"\n(?=Thread 0x|Current thread 0x)", stack)
    main = next((thread for thread in threads if "_forked_worker" in thread), "")
    frames = [line.strip() for line in main.splitlines()
              if line.strip().startswith("File ")]
    skipped = (f'"{_LAUNCHER_FILES}', f'"{os.path.dirname(os.__file__)}',
               "site-packages")
    ours = [frame for frame in frames if not any(s in frame for s in skipped)]
    if not (ours or frames):
        return "not known"
    file, line, function = re.match(r'File "(.*)", line (\d+) in (.*)',
                                    (ours or frames)[0]).groups()
    shown = os.path.relpath(file) if file.startswith(os.getcwd()) else file
    code = linecache.getline(file, int(line)).strip()
    return f"{shown}, line {line} in {function}" + (f": {code}" if code else "")
