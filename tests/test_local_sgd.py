"""Lesson 03's training: DDP and Local SGD on real processes, what they send, and the
script form."""
import json
import subprocess
import sys

import pytest

from helpers.launcher import free_port
from helpers.local_sgd import RunConfig, launch, train_worker, validate_local_sgd_steps
from helpers.models import build_model
from helpers.paths import REPO_ROOT
from helpers.timing_lock import LAUNCH, held

STEPS = 8


@pytest.fixture(scope="module")
def parameter_sizes():
    model = build_model("tiny")
    return len(list(model.parameters())), sum(
        p.numel() * p.element_size() for p in model.parameters()
    )


@pytest.fixture(scope="module")
def short_runs():
    return launch(
        [
            RunConfig("DDP", optimizer_steps=STEPS),
            RunConfig(
                "k=4", local_sgd_steps=4, optimizer_steps=STEPS, track_drift=True
            ),
            RunConfig("k=4, accumulation 2", local_sgd_steps=4, optimizer_steps=STEPS,
                      gradient_accumulation_steps=2, evaluate=False),
        ],
        num_processes=2,
    )


def test_a_run_is_evaluated_unless_told_not_to(short_runs):
    evaluated, skipped = short_runs["runs"][0], short_runs["runs"][2]
    assert 0 < evaluated["val_loss"] < 5 and 0 <= evaluated["val_accuracy"] <= 1
    assert skipped["val_loss"] is None and skipped["val_accuracy"] is None


@pytest.mark.parametrize("good", [None, 1, 8])
def test_valid_local_sgd_steps(good):
    validate_local_sgd_steps(good)


@pytest.mark.parametrize(
    "bad, error",
    [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("8", TypeError),
     (True, TypeError)],
)
def test_invalid_local_sgd_steps_get_a_clear_error(bad, error):
    with pytest.raises(error, match="local_sgd_steps"):
        RunConfig("bad", local_sgd_steps=bad)


@pytest.mark.parametrize(
    "field", ["optimizer_steps", "micro_batch_size", "gradient_accumulation_steps"]
)
@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_counts_in_a_config_must_be_whole_numbers(field, bad):
    with pytest.raises(ValueError, match=field):
        RunConfig("bad", **{field: bad})


def test_two_processes_really_train(short_runs):
    assert short_runs["processes"] == 2
    assert [run["config"]["name"] for run in short_runs["runs"]] == [
        "DDP",
        "k=4",
        "k=4, accumulation 2",
    ]


def test_ddp_all_reduces_the_gradients_once_per_step(short_runs, parameter_sizes):
    _, parameter_bytes = parameter_sizes
    events = short_runs["runs"][0]["events_by_rank"][0]
    all_reduces = [event for event in events if event["collective"] == "all_reduce"]
    assert [event["step"] for event in all_reduces] == list(range(1, STEPS + 1))
    # one bucket holding every gradient (plus alignment padding)
    for event in all_reduces:
        assert parameter_bytes <= event["bytes"] <= parameter_bytes * 1.01


def test_local_sgd_averages_every_parameter_every_k_steps_and_at_exit(
    short_runs, parameter_sizes
):
    tensors, parameter_bytes = parameter_sizes
    run = short_runs["runs"][1]
    syncs = STEPS // 4 + 1  # at steps 4 and 8, and when the LocalSGD block ends
    all_reduces = [event for event in run["events_by_rank"][0]
                   if event["collective"] == "all_reduce"]
    assert len(all_reduces) == syncs * tensors
    assert sum(event["bytes"] for event in all_reduces) == syncs * parameter_bytes
    assert sorted({event["step"] for event in all_reduces}) == [4, 8]
    assert run["final_gap"] == 0.0


def test_the_weights_drift_apart_between_averagings_and_meet_at_each(short_runs):
    gaps = dict(short_runs["runs"][1]["gaps"])
    # measured after every optimizer step
    assert sorted(gaps) == list(range(1, STEPS + 1))
    assert gaps[4] == gaps[8] == 0.0
    assert gaps[3] > 0 and gaps[7] > 0


