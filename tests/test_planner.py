"""The planner of lesson 07 (helpers/planner.py): known answers, bad input, and its
error against live runs on a sample of the validation grid
(tools/validate_planner.py)."""
import math
import runpy
import statistics
import sys
import warnings

import pytest
import torch

from helpers import planner
from helpers.paths import REPO_ROOT
from tests.tool_scripts import load_tool

validate_planner = load_tool("validate_planner")


def test_distilbert_base_with_two_labels_has_the_slides_parameter_count():
    assert planner.count_parameters("distilbert-base-cased") == 65_783_042


def test_published_parameter_counts_of_the_added_configurations():
    # bert-large-uncased's encoder and pooler: 335,141,888 (+ 2,050 for a 2-label head)
    assert planner.count_parameters("bert-large-uncased") == 335_141_888 + 2_050
    assert planner.count_parameters("gpt2") == 124_439_808  # GPT-2 small, tied head
    assert planner.count_parameters("llama-3.1-8b") == 8_030_261_248


def test_float32_adamw_holds_16_bytes_per_parameter():
    result = planner.plan("distilbert-base-cased", planner.Run(1, 8),
                          planner.Levers(), planner.Device(kind="cpu"))
    state = (result.parts["weights"] + result.parts["gradients"]
             + result.parts["optimizer state"])
    # AdamW's step counters: one 4-byte tensor per parameter tensor (104 of them)
    assert state == 16 * 65_783_042 + 4 * 104


def test_mixed_precision_keeps_float32_weights_and_adds_autocast_copies():
    run, device = planner.Run(2, 16), planner.Device(kind="cpu")
    full = planner.plan("distilbert-tiny", run, planner.Levers(), device)
    mixed = planner.plan("distilbert-tiny", run, planner.Levers(precision="bf16"),
                         device)
    assert mixed.parts["weights"] == full.parts["weights"]
    assert full.parts["autocast weight copies"] == 0
    assert mixed.parts["autocast weight copies"] > 0


def test_autocasts_weight_cache_is_counted_until_forward_ends():
    # FSDP2 and checkpointing: the peak is at forward's end, where autocast's cache
    # holds a bfloat16 copy of each Linear weight, most of 2 bytes per parameter (the
    # embedding is never cast); off, the step holds none (lesson 07). The model and
    # shape of test_sharded_bytes_per_device_follow_zero: its parameter table is reused
    run, device = planner.Run(1, 8), planner.Device(kind="cpu")
    levers = planner.Levers(checkpointing=True, precision="bf16", sharding="fsdp",
                            devices=8)
    cached = planner.plan("llama-3.1-8b", run, levers, device)
    uncached = planner.plan("llama-3.1-8b", planner.Run(1, 8, autocast_cache=False),
                            levers, device)
    cache = cached.peak_bytes - uncached.peak_bytes
    assert 0.5 * 2 * cached.parameters < cache <= 2 * cached.parameters
    assert torch.is_autocast_cache_enabled()  # the flag is put back


def test_sharded_bytes_per_device_follow_zero():
    run, device = planner.Run(1, 8), planner.Device(kind="cpu")
    parts = {sharding: planner.plan("llama-3.1-8b", run,
                                    planner.Levers(sharding=sharding, devices=8,
                                                   checkpointing=True),
                                    device).parts
             for sharding in ("ddp", "zero1", "fsdp")}
    n = planner.count_parameters("llama-3.1-8b")
    assert parts["ddp"]["optimizer state"] == pytest.approx(8 * n, rel=1e-6)
    # the largest share: whole tensors, shared out greedily
    assert parts["zero1"]["optimizer state"] == pytest.approx(8 * n / 8, rel=0.07)
    assert parts["fsdp"]["weights"] == pytest.approx(4 * n / 8, rel=1e-3)


def test_ring_bytes_of_ddp_and_zero1():
    table = planner.parameter_table(planner.load_config("distilbert-tiny"))
    payload = table.count * 4
    ddp = planner.sent_bytes_per_step(table, planner.Run(),
                                      planner.Levers(sharding="ddp", devices=4))
    zero1 = planner.sent_bytes_per_step(table, planner.Run(),
                                        planner.Levers(sharding="zero1", devices=4))
    buffers = table.buffer_bytes * 3 / 4
    assert ddp == pytest.approx(2 * 3 / 4 * payload + buffers)
    assert zero1 - ddp == pytest.approx(3 / 4 * payload)


def test_fsdp_mixed_precision_gathers_bfloat16_and_reduces_float32():
    table = planner.parameter_table(planner.load_config("distilbert-tiny"))
    sent = {precision: planner.sent_bytes_per_step(
                table, planner.Run(), planner.Levers(precision=precision,
                                                     sharding="fsdp-reshard",
                                                     devices=4))
            for precision in ("float32", "bf16-fsdp")}
    # per group: two all-gathers and a reduce-scatter of 4 bytes each, or 2, 2 and 4
    assert sent["bf16-fsdp"] == pytest.approx(sent["float32"] * 8 / 12)


