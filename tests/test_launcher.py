"""The notebook launcher of lesson 03 (helpers/launcher.py and its rooms,
helpers/launcher_*.py): real processes, and every way a launch can go wrong.

Fork hygiene's workarounds that no test here covers are tested in
tests/test_launcher_workarounds.py."""
import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import launcher, launcher_ports, launcher_watchdog
from helpers.launcher import WorkerFailedError, WorkerTimeoutError, run_in_processes


def reports_who_it_is(accelerator, greeting):
    """A worker that makes a progress bar, then says which process it is and how it was
    set up."""
    import torch
    from tqdm import tqdm

    # creating a bar takes tqdm's lock, even when it shows nothing
    for _ in tqdm(range(3), disable=True):
        pass
    return {"greeting": greeting, "processes": accelerator.num_processes,
            "device": accelerator.device.type, "threads": torch.get_num_threads(),
            "progress bar": "ok"}


def fails_on_process_1(accelerator):
    """Fault injection, for the tests only: process 1 raises at once, process 0 waits
    for it in a collective."""
    if accelerator.process_index == 1:
        raise RuntimeError("injected failure on process 1")
    accelerator.wait_for_everyone()


def sleeps_forever(accelerator):
    time.sleep(3600)


def stuck_in_c():
    """Block in C for good (a mutex locked twice): a Python SIGTERM handler never runs,
    so only SIGKILL ends the process."""
    import ctypes

    libc, mutex = ctypes.CDLL("libc.so.6"), ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


def fails_on_process_1_while_process_0_is_stuck(accelerator):
    if accelerator.process_index == 1:
        time.sleep(1)
        raise RuntimeError("injected failure on process 1")
    stuck_in_c()


def fails_on_process_1_while_process_0_runs_python(accelerator):
    if accelerator.process_index == 1:
        raise RuntimeError("injected failure on process 1")
    time.sleep(30)  # in Python, not in a collective: torch's SIGTERM raises here


def process_1_arrives_late(accelerator):
    if accelerator.process_index == 1:
        time.sleep(4)
    accelerator.wait_for_everyone()
    return "all there"


@pytest.fixture(scope="module")
def launched_despite_everything():
    """One launch, checked several ways below, made under all that once broke a launch
    from a notebook: an Accelerator already made in this process (as a Trainer in the
    same kernel would), bitsandbytes imported (as lesson 04's checks do in the same test
    process), something else listening on the port asked for, and tqdm's lock held (as
    its monitor thread holds it now and then; fork shares that semaphore with the
    workers, which must get locks of their own).
    """
    import socket

    from accelerate import Accelerator
    from tqdm import tqdm

    Accelerator(cpu=True)
    bitsandbytes_imported = "bitsandbytes" in sys.modules or bool(
        importlib.util.find_spec("bitsandbytes")
    )
    if bitsandbytes_imported:
        import bitsandbytes  # noqa: F401  (lesson 04's checks import it; Accelerate then refuses to fork)
    with socket.socket() as blocker, tqdm.get_lock():
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy_port = blocker.getsockname()[1]
        port_was_busy = launcher.port_is_busy(busy_port)
        result = run_in_processes(
            reports_who_it_is, ("hello",), num_processes=2, port=busy_port, timeout_s=60
        )
    return {"result": result, "port was busy": port_was_busy,
            "bitsandbytes imported": bitsandbytes_imported,
            "bitsandbytes still imported": "bitsandbytes" in sys.modules}


def test_a_worker_runs_on_two_processes_and_process_0_returns_its_result(
        launched_despite_everything):
    # one GPU per process, or the CPU
    expected_device = "cuda" if torch.cuda.device_count() >= 2 else "cpu"
    assert launched_despite_everything["result"] == {
        "greeting": "hello", "processes": 2, "device": expected_device,
        "threads": 1, "progress bar": "ok"}


def test_bitsandbytes_imported_before_does_not_stop_the_launch_and_stays_imported(
    launched_despite_everything,
):
    assert launched_despite_everything["bitsandbytes imported"], ("bitsandbytes is "
                                                                  "pinned in "
                                                                  "requirements.txt")
    assert launched_despite_everything["bitsandbytes still imported"]


def test_a_failing_worker_reports_its_own_traceback_fast():
    start = time.perf_counter()
    with pytest.raises(WorkerFailedError, match="worker process 1 failed") as caught:
        run_in_processes(fails_on_process_1, ())
    assert "injected failure on process 1" in caught.value.worker_traceback
    assert "Traceback" in caught.value.worker_traceback
    assert time.perf_counter() - start < 60  # not a hang in a collective


def test_a_busy_port_and_an_existing_accelerator_do_not_break_the_launch(
    launched_despite_everything,
):
    assert launched_despite_everything["port was busy"]
    assert launched_despite_everything["result"]["processes"] == 2


@pytest.mark.parametrize("bad", [1, 0, 2.0, True])
def test_fewer_than_two_processes_get_a_clear_error(bad):
    with pytest.raises(ValueError, match="at least 2 processes"):
        run_in_processes(reports_who_it_is, ("x",), num_processes=bad)


@pytest.mark.parametrize("bad", [0, -5, None])
@pytest.mark.parametrize("name", ["timeout_s", "collective_timeout_s"])
def test_a_timeout_that_is_not_positive_gets_a_clear_error(name, bad):
    with pytest.raises(ValueError, match=f"^{name} must be a positive"):
        run_in_processes(reports_who_it_is, ("x",), **{name: bad})


