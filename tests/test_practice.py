"""The practice checkers (helpers/practice): right answers pass, typical wrong ones get the intended message.

Every exercise has correct variants a learner might write and at least two typical mistakes.
The notebooks themselves are run by nbval; the last tests check the practice/solution pairs.
"""
import contextlib
import math
import random
import warnings

import numpy as np
import pytest
import torch
from accelerate.local_sgd import LocalSGD
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, checkpoint_sequential
from transformers import TrainingArguments

from helpers import training
from helpers.paths import REPO_ROOT
from helpers.practice.verdicts import (CHECK_FAILED, CORRECT, NOT_DONE, WRONG, Verdict, call_learner, checker,
                                      explaining_warnings, is_unfinished)
from helpers.practice import adamw as l4
from helpers.practice import gradient_checkpointing as l1
from helpers.practice import local_sgd as l3
from helpers.practice import trainer_and_accelerator as l2

PRACTICE = REPO_ROOT / "notebooks" / "practice"


def assert_verdict(verdict, status, *fragments):
    assert isinstance(verdict, Verdict)
    assert verdict.status == status, str(verdict)
    for fragment in fragments:
        assert fragment in verdict.message, f"{fragment!r} not in: {verdict.message}"
    assert "Traceback" not in verdict.message


# --- the shared machinery ---------------------------------------------------------------

def unfinished_function(x):
    return ...


def unfinished_in_body(x):
    y = x[..., 0]  # slicing with ... is code, not a placeholder
    ...
    return y


def finished_with_slicing(x):
    return x[..., 0]


def test_placeholders_are_found_in_values_containers_and_function_sources():
    assert is_unfinished(...) and is_unfinished({"A": ..., "B": 1}) and is_unfinished([1, ...])
    assert is_unfinished(unfinished_function) and is_unfinished(unfinished_in_body)
    assert not is_unfinished(finished_with_slicing) and not is_unfinished({"A": 1}) and not is_unfinished(0)


def test_a_check_that_fails_itself_says_so_where_and_whom_to_tell(capsys):
    @checker("0.1")
    def check_crashes(answer):
        return {"expected": 42}["missing key"]  # a bug in the check, not in the answer

    check_crashes(42)
    printed = capsys.readouterr().out
    assert printed.startswith("Exercise 0.1: the check itself failed. This is a bug in the check, not in your answer")
    assert "KeyError: 'missing key'" in printed and "tests/test_practice.py, line" in printed
    assert "report it" in printed and "course maintainers" in printed
    assert "not quite" not in printed and "Traceback" not in printed and printed.count("\n") == 1


def test_a_check_failing_in_code_it_calls_points_at_the_helpers_line_that_called_it(monkeypatch):
    def broken_weigher(optimizer):  # stands for a library function the check calls
        raise RuntimeError("the state changed shape")

    monkeypatch.setattr(l4.optimizer_state, "optimizer_state_size", broken_weigher)
    verdict = l4.check_optimizer_state_size.verdict(lambda optimizer: 0)
    assert_verdict(verdict, CHECK_FAILED, "RuntimeError: the state changed shape", "helpers/practice/adamw.py, line")


def test_an_exception_in_the_learners_code_is_not_quite_in_one_sentence(capsys):
    @checker("0.2")
    def check_calls(answer):
        return f"it returned {call_learner(answer, 1)}"

    def answer(x):
        return {"a": 1}["b"]

    check_calls(answer)
    printed = capsys.readouterr().out
    assert printed.startswith("Exercise 0.2: not quite. Calling answer raised KeyError: 'b'.")
    assert "check itself" not in printed and "Traceback" not in printed and printed.count("\n") == 1


def test_a_check_lets_warnings_through_unless_it_explains_them():
    @checker("0.3")
    def check_warns(answer):
        with explaining_warnings("old name") as explained:
            warnings.warn("the old name is deprecated", FutureWarning)
            warnings.warn("something else", UserWarning)
        return f"explained {len(explained)}"

    with pytest.warns(UserWarning, match="something else") as shown:
        assert_verdict(check_warns.verdict(None), CORRECT, "explained 1")
    assert [str(w.message) for w in shown] == ["something else"]