def test_fsdp_frees_each_layers_whole_gradients_after_its_backward():
    # bfloat16 end to end, checkpointing: no autocast cache; the whole model's
    # gradients (141 GB) would dwarf everything else if FSDP kept them
    result = planner.plan("llama-3.1-70b", planner.Run(1, 4096),
                          planner.Levers(checkpointing=True, precision="bf16-pure",
                                         sharding="fsdp-reshard", devices=8))
    whole_gradients = 2 * result.parameters
    held = sum(result.parts[k] for k in ("weights", "gradients", "optimizer state"))
    assert result.peak_bytes - held < 0.2 * whole_gradients
    # the formulas' lower bound, by which cheapest_fitting rules out a combination
    # without a fake run: the state and FSDP2's gathered weights, below the peak
    bound = planner.state_bytes("llama-3.1-70b", result.run, result.levers)
    assert held < bound <= result.peak_bytes


def test_a_plan_read_back_from_the_disk_cache_is_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(planner, "CACHE_DIR", str(tmp_path))
    run, levers = planner.Run(2, 16), planner.Levers(checkpointing=True)
    planner._segments_cached.cache_clear()
    first = planner.plan("gpt2-tiny", run, levers).as_dict()
    assert list(tmp_path.glob("segments-*.pickle"))
    planner._segments_cached.cache_clear()  # from the files now
    assert planner.plan("gpt2-tiny", run, levers).as_dict() == first


def test_a_float32_step_is_timed_at_the_float32_peak():
    # an A100's published dense peaks: float32 matmuls at 19.5 TFLOP/s (PyTorch's
    # default, no TF32), bfloat16 autocast's at 312: the same FLOPs, 16 x the time
    run, device = planner.Run(2, 16), planner.Device(
        kind="cpu", peak_flops=planner.A100_PEAK_FLOPS)
    full, mixed = (planner.plan("distilbert-tiny", run, planner.Levers(precision=p),
                                device) for p in ("float32", "bf16"))
    assert full.flops == mixed.flops > 0
    assert full.compute_seconds == pytest.approx(mixed.compute_seconds * 312 / 19.5)
    assert full.compute_seconds == pytest.approx(full.flops / 19.5e12)
    # one number: every precision at that peak, as before
    same = planner.Device(kind="cpu", peak_flops=312e12)
    assert {same.peak_for(p) for p in planner.PRECISIONS} == {312e12}
    assert device.peak_for("bf16-pure") == device.peak_for("bf16-fsdp") == 312e12


@pytest.mark.parametrize("peaks, message", [
    ({"tf32": 156e12}, "maps compute dtypes"),
    ({}, "maps compute dtypes"),
    ({"float32": -1.0}, r"peak_flops\['float32'\] must be a number >= 0"),
    (-5, "peak_flops must be a number >= 0"),
])
def test_bad_peaks_say_what_to_write(peaks, message):
    with pytest.raises(ValueError, match=message):
        planner.Device(peak_flops=peaks)


def test_a_precision_without_a_stated_peak_says_what_to_add():
    device = planner.Device(kind="cpu", peak_flops={"float32": 19.5e12})
    with pytest.raises(ValueError, match="no peak for bfloat16.*add it to peak_flops"):
        planner.plan("distilbert-tiny", planner.Run(1, 8),
                     planner.Levers(precision="bf16"), device)


def test_the_commands_peak_is_one_number_or_one_per_dtype():
    assert planner.parse_peak_tflops("312") == 312e12
    assert planner.parse_peak_tflops("float32=67, bfloat16=989") == {
        "float32": 67e12, "bfloat16": 989e12}
    assert planner.parse_peak_tflops(None) == planner.A100_PEAK_FLOPS
    for text in ("fast", "float32=", "float32=0"):
        with pytest.raises(ValueError, match="--peak-tflops"):
            planner.parse_peak_tflops(text)


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp8"}, "unknown precision"),
    ({"optimizer": "lion"}, "unknown optimizer"),
    ({"sharding": "tp"}, "unknown sharding"),
    ({"devices": 4}, "need a sharding"),
    ({"local_sgd_every": 4, "sharding": "fsdp", "devices": 2}, "Local SGD"),
    ({"precision": "bf16-fsdp", "sharding": "ddp", "devices": 2}, "FSDP2's mixed"),
    ({"checkpointing_policy": "some"}, "unknown checkpointing_policy"),
])
def test_bad_levers_say_what_is_valid(kwargs, message):
    with pytest.raises(ValueError, match=message):
        planner.Levers(**kwargs)


def test_bad_run_and_missing_configuration_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="batch must be a whole number >= 1"):
        planner.Run(batch=-1)
    with pytest.raises(FileNotFoundError, match="data/models/<name>"):
        planner.load_config(tmp_path / "nowhere")


