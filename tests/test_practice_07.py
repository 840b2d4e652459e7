"""Practice 7 (plan a run): right answers written as a learner would pass, each listed
mistake gets its own hint, the prose's claims hold, and a form problem is "not quite",
never a failed check."""
import numpy as np
import torch
from practice_support import assert_judged, assert_verdict

from helpers.planner import Levers, plan
from helpers.practice import check_plan_a_run as l7
from helpers.practice.core import CORRECT, NOT_DONE, WRONG, check


def test_7_1_levers_that_fit():
    assert_judged(l7.FIT, Levers(devices=8, sharding="fsdp"),
                  Levers(precision="bf16", devices=8, sharding="fsdp-reshard"))
    # the exercise's claim: as the run starts (float32 AdamW, DDP), it does not fit
    assert not plan(l7.MODEL, l7.FIT_RUN, Levers(devices=8, sharding="ddp"),
                    l7.GPU).fits
    assert_verdict(check(l7.FIT, Levers(devices=8, sharding="fsdp",
                                        precision="bf16-pure")),
                   WRONG, "changes the optimizer or the weights")
    assert_verdict(check(l7.FIT, Levers()), WRONG, "devices=8")
    assert_verdict(check(l7.FIT, "fsdp"), WRONG, "should be a Levers(...)")
    assert_verdict(l7.check_levers_that_fit.verdict(...), NOT_DONE)


def test_7_2_autocast_copies_are_measured():
    from transformers.pytorch_utils import Conv1D

    def by_name(model):  # the same count, from named parameters, in NumPy
        names = {f"{name}.weight" for name, m in model.named_modules()
                 if isinstance(m, (torch.nn.Linear, Conv1D))}
        return np.int64(sum(p.numel() * 2 for n, p in model.named_parameters()
                            if n in names) + (
            # a tied head (GPT-2, DistilBERT's none): its weight is the embedding's
            model.lm_head.weight.numel() * 2 if getattr(
                model.config, "tie_word_embeddings", False)
            and hasattr(model, "lm_head") else 0))

    assert_judged(l7.COPIES, by_name)
    assert_verdict(check(l7.COPIES, lambda model: 0.5), WRONG, "whole number")
    assert_verdict(l7.check_autocast_copies.verdict(lambda model: ...), NOT_DONE)


def test_7_3_colleague_plan():
    result = plan(l7.MODEL, l7.PLAN_RUN, l7.PLAN_LEVERS, l7.GPU)
    answer = {"weights": 4.0, "gradients": 4, "optimizer state": np.float64(8),
              "activations": result.parts["activations"], "fits": np.bool_(result.fits)}
    assert_judged(l7.COLLEAGUE_PLAN, answer)
    assert not result.fits  # the exercise's story: the colleague's run does not fit
    assert_verdict(l7.check_colleague_plan.verdict(answer), CORRECT, "does NOT fit")
    assert_verdict(check(l7.COLLEAGUE_PLAN, {**answer, "fits": "no"}), WRONG,
                   "give True or False")
    assert_verdict(check(l7.COLLEAGUE_PLAN, 16), WRONG, "should be a dict")
    assert_verdict(l7.check_colleague_plan.verdict({**answer, "fits": ...}), NOT_DONE)