def test_explaining_warnings_shows_the_others_even_when_the_block_raises():
    with pytest.warns(UserWarning, match="shown anyway"), pytest.raises(ValueError):
        with explaining_warnings("explained"):
            warnings.warn("shown anyway", UserWarning)
            raise ValueError


# --- lesson 1 -----------------------------------------------------------------------------

@pytest.mark.parametrize("prediction", [{"A": 2, "B": 2, "C": 1}, {"A": 2.0, "B": 2, "C": 1}])
def test_1_1_accepts_the_measured_counts(prediction):
    assert_verdict(l1.check_recompute_prediction.verdict(prediction), CORRECT, "A 2x, B 2x, C 1x")


@pytest.mark.parametrize("prediction, fragment", [
    ({"A": 2, "B": 2, "C": 2}, "C is not"),                    # believes everything is recomputed
    ({"A": 1, "B": 1, "C": 1}, "how many times must each"),    # believes nothing is recomputed
    ([2, 2, 1], 'keys "A", "B" and "C"'),
    ({"A": "two", "B": 2, "C": 1}, "whole number"),
])
def test_1_1_rejects_typical_predictions(prediction, fragment):
    assert_verdict(l1.check_recompute_prediction.verdict(prediction), WRONG, fragment)


def test_1_1_not_done_yet():
    assert_verdict(l1.check_recompute_prediction.verdict({"A": ..., "B": ..., "C": ...}), NOT_DONE, "`...`")


@pytest.mark.parametrize("switch", [
    lambda m: m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}),
    lambda m: m.activation_checkpointing_enable(),
])
def test_1_2_accepts_the_switch(switch):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), CORRECT, "x less")


def test_1_2_accepts_the_deprecated_name_with_a_note():
    verdict = l1.check_switch_on_checkpointing.verdict(lambda m: m.gradient_checkpointing_enable())
    assert_verdict(verdict, CORRECT, "deprecated name")


@pytest.mark.parametrize("switch, fragment", [
    (lambda m: setattr(m, "gradient_checkpointing", True), "nothing changed"),
    (lambda m: setattr(m.config, "gradient_checkpointing", True), "nothing changed"),
    (lambda m: m.enable_checkpointing(), "AttributeError"),
])
def test_1_2_rejects_attributes_and_wrong_names(switch, fragment):
    assert_verdict(l1.check_switch_on_checkpointing.verdict(switch), WRONG, fragment)


def keep_addmm(ctx, op, *args, **kwargs):
    if op == torch.ops.aten.addmm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy", [
    keep_addmm,
    lambda ctx, op, *a, **k: op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default),  # bools are allowed
    lambda ctx, op, *a, **k: (CheckpointPolicy.PREFER_SAVE if op.overloadpacket == torch.ops.aten.addmm
                              else CheckpointPolicy.MUST_RECOMPUTE),
])
def test_1_3_accepts_policies_that_keep_the_matrix_multiply(policy):
    assert_verdict(l1.check_keep_expensive_policy.verdict(policy), CORRECT, "addmm 0x")


@pytest.mark.parametrize("policy, fragment", [
    (lambda ctx, op, *a, **k: op is torch.addmm, "torch.ops.aten.addmm.default"),  # the Python function, never seen
    (lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE, "nothing was recomputed"),
    (lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.addmm.default else None,
     "return on every path"),
])
def test_1_3_rejects_typical_policies(policy, fragment):
    assert_verdict(l1.check_keep_expensive_policy.verdict(policy), WRONG, fragment)


def reentrant_default(blocks, h):
    for block in blocks:
        h = checkpoint(block, h)  # no use_reentrant: the old reentrant path
    return h