def test_the_command_refuses_bad_input_with_a_sentence(capsys):
    for arguments, message in [
            (["--model", "data/models/gpt2", "--batch", "-4"], "batch must be"),
            (["--model", "data/models/gpt2", "--optimizer", "lion"],
             "unknown optimizer"),
            (["--model", "data/models/gpt2", "--gpu-memory", "lots"], "cannot read"),
            (["--model", "data/models/gpt2", "--peak-tflops", "float32=19.5",
              "--precision", "bf16"], "no peak for bfloat16"),
            (["--model", "data/models/missing"], "no config.json")]:
        with pytest.raises(SystemExit) as stopped:
            planner.main(arguments)
        assert stopped.value.code == 2
        error = capsys.readouterr().err
        assert message in error
        assert "Traceback" not in error


def test_the_command_runs_as_a_module(capsys, monkeypatch):
    # in this process (a new one costs seconds of imports): what ``python -m
    # helpers.planner`` runs, its __main__ block included
    monkeypatch.setattr(sys, "argv", ["planner", "--model",
                                      str(REPO_ROOT / "data/models/distilbert-tiny"),
                                      "--batch", "2", "--seq", "16", "--json"])
    with pytest.raises(SystemExit) as stopped, warnings.catch_warnings():
        # runpy warns that the module is imported already: it is, by this file
        warnings.simplefilter("ignore", RuntimeWarning)
        runpy.run_module("helpers.planner", run_name="__main__")
    assert stopped.value.code == 0
    assert '"fits": true' in capsys.readouterr().out


@pytest.fixture(scope="module")
def sample_rows():
    return validate_planner.validate(validate_planner.sample(), verbose=False)


def test_the_sample_covers_the_levers_and_families(sample_rows):
    assert len(sample_rows) >= 20
    names = " ".join(row["case"] for row in sample_rows)
    for word in ("distilbert", "gpt2", "llama", "ckpt", "bfloat16", "sgd", "adafactor",
                 "acc2"):
        assert word in names


def test_peak_memory_within_the_issues_bounds(sample_rows):
    errors = [abs(row["errors"]["peak"]) for row in sample_rows]
    assert statistics.median(errors) <= 0.03
    for row in sample_rows:
        assert abs(row["errors"]["peak"]) <= 0.10, (row["case"], row["errors"])


def test_each_part_within_ten_percent(sample_rows):
    for row in sample_rows:
        for part in validate_planner.PARTS:
            value = row["errors"].get(part)
            if value is not None and not math.isinf(value):
                assert abs(value) <= 0.10, (row["case"], part, value)


def test_flops_within_two_percent_of_flop_counter_mode(sample_rows):
    for row in sample_rows:
        assert abs(row["errors"]["flops"]) <= 0.02, (row["case"], row["errors"])


def test_caching_allocator_reserves_segments_as_pytorchs_does():
    MiB = 2**20
    allocator = planner.CachingAllocator()
    first = allocator.malloc(100)  # small pool: a 2 MiB segment, split
    allocator.malloc(600 * 1024)
    assert allocator.reserved == 2 * MiB
    allocator.malloc(5 * MiB)  # under 10 MiB: a 20 MiB segment, split
    assert allocator.reserved == 22 * MiB
    allocator.malloc(16 * MiB + 1)  # large: its size rounded up to 2 MiB
    assert allocator.reserved == 40 * MiB
    allocator.release(first)
    allocator.malloc(512)  # from the cache: nothing new reserved
    allocator.malloc(14 * MiB)  # the 15 MiB left of the 20 MiB segment
    assert allocator.reserved == 40 * MiB
    # a freed block merges with its free neighbours: 6 + 6 MiB freed, then 12 MiB
    # fits in the same 20 MiB segment
    events = [(0, 6 * MiB), (1, 6 * MiB), (0, -6 * MiB), (1, -6 * MiB), (2, 12 * MiB)]
    assert planner.replay_reserved(events) == (20 * MiB, 12 * MiB)


def test_selective_checkpointing_keeps_more_than_every_op_and_less_than_none():
    run, device = planner.Run(2, 32), planner.Device(kind="cpu")
    kept = {(checkpointing, policy): planner.plan("llama-tiny", run, planner.Levers(
                checkpointing=checkpointing, checkpointing_policy=policy),
                device).parts["activations"]
            for checkpointing, policy in ((True, "every-op"), (True, "selective-op"),
                                          (False, "every-op"))}
    assert kept[True, "every-op"] < kept[True, "selective-op"] < kept[False, "every-op"]


def test_a_gpu_plan_recomputes_under_cudas_autocast_rules_as_forward_ran():
    # GPT-2's GELU calls torch.pow, which CUDA's autocast runs in float32: before the
    # rules went into checkpointing's recomputation too, this plan raised
    # CheckpointError (float32 saved, bfloat16 recomputed)
    run = planner.Run(2, 16)
    kept = {checkpointing: planner.plan("gpt2-tiny", run, planner.Levers(
                checkpointing=checkpointing, precision="bfloat16")).parts["activations"]
            for checkpointing in (True, False)}
    assert 0 < kept[True] < kept[False]
