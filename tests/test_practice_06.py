"""Practice 6 (sharding): right answers pass, written several ways; each usual mistake
gets its own hint; unfinished or malformed answers, a sentence; 6.3 on 2 processes."""
import math

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dcp
from practice_support import assert_judged, assert_verdict

from helpers.practice import check_sharding as l6
from helpers.practice import core
from helpers.practice.core import NOT_DONE, WRONG, check


# --- 6.1: bytes per process
def bytes_by_table(stage, parameters, n):  # right, written as the formulas' table
    table = {"DDP": 4 + 4 + 8, "ZeRO-1": 4 + 4 + 8 / n, "ZeRO-2": 4 + (4 + 8) / n,
             "ZeRO-3": (4 + 4 + 8) / n}
    return table[stage] * parameters


def bytes_as_int(stage, parameters, n):  # right, in whole bytes and NumPy-free ints
    return math.ceil(bytes_by_table(stage, parameters, n))


def test_6_1_right_answers_pass_and_each_mistake_gets_its_hint():
    assert_judged(l6.BYTES, bytes_by_table, bytes_as_int)


def test_6_1_unfinished_and_malformed_answers_get_a_sentence():
    assert_verdict(l6.check_bytes_per_process.verdict(lambda s, p, n: ...), NOT_DONE)
    assert_verdict(l6.check_bytes_per_process.verdict(lambda *args: "16 bytes"), WRONG,
                   "should be a number")
    assert_verdict(l6.check_bytes_per_process.verdict(lambda s, p, n: {"DDP": 16}[s]),
                   WRONG, "KeyError: 'ZeRO-1'")


# --- 6.2: the stage that fits and sends the fewest bytes
SENT = {"DDP": 1.0, "ZeRO-1": 1.5, "ZeRO-2": 1.0, "ZeRO-3": 1.5}  # the notebook's table


def cheapest_by_loop(parameters, n, gpu_bytes, activation_bytes):
    best = None
    for stage in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
        fits = bytes_by_table(stage, parameters, n) + activation_bytes <= gpu_bytes
        if fits and (best is None or SENT[stage] < SENT[best]):
            best = stage
    return best


def cheapest_by_budget(parameters, n, gpu_bytes, activation_bytes):  # ZeRO-1 never
    budget = (gpu_bytes - activation_bytes) / parameters
    return next((stage for stage, per in (("DDP", 16), ("ZeRO-2", 4 + 12 / n),
                                          ("ZeRO-3", 16 / n)) if per <= budget), None)


def test_6_2_right_answers_pass_and_each_mistake_gets_its_hint():
    assert_judged(l6.FITS, cheapest_by_loop, cheapest_by_budget)


def test_6_2_ranks_stages_by_the_bytes_lesson_6_measured():
    """Issue 43: the first stage that fits ranked ZeroRedundancyOptimizer (1.5x, as
    measured) ahead of FSDP2 without resharding (1.0x)."""
    assert l6.FITS.intended(7e9, 8, 80e9, 10e9) == "ZeRO-2"  # ZeRO-1 fits too
    verdict = check(l6.FITS, l6.FITS.mistakes[0][1])  # the first that fits
    assert_verdict(verdict, WRONG, "ZeroRedundancyOptimizer", "1.5x")


def test_6_2_names_what_a_stage_must_be():
    assert_verdict(l6.check_cheapest_stage_that_fits.verdict(lambda *args: "FSDP"),
                   WRONG, "gave 'FSDP'", "DDP 1.0x", "None if none fits")


# --- 6.3: a full checkpoint of a sharded model, on 2 processes
def save_with_dcp(model, path):  # right: PyTorch's distributed checkpoint helpers
    state = dcp.get_model_state_dict(
        model, options=dcp.StateDictOptions(full_state_dict=True))
    if dist.get_rank() == 0:
        torch.save(state, path)


def test_6_3_right_answers_pass_and_each_mistake_gets_its_hint():
    assert_judged(l6.CHECKPOINT, save_with_dcp)
    colleague = l6.run_colleague_save()
    assert colleague["processes that wrote it"] == 1
    assert colleague[l6.LOADS].startswith("UnpicklingError: Weights only load failed")


def gathers_on_rank_0_only(model, path):  # the usual wrong answer: a hang, once
    if dist.get_rank() == 0:
        torch.save({k: v.full_tensor() for k, v in model.state_dict().items()}, path)


def test_6_3_an_all_gather_one_process_never_joins_gets_its_hint_in_seconds(
        monkeypatch):
    monkeypatch.setattr(core, "COLLECTIVE_TIMEOUT_S", 1)  # the test's own wait, shorter
    assert_verdict(check(l6.CHECKPOINT, gathers_on_rank_0_only), WRONG,
                   "only process 0 gathered")


def test_6_3_a_learners_error_in_a_worker_is_one_sentence():
    def raises(model, path):
        raise ValueError("no disk left")

    assert_verdict(check(l6.CHECKPOINT, raises), WRONG,
                   "calling fixed_save raised ValueError: no disk left")


def every_process_writes(model, path):  # right values, written twice
    state = {name: value.full_tensor() for name, value in model.state_dict().items()}
    torch.save(state, path)


def saved_as_a_folder(model, path):  # PyTorch's distributed checkpoint: a folder
    import torch.distributed.checkpoint as checkpoint

    checkpoint.save(model.state_dict(), checkpoint_id=path)


def saved_nested(model, path):  # one writer, whole tensors, but under a key of its own
    state = {name: value.full_tensor() for name, value in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save({"model": state}, path)


def test_6_3_one_writer_and_a_file_torch_load_reads():
    """Issue 44: every process writing the file was called correct; a folder saved by
    torch.distributed.checkpoint got the check's own IsADirectoryError; a second
    try's nested dict got `.to_local()`'s hint."""
    l6.weigh([every_process_writes, saved_as_a_folder, saved_nested])  # one launch
    verdict = check(l6.CHECKPOINT, every_process_writes)
    assert_verdict(verdict, WRONG, "both processes wrote the file")
    verdict = check(l6.CHECKPOINT, saved_as_a_folder)
    assert_verdict(verdict, WRONG, "a folder, not one file")
    assert "IsADirectoryError" not in verdict.message
    assert "raised" not in verdict.message
    verdict = check(l6.CHECKPOINT, saved_nested)
    assert_verdict(verdict, WRONG, "Missing key(s) in state_dict")
    assert "to_local" not in verdict.message


def test_6_1_bytes_in_mib_or_gb_are_named_as_such():
    for size, unit in ((2**20, "gave MiB"), (1e9, "gave GB")):
        verdict = l6.check_bytes_per_process.verdict(
            lambda stage, parameters, n, size=size: bytes_by_table(
                stage, parameters, n) / size)
        assert_verdict(verdict, WRONG, unit, "asks for bytes")