def under_no_grad(blocks, h):
    with torch.no_grad():
        return l1.plain_forward(blocks, h)


@pytest.mark.parametrize("forward", [
    l1.every_block_checkpointed,
    lambda blocks, h: checkpoint_sequential(blocks, len(blocks), h, use_reentrant=False),
])
def test_1_4_accepts_one_checkpoint_per_block(forward):
    assert_verdict(l1.check_checkpointed_forward.verdict(forward), CORRECT, "only the blocks' inputs")


@pytest.mark.parametrize("forward, fragment", [
    (l1.plain_forward, "as much as without checkpointing"),
    (lambda blocks, h: checkpoint(l1.plain_forward, blocks, h, use_reentrant=False), "recomputed all at once"),
    (reentrant_default, "use_reentrant=False"),
    (under_no_grad, "torch.no_grad()"),
    (lambda blocks, h: blocks[0](h), "differs from running the blocks"),
])
def test_1_4_rejects_typical_forwards(forward, fragment):
    assert_verdict(l1.check_checkpointed_forward.verdict(forward), WRONG, fragment)


# --- lesson 2 -----------------------------------------------------------------------------

def arguments(**overrides):
    settings = dict(eval_strategy="epoch", per_device_train_batch_size=16, gradient_accumulation_steps=4,
                    activation_checkpointing=True, use_cpu=True, report_to="none")
    settings.update(overrides)
    return lambda output_dir: TrainingArguments(output_dir=output_dir, **settings)


def test_2_1_accepts_todays_names_and_notes_the_deprecated_one():
    assert_verdict(l2.check_training_arguments.verdict(arguments()), CORRECT, "checkpointing on")
    def old_name(output_dir):
        return TrainingArguments(output_dir=output_dir, eval_strategy="epoch", per_device_train_batch_size=16,
                                 gradient_accumulation_steps=4, gradient_checkpointing=True, report_to="none")
    assert_verdict(l2.check_training_arguments.verdict(old_name), CORRECT, "deprecated name")


@pytest.mark.parametrize("make, fragment", [
    (lambda output_dir: TrainingArguments(output_dir=output_dir, evaluation_strategy="epoch"), "renamed evaluation_strategy"),
    (arguments(no_cuda=True), "renamed no_cuda"),
    (arguments(per_device_train_batch_size=64, gradient_accumulation_steps=1), "64 examples, not 16"),
    (arguments(activation_checkpointing=False), "checkpointing is off"),
    (lambda output_dir: {"eval_strategy": "epoch"}, "should return TrainingArguments"),
])
def test_2_1_rejects_typical_arguments(make, fragment):
    assert_verdict(l2.check_training_arguments.verdict(make), WRONG, fragment)


def test_2_2_accepts_the_effective_batch_and_the_steps():
    assert_verdict(l2.check_batch_arithmetic.verdict(64, 63), CORRECT, "64 examples", "63 optimizer steps")
    assert_verdict(l2.check_batch_arithmetic.verdict(64.0, math.ceil(250 / 4)), CORRECT)


@pytest.mark.parametrize("answers, fragment", [
    ((16, 63), "that is one micro-batch"),
    ((64, 250), "that is the number of micro-batches"),
    ((64, 62), "one more, smaller step"),
])
def test_2_2_rejects_typical_arithmetic(answers, fragment):
    assert_verdict(l2.check_batch_arithmetic.verdict(*answers), WRONG, fragment)


def test_2_2_is_measured_not_assumed():
    # the check's truth comes from a real Trainer step: 16 x 4 examples with these arguments
    assert l2.examples_seen_in_one_optimizer_step(training.MICRO_BATCH_SIZE, training.TRAINER_ACCUMULATION) == 64


def set_and_return(model):
    model.accepts_loss_kwargs = False
    return model


@pytest.mark.parametrize("prepare", [lambda model: setattr(model, "accepts_loss_kwargs", False), set_and_return])
def test_2_3_accepts_the_fix(prepare):
    assert_verdict(l2.check_logged_loss_fix.verdict(prepare), CORRECT, "true mean loss")