def test_gradient_accumulation_is_wired_through_and_local_sgd_counts_micro_batches(
    short_runs, parameter_sizes
):
    # 8 optimizer steps of 2 micro-batches: local_sgd_steps=4 calls = every 2 optimizer
    # steps, plus the exit
    _, parameter_bytes = parameter_sizes
    events = short_runs["runs"][2]["events_by_rank"][0]
    synced_after = sorted(
        {event["step"] for event in events if event["collective"] == "all_reduce"}
    )
    assert synced_after == [2, 4, 6, 8]
    assert (short_runs["runs"][2]["bytes"] - short_runs["runs"][1]["bytes"]
            == 2 * parameter_bytes)


def test_ddp_broadcasts_buffers_before_every_forward_local_sgd_before_the_first(
    short_runs,
):
    # DDP's default forward_sync_buffers=True (torch 2.13's name for the deprecated
    # broadcast_buffers); LocalSGD's no_sync() stops it after the first forward
    def buffer_broadcasts(run):
        return [event["step"] for event in run["events_by_rank"][0]
                if event["collective"] == "_broadcast_coalesced"]
    assert buffer_broadcasts(short_runs["runs"][0]) == list(range(1, STEPS + 1))
    assert buffer_broadcasts(short_runs["runs"][1]) == [1]


def test_a_broadcast_is_counted_only_on_the_process_that_sends_it(short_runs):
    by_rank = short_runs["runs"][0]["events_by_rank"]
    broadcast_bytes = [sum(e["bytes"] for e in events if e["collective"] == "broadcast")
                       for events in by_rank]
    # Accelerate's data loader, from process 0
    assert broadcast_bytes[0] > 0 and broadcast_bytes[1] == 0


def test_a_single_process_refuses_to_pretend():
    from accelerate import Accelerator

    with pytest.raises(RuntimeError, match="silently do nothing"):
        train_worker(Accelerator(cpu=True), [RunConfig("DDP", optimizer_steps=2)])


def accelerate_launch(flags, folder):
    """Start the script form with `accelerate launch` and ``flags``, in ``folder``, its
    output to files there."""
    command = [sys.executable, "-m", "accelerate.commands.launch", *flags,
               "--num_processes", "2", "--main_process_port", str(free_port()),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
               "no", str(REPO_ROOT / "helpers" / "local_sgd.py"), "--local-sgd-steps",
               "4", "--optimizer-steps", "8", "--results", str(folder / "results.json")]
    with open(folder / "stdout", "w") as stdout, open(folder / "stderr", "w") as stderr:
        return subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=folder)


@pytest.fixture(scope="module")
def script_launches(tmp_path_factory):
    """Both `accelerate launch` forms below, started side by side, each cold in fresh
    interpreters.

    Much of each is one process importing while the other core idles, so together they
    take less time than one after the other. {flag: (CompletedProcess, results file)}.
    """
    folders = {flag: tmp_path_factory.mktemp(flag.strip("-"))
               for flag in ("--multi_gpu", "--cpu")}
    with held(LAUNCH):  # no lesson times a step in the other worker meanwhile
        processes = {
            flag: accelerate_launch([flag], folder) for flag, folder in folders.items()
        }
        try:
            for process in processes.values():
                process.wait(timeout=300)
        finally:
            for process in processes.values():
                process.kill()  # only if still running: a launch past its time limit
    return {
        flag: (
            subprocess.CompletedProcess(processes[flag].args,
                                        processes[flag].returncode,
                                        (folder / "stdout").read_text(),
                                        (folder / "stderr").read_text()),
            folder / "results.json",
        )
        for flag, folder in folders.items()
    }


def test_the_script_form_runs_on_two_processes_with_accelerate_launch(script_launches):
    completed, results = script_launches["--multi_gpu"]  # torchrun; gloo on a CPU
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(results.read_text())["processes"] == 2
    assert "Local SGD k=4" in completed.stdout


def test_accelerate_launch_with_cpu_flag_starts_one_process_and_the_worker_refuses(
    script_launches,
):
    # Accelerate 1.x: --cpu takes the single-process launcher (several CPU processes
    # need mpirun).
    completed, _ = script_launches["--cpu"]
    assert completed.returncode != 0
    assert "silently do nothing" in completed.stderr
