"""Lesson 03's Local SGD worker: real processes, counted communication, and its failure modes."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.local_sgd import (RunConfig, WorkerFailedError, WorkerTimeoutError, finish_worker, launch, run_in_processes,
                               train_worker, validate_local_sgd_steps)
from helpers.models import build_model

REPO_ROOT = Path(__file__).resolve().parent.parent
STEPS = 8


@pytest.fixture(scope="module")
def parameter_sizes():
    model = build_model("tiny")
    return len(list(model.parameters())), sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def short_runs():
    return launch([RunConfig("DDP", optimizer_steps=STEPS),
                   RunConfig("k=4", local_sgd_steps=4, optimizer_steps=STEPS)], num_processes=2)


@pytest.mark.parametrize("good", [None, 1, 8])
def test_valid_local_sgd_steps(good):
    validate_local_sgd_steps(good)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                        ("8", TypeError), (True, TypeError)])
def test_invalid_local_sgd_steps_get_a_clear_error(bad, error):
    with pytest.raises(error, match="local_sgd_steps"):
        RunConfig("bad", local_sgd_steps=bad)


def test_two_processes_really_train(short_runs):
    assert short_runs["processes"] == 2
    assert [run["config"]["name"] for run in short_runs["runs"]] == ["DDP", "k=4"]


def test_ddp_all_reduces_the_gradients_once_per_step(short_runs, parameter_sizes):
    _, parameter_bytes = parameter_sizes
    events = short_runs["runs"][0]["events_by_rank"][0]
    all_reduces = [e for e in events if e[2] == "all_reduce"]
    assert len(all_reduces) == STEPS
    for _, _, _, payload in all_reduces:  # one bucket holding every gradient (plus alignment padding)
        assert parameter_bytes <= payload <= parameter_bytes * 1.01


def test_local_sgd_averages_every_parameter_every_k_steps_and_at_exit(short_runs, parameter_sizes):
    tensors, parameter_bytes = parameter_sizes
    run = short_runs["runs"][1]
    syncs = STEPS // 4 + 1  # at steps 4 and 8, and when the LocalSGD block ends
    all_reduces = [e for e in run["events_by_rank"][0] if e[2] == "all_reduce"]
    assert len(all_reduces) == syncs * tensors
    assert sum(e[3] for e in all_reduces) == syncs * parameter_bytes
    assert run["final_gap"] == 0.0


def test_a_failing_worker_reports_its_traceback_fast():
    start = time.perf_counter()
    with pytest.raises(WorkerFailedError, match="worker process 1 failed") as caught:
        launch([RunConfig("fails", fail_on_rank=1, optimizer_steps=4)], num_processes=2)
    assert "injected failure on process 1" in caught.value.worker_traceback
    assert "Traceback" in caught.value.worker_traceback
    assert time.perf_counter() - start < 60  # not a hang in a collective


def test_a_busy_port_and_an_existing_accelerator_do_not_break_the_launch():
    from accelerate import Accelerator

    Accelerator(cpu=True)  # as a Trainer in the same kernel would
    with socket.socket() as blocker:  # something else listens on the port we ask for
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy_port = blocker.getsockname()[1]
        results = launch([RunConfig("DDP", optimizer_steps=2)], num_processes=2, port=busy_port)
    assert results["processes"] == 2


def test_a_single_process_refuses_to_pretend(tmp_path):
    with pytest.raises(RuntimeError, match="silently do nothing"):
        train_worker([RunConfig("DDP", optimizer_steps=2)], str(tmp_path / "results.json"))


def accelerate_launch(flags, tmp_path):
    results = tmp_path / "results.json"
    command = [sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(REPO_ROOT / "helpers" / "local_sgd.py"), "--local-sgd-steps", "4",
               "--optimizer-steps", "8", "--results", str(results)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return completed, results


def test_the_script_form_runs_on_two_processes_with_accelerate_launch(tmp_path):
    completed, results = accelerate_launch(["--multi_gpu"], tmp_path)  # torchrun; gloo on a CPU
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(results.read_text())["processes"] == 2
    assert "Local SGD k=4" in completed.stdout


def test_accelerate_launch_with_cpu_flag_starts_one_process_and_the_worker_refuses(tmp_path):
    # Accelerate 1.x: --cpu takes the single-process launcher (several CPU processes need mpirun).
    completed, _ = accelerate_launch(["--cpu"], tmp_path)
    assert completed.returncode != 0
    assert "silently do nothing" in completed.stderr


@pytest.mark.parametrize("peer_error", [
    "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:28843.",
    "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:22960: Connection reset by peer."])
def test_the_root_cause_is_reported_not_the_peer_that_lost_its_connection(peer_error):
    from types import SimpleNamespace

    error = WorkerFailedError(SimpleNamespace(failures={}),
                              {0: f"Traceback ...\n{peer_error}\n", 1: "Traceback ...\nValueError: bad batch\n"})
    assert str(error).startswith("worker process 1 failed")
    assert error.worker_traceback.endswith("ValueError: bad batch\n")


def test_a_dead_loopback_interface_fails_fast_with_the_fix(monkeypatch):
    import helpers.local_sgd as local_sgd

    def unreachable(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(local_sgd.socket, "create_connection", unreachable)
    with pytest.raises(RuntimeError, match="ip link set lo up"):
        launch([RunConfig("DDP", optimizer_steps=2)], num_processes=2)


def sleeps_forever(results_path):
    time.sleep(3600)


def test_workers_that_never_finish_are_stopped_and_say_where_they_were():
    start = time.perf_counter()
    with pytest.raises(WorkerTimeoutError) as caught:
        run_in_processes(sleeps_forever, (), timeout_s=5)
    assert time.perf_counter() - start < 60
    assert "sleeps_forever" in str(caught.value) and "process 0" in str(caught.value)


def makes_a_progress_bar(results_path):
    from accelerate import Accelerator
    from tqdm import tqdm

    accelerator = Accelerator(cpu=True)
    for _ in tqdm(range(3), disable=True):  # creating a bar takes tqdm's lock, even when it shows nothing
        pass
    if accelerator.is_main_process:
        Path(results_path).write_text(json.dumps({"ok": True}))
    finish_worker(accelerator)


def test_a_progress_bar_in_a_worker_does_not_wait_for_the_notebooks_tqdm_lock():
    # tqdm's lock is a semaphore that fork shares with the parent; workers get locks of their own
    from tqdm import tqdm

    with tqdm.get_lock():  # held here, as tqdm's monitor thread holds it now and then
        assert run_in_processes(makes_a_progress_bar, (), timeout_s=60) == {"ok": True}
