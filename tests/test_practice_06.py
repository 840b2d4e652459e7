"""Practice 6 (sharding): right answers pass, written several ways; each usual mistake
gets its own hint; unfinished or malformed answers, a sentence; 6.3 on 2 processes."""
import math

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dcp
from practice_support import assert_judged, assert_verdict

from helpers.practice import check_sharding as l6
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


# --- 6.2: the first stage that fits
def first_by_loop(parameters, n, gpu_bytes, activation_bytes):
    for stage in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
        if bytes_by_table(stage, parameters, n) + activation_bytes <= gpu_bytes:
            return stage
    return None


def first_by_budget(parameters, n, gpu_bytes, activation_bytes):  # bytes a parameter
    budget = (gpu_bytes - activation_bytes) / parameters
    fitting = [stage for stage, per in (("ZeRO-3", 16 / n), ("ZeRO-2", 4 + 12 / n),
                                        ("ZeRO-1", 8 + 8 / n), ("DDP", 16))
               if per <= budget]
    return fitting[-1] if fitting else None


def test_6_2_right_answers_pass_and_each_mistake_gets_its_hint():
    assert_judged(l6.FITS, first_by_loop, first_by_budget)


def test_6_2_names_what_a_stage_must_be():
    assert_verdict(l6.check_first_stage_that_fits.verdict(lambda *args: "FSDP"), WRONG,
                   "gave 'FSDP'", "'DDP' to 'ZeRO-3'", "else None")


# --- 6.3: a full checkpoint of a sharded model, on 2 processes
def save_with_dcp(model, path):  # right: PyTorch's distributed checkpoint helpers
    state = dcp.get_model_state_dict(
        model, options=dcp.StateDictOptions(full_state_dict=True))
    if dist.get_rank() == 0:
        torch.save(state, path)


def test_6_3_right_answers_pass_and_each_mistake_gets_its_hint():
    assert_judged(l6.CHECKPOINT, save_with_dcp)
    assert l6.run_colleague_save() == {"entries": 40, "whole and equal": 0,
                                       "DTensors": 40}


def gathers_on_rank_0_only(model, path):  # the usual wrong answer: a hang, once
    if dist.get_rank() == 0:
        torch.save({k: v.full_tensor() for k, v in model.state_dict().items()}, path)


def test_6_3_an_all_gather_one_process_never_joins_gets_its_hint_in_seconds(
        monkeypatch):
    monkeypatch.setattr(l6, "COLLECTIVE_TIMEOUT_S", 1)  # the test's own wait, shorter
    assert_verdict(check(l6.CHECKPOINT, gathers_on_rank_0_only), WRONG,
                   "only process 0 gathered")


def test_6_3_a_learners_error_in_a_worker_is_one_sentence():
    def raises(model, path):
        raise ValueError("no disk left")

    assert_verdict(check(l6.CHECKPOINT, raises), WRONG,
                   "calling fixed_save raised ValueError: no disk left")