@pytest.mark.parametrize("prepare, fragment", [
    (lambda model: None, "4 x the true mean loss"),
    (lambda model: setattr(model.config, "accepts_loss_kwargs", False), "not of its config"),
    (lambda model: setattr(model, "accepts_loss_kwargs", True), "4 x the true mean loss"),
])
def test_2_3_rejects_typical_fixes(prepare, fragment):
    assert_verdict(l2.check_logged_loss_fix.verdict(prepare), WRONG, fragment)


def accumulate_with_named_outputs(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def accumulate_zero_grad_first(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
        optimizer.zero_grad()  # outside the block: Accelerate only resets on a real step either way


@pytest.mark.parametrize("loop", [accumulate_with_named_outputs, accumulate_zero_grad_first])
def test_2_4_accepts_accumulation_loops(loop):
    assert_verdict(l2.check_accumulation_loop.verdict(loop), CORRECT, "2 optimizer steps")


@pytest.mark.parametrize("mistake, fragment", [
    ("plain_backward", "accelerator.backward(loss) divides"),
    ("no_accumulate", "stepped 4 times"),
    ("no_zero_grad", "never reset"),
])
def test_2_4_rejects_typical_loops(mistake, fragment):
    assert_verdict(l2.check_accumulation_loop.verdict(l2.mistaken_loop(**{mistake: True})), WRONG, fragment)


# --- lesson 3 -----------------------------------------------------------------------------

def test_3_1_accepts_the_formula_written_two_ways():
    assert_verdict(l3.check_predicted_bytes.verdict(lambda s, k, p: (s // k + 1) * p), CORRECT)
    assert_verdict(l3.check_predicted_bytes.verdict(lambda s, k, p: p * (math.floor(s / k) + 1)), CORRECT)


@pytest.mark.parametrize("prediction, fragment", [
    (lambda s, k, p: s // k * p, "averages once more"),
    (lambda s, k, p: s * p, "that is DDP"),
    (lambda s, k, p: (s / k + 1) * p, "use //"),
    (lambda s, k, p: "many", "how many times"),
])
def test_3_1_rejects_typical_predictions(prediction, fragment):
    assert_verdict(l3.check_predicted_bytes.verdict(prediction), WRONG, fragment)


def local_sgd_loop(local_sgd_steps, enabled=True, call_step=True, steps_per_batch=1, accumulate=False, guard=False):
    """Lesson 3's loop, and the ways a learner may get it wrong."""
    def loop(accelerator, model, optimizer, dataloader):
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps, enabled=enabled) as local_sgd:
            for batch in dataloader:
                with accelerator.accumulate(model) if accumulate else contextlib.nullcontext():
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    if call_step and (accelerator.sync_gradients or not guard):
                        for _ in range(steps_per_batch):
                            local_sgd.step()
    return loop


def ddp_loop(accelerator, model, optimizer, dataloader):
    for batch in dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()


@pytest.fixture(scope="module")
def loop_runs():
    """One launch of 2 processes measures every variant of exercise 3.2 (24 steps, k = 8)."""
    variants = {"right": local_sgd_loop(8), "ddp": ddp_loop, "disabled": local_sgd_loop(8, enabled=False),
                "no step": local_sgd_loop(8, call_step=False), "step twice": local_sgd_loop(8, steps_per_batch=2)}
    return dict(zip(variants, l3.measure_loops(variants.values(), micro_batches=24)))


def judged(judge, *args):
    @checker("test")
    def check():
        judge(*args)
        return "ok"
    return check.verdict()


def test_3_2_measures_what_the_formula_predicts(loop_runs):
    run = loop_runs["right"]
    assert run["all_reduce_bytes"] == l3.expected_rounds(24, 8) * run["parameter_bytes"]
    assert run["sync_steps"] == [8, 16, 24] and run["final_gap"] == 0.0
    assert_verdict(judged(l3.judge_local_sgd_run, run, 24, 8), CORRECT)
    assert loop_runs["ddp"]["all_reduce_bytes"] == 24 * run["parameter_bytes"]


@pytest.mark.parametrize("variant, fragment", [
    ("ddp", "plain DDP"), ("disabled", "plain DDP"), ("no step", "only once"), ("step twice", "once per step"),
])
def test_3_2_rejects_typical_loops(loop_runs, variant, fragment):
    assert_verdict(judged(l3.judge_local_sgd_run, loop_runs[variant], 24, 8), WRONG, fragment)


def learners_train_loop(accelerator, model, optimizer, dataloader, local_sgd_steps):
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps, enabled=True) as local_sgd:
        for batch in dataloader:
            outputs = model(**batch)
            accelerator.backward(outputs.loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()


def test_3_2_whole_check_compares_with_the_prediction():
    verdict = l3.check_local_sgd_loop.verdict(learners_train_loop, lambda s, k, p: (s // k + 1) * p)
    assert_verdict(verdict, CORRECT, "4 averagings", "which matches")


def misspelled_loop(accelerator, model, optimizer, dataloader, local_sgd_steps):
    with LocalSGDD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps) as local_sgd:  # noqa: F821
        local_sgd.step()


def step_without_the_block(accelerator, model, optimizer, dataloader, local_sgd_steps):
    for batch in dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
        local_sgd.step()  # noqa: F821, the `with LocalSGD(...) as local_sgd:` line is missing


@pytest.mark.parametrize("loop, fragments", [
    (misspelled_loop, ("NameError", "LocalSGDD", "import it first")),
    (step_without_the_block, ("NameError", "'local_sgd'", "open that block")),
])
def test_3_2_a_failing_worker_is_one_sentence_not_a_traceback(loop, fragments):
    assert_verdict(l3.check_local_sgd_loop.verdict(loop), WRONG, *fragments)


@pytest.fixture(scope="module")
def accumulation_runs():
    """One launch measures every variant of exercise 3.3 (32 micro-batches, accumulation 2)."""
    variants = {"k=16": local_sgd_loop(16, accumulate=True), "k=8 on real steps": local_sgd_loop(8, accumulate=True, guard=True),
                "k=8": local_sgd_loop(8, accumulate=True), "k=4": local_sgd_loop(4, accumulate=True),
                "no step": local_sgd_loop(16, accumulate=True, call_step=False)}
    return dict(zip(variants, l3.measure_loops(variants.values(), micro_batches=32, gradient_accumulation_steps=2)))


@pytest.mark.parametrize("variant", ["k=16", "k=8 on real steps"])
def test_3_3_accepts_both_ways_to_count_optimizer_steps(accumulation_runs, variant):
    assert_verdict(judged(l3.judge_accumulation_run, accumulation_runs[variant], 16), CORRECT)


@pytest.mark.parametrize("variant, fragment", [
    ("k=8", "every 4 optimizer steps"), ("k=4", "every 2 optimizer steps"), ("no step", "only once"),
])
def test_3_3_rejects_counting_micro_batches(accumulation_runs, variant, fragment):
    assert_verdict(judged(l3.judge_accumulation_run, accumulation_runs[variant], 16), WRONG, fragment)


# --- lesson 4 -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    from helpers.models import build_model

    model = build_model("tiny")
    return model, sum(p.numel() for p in model.parameters())


def test_4_1_accepts_the_estimate(tiny):
    model, n = tiny
    assert_verdict(l4.check_adamw_estimate.verdict(model, 8 * n), CORRECT, "ratio")
    assert_verdict(l4.check_adamw_estimate.verdict(model, float(n * 2 * 4)), CORRECT)


@pytest.mark.parametrize("bytes_per_parameter, fragment", [
    (4, "one state per parameter"), (16, "weights + gradients + state"), (12, "adds the gradient"),
    (8 / 2**20, "MiB"),
])
def test_4_1_rejects_typical_estimates(tiny, bytes_per_parameter, fragment):
    model, n = tiny
    assert_verdict(l4.check_adamw_estimate.verdict(model, n * bytes_per_parameter), WRONG, fragment)


def adamw_step_torch_style(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denominator = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    param.addcdiv_(exp_avg, denominator, value=-step_size)


@pytest.mark.parametrize("step_fn", [l4.variant_step(), adamw_step_torch_style])
def test_4_2_accepts_adamw_written_two_ways(step_fn):
    assert_verdict(l4.check_adamw_step.verdict(step_fn), CORRECT, "match torch.optim.AdamW")


def rebinds_exp_avg(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay):
    exp_avg = betas[0] * exp_avg + (1 - betas[0]) * grad  # a new tensor: the caller's exp_avg stays 0


@pytest.mark.parametrize("mistake, fragment", [
    ("no_bias_correction", "bias correction"), ("coupled_decay", "L2 penalty"),
    ("no_decay", "weight decay is missing"), ("eps_inside", "belongs outside"),
])
def test_4_2_names_the_typical_mistakes(mistake, fragment):
    assert_verdict(l4.check_adamw_step.verdict(l4.variant_step(**{mistake: True})), WRONG, fragment)


def test_4_2_catches_rebinding_instead_of_updating_in_place():
    assert_verdict(l4.check_adamw_step.verdict(rebinds_exp_avg), WRONG, "in place")


def weigh_with_loops(optimizer):
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.nbytes
    return total


@pytest.mark.parametrize("size_fn", [
    weigh_with_loops,
    lambda o: sum(v.numel() * v.element_size() for s in o.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
])
def test_4_3_accepts_state_weighers(size_fn):
    assert_verdict(l4.check_optimizer_state_size.verdict(size_fn), CORRECT, "Adafactor")


@pytest.mark.parametrize("size_fn, fragment", [
    (lambda o: sum(v.numel() for s in o.state.values() for v in s.values() if torch.is_tensor(v)), "number of elements"),
    (lambda o: sum(v.numel() * v.element_size() for s in o.state.values() for v in s.values()), "not tensors"),
    (lambda o: sum(v.numel() * 4 for s in o.state.values() for v in s.values() if torch.is_tensor(v)), "element_size()"),
    (lambda o: sum(p.numel() * p.element_size() for g in o.param_groups for p in g["params"]), "parameters themselves"),
    (lambda o: sum(v.numel() for s in o.state.values() for v in s), "state.values()"),
])
def test_4_3_rejects_typical_weighers(size_fn, fragment):
    assert_verdict(l4.check_optimizer_state_size.verdict(size_fn), WRONG, fragment)


def parameters_by_parts(config):
    return sum(part(config) for part in l4.DISTILBERT_PARTS.values())


def parameters_spelled_out(config):
    d, h, layers = config.dim, config.hidden_dim, config.n_layers
    per_layer = 4 * (d * d + d) + (d * h + h) + (h * d + d) + 4 * d
    return (config.vocab_size + config.max_position_embeddings) * d + 2 * d + layers * per_layer + \
        d * d + d + d * config.num_labels + config.num_labels


@pytest.mark.parametrize("count_fn", [parameters_by_parts, parameters_spelled_out])
def test_4_4_accepts_formulas_that_match_the_built_models(count_fn):
    verdict = l4.check_parameters_from_config.verdict(count_fn)
    assert_verdict(verdict, CORRECT, "65,783,042", "501.9 MiB")


@pytest.mark.parametrize("count_fn, fragment", [
    (lambda c: parameters_by_parts(c) - c.max_position_embeddings * c.dim, "position embeddings: missing"),
    (lambda c: parameters_by_parts(c) - c.dim * c.dim - c.dim, "pre_classifier: missing"),
    (lambda c: parameters_by_parts(c) - c.n_layers * 4 * c.dim, "attention biases: missing"),
    (lambda c: parameters_by_parts(c) - l4.DISTILBERT_PARTS["the classifier"](c), "classifier: missing"),
    (lambda c: c.intermediate_size * c.n_layers, "names its sizes"),  # BERT's name, not DistilBERT's
])
def test_4_4_rejects_typical_formulas(count_fn, fragment):
    assert_verdict(l4.check_parameters_from_config.verdict(count_fn), WRONG, fragment)


def test_4_4_hard_coded_two_labels_fails_on_the_three_label_configuration():
    def two_labels_always(config):
        return parameters_by_parts(config) - config.dim * config.num_labels - config.num_labels + config.dim * 2 + 2

    assert_verdict(l4.check_parameters_from_config.verdict(two_labels_always), WRONG, "3 labels")


# --- the learner's random numbers ---------------------------------------------------------

CHECKS_THAT_BUILD_OR_TRAIN = {
    "1.4 (builds blocks)": lambda: l1.check_checkpointed_forward.verdict(l1.every_block_checkpointed),
    "2.3 (trains with Trainer)": lambda: l2.check_logged_loss_fix.verdict(set_and_return),
    "4.3 (builds a model, steps optimizers)": lambda: l4.check_optimizer_state_size.verdict(weigh_with_loops),
}


def draws_after_seeding(run_check=None):
    """What a learner draws from the global generators after seeding them (and running a check)."""
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    if run_check is not None:
        assert_verdict(run_check(), CORRECT)
    return torch.rand(4).tolist(), random.random(), np.random.rand()


@pytest.mark.parametrize("run_check", CHECKS_THAT_BUILD_OR_TRAIN.values(), ids=CHECKS_THAT_BUILD_OR_TRAIN.keys())
def test_a_check_leaves_the_learners_random_numbers_alone(run_check):
    assert draws_after_seeding(run_check) == draws_after_seeding()


# --- the notebooks ------------------------------------------------------------------------

LESSONS = ["01_gradient_checkpointing", "02_trainer_and_accelerator", "03_local_sgd", "04_adamw"]


@pytest.mark.parametrize("stem", LESSONS)
def test_practice_and_solution_differ_only_in_the_exercise_cells(stem, read_notebook):
    practice = read_notebook(PRACTICE / f"{stem}_practice.ipynb")["cells"]
    solution = read_notebook(PRACTICE / f"{stem}_solution.ipynb")["cells"]
    assert len(practice) == len(solution)
    for p, s in zip(practice, solution):
        tags = p["metadata"].get("tags", [])
        assert tags == s["metadata"].get("tags", [])
        if "exercise" in tags:
            assert "..." in "".join(p["source"]) and "..." not in "".join(s["source"])
        elif "intro" not in tags:
            assert p["source"] == s["source"], "a shared cell was edited in only one of the two notebooks"


def outputs_text(cell):
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.mark.parametrize("stem", LESSONS)
def test_every_check_answers_not_done_in_practice_and_correct_in_solution(stem, read_notebook):
    for kind, status in (("practice", "not done yet"), ("solution", "correct")):
        checks = [c for c in read_notebook(PRACTICE / f"{stem}_{kind}.ipynb")["cells"]
                  if c["cell_type"] == "code" and "".join(c["source"]).startswith("check_")]
        assert len(checks) >= 3
        for cell in checks:
            assert f": {status}." in outputs_text(cell), outputs_text(cell)


@pytest.mark.parametrize("stem", LESSONS)
def test_each_lesson_links_to_its_practice_and_the_readme_lists_it(stem, read_notebook):
    cells = read_notebook(REPO_ROOT / "notebooks" / f"{stem}.ipynb")["cells"]
    lesson = "".join("".join(c["source"]) for c in cells)
    assert f"practice/{stem}_practice.ipynb" in lesson
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"notebooks/practice/{stem}_practice.ipynb" in readme and f"{stem}_solution.ipynb" in readme