def test_a_failed_worker_stops_a_peer_stuck_in_c_within_seconds():
    # torch gives the peer 30 s to answer its SIGTERM, which it cannot: the bench once
    # waited 90.7 s (the collective's 60 s timeout, then those 30 s) without a word
    start = time.perf_counter()
    with pytest.raises(WorkerFailedError, match="injected failure on process 1"):
        run_in_processes(fails_on_process_1_while_process_0_is_stuck, ())
    assert time.perf_counter() - start < 20


def test_processes_that_wait_for_another_say_so_and_where_it_is(monkeypatch, capsys):
    monkeypatch.setattr(launcher_watchdog, "NOTICE_S", 1)
    assert run_in_processes(process_1_arrives_late, (), preload=False) == "all there"
    notice = capsys.readouterr().err
    assert "used no CPU for 1 s" in notice, notice
    assert "process 1: tests/test_launcher.py, line" in notice, notice
    assert "in process_1_arrives_late: time.sleep(4)" in notice


def test_a_peer_that_torch_stops_after_the_failure_is_not_reported_as_its_cause():
    # Once process 1 has failed, torch stops process 0 with SIGTERM, which raises
    # SignalException in process 0 if it is running Python: a second traceback. A CI run
    # of practice 6.3 once reported that one instead of the learner's error.
    with pytest.raises(WorkerFailedError, match="^worker process 1 failed") as caught:
        run_in_processes(fails_on_process_1_while_process_0_runs_python, (),
                         preload=False)
    assert caught.value.worker_traceback.strip().endswith(
        "injected failure on process 1"
    )


def test_a_port_taken_before_the_processes_listen_on_it_is_replaced(monkeypatch):
    import socket

    # what another notebook's launch does between our look at the port and our listen
    monkeypatch.setattr(launcher, "port_is_busy", lambda port: False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_in_processes(reports_who_it_is, ("hi",), preload=False,
                                  port=taken.getsockname()[1])
    assert result["greeting"] == "hi"


def test_the_port_comes_from_master_port_and_a_bad_one_gets_a_clear_error(monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert launcher.default_port() is None  # a port free at each launch
    monkeypatch.setenv("MASTER_PORT", "29617")
    assert launcher.default_port() == 29617
    for bad in ("", "port", "70000", "0"):
        monkeypatch.setenv("MASTER_PORT", bad)
        with pytest.raises(ValueError, match="MASTER_PORT must be a TCP port number"):
            launcher.default_port()


@pytest.mark.parametrize("peer_error", [
    "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:28843.",
    "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:22960: "
    "Connection reset by peer."])
def test_the_root_cause_is_reported_not_the_peer_that_lost_its_connection(peer_error):
    error = WorkerFailedError(
        SimpleNamespace(failures={}),
        {0: f"Traceback ...\n{peer_error}\n",
         1: "Traceback ...\nValueError: bad batch\n"},
    )
    assert str(error).startswith("worker process 1 failed")
    assert error.worker_traceback.endswith("ValueError: bad batch\n")


def test_a_dead_loopback_interface_fails_fast_with_the_fix(monkeypatch):
    def unreachable(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(launcher_ports.socket, "create_connection", unreachable)
    with pytest.raises(RuntimeError, match="ip link set lo up"):
        run_in_processes(reports_who_it_is, ("x",))


def test_workers_that_never_finish_are_stopped_and_say_where_they_were():
    start = time.perf_counter()
    with pytest.raises(WorkerTimeoutError) as caught:
        run_in_processes(sleeps_forever, (), timeout_s=5)
    assert time.perf_counter() - start < 60
    assert "sleeps_forever" in str(caught.value) and "process 0" in str(caught.value)


def test_a_progress_bar_in_a_worker_does_not_wait_for_the_notebooks_tqdm_lock(
    launched_despite_everything,
):
    assert launched_despite_everything["result"]["progress bar"] == "ok"


def test_a_result_that_is_not_json_is_reported_as_the_workers_error():
    with pytest.raises(WorkerFailedError, match="not JSON serializable"):
        run_in_processes(lambda accelerator: {"path": Path(".")}, ())


def says_where_it_runs(accelerator):
    return accelerator.device.type


# What Accelerate's notebook_launcher is told the device is: the torch build's
# accelerator, GPU or not.
CPU_BUILD = torch.accelerator.current_accelerator() is None


@pytest.mark.skipif(torch.cuda.device_count() >= 2,
                    reason="with a GPU for each process, the workers use GPUs")
@pytest.mark.parametrize("build_reports", [("cuda", "MULTI_GPU"), ("cpu", "NO")],
                         ids=["CUDA build", "CPU build"])
def test_the_launch_message_names_the_device_the_workers_use(build_reports, monkeypatch,
                                                            capsys):
    import accelerate.launchers

    # what get_current_device_type says on a CUDA build with no GPU, and on a CPU build
    monkeypatch.setattr(accelerate.launchers, "get_current_device_type",
                        lambda: build_reports)
    assert run_in_processes(says_where_it_runs, num_processes=2, preload=False,
                            timeout_s=60) == "cpu"
    assert capsys.readouterr().out.splitlines() == ["Launching training on 2 CPUs."]
    # put back after the launch
    assert accelerate.launchers.get_current_device_type() == build_reports


@pytest.mark.parametrize("build", [
    pytest.param("cuda",
                 marks=pytest.mark.skipif(CPU_BUILD, reason="a CPU build of torch")),
    pytest.param("cpu", marks=pytest.mark.skipif(
        not CPU_BUILD, reason="a torch build with an accelerator backend"))])
def test_accelerate_names_the_builds_device_not_a_visible_one(build, monkeypatch):
    """Why the launcher corrects Accelerate: a CUDA build says "cuda" even where no GPU
    is visible."""
    from accelerate.utils.environment import get_current_device_type

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert get_current_device_type()[0] == build
