"""Data-parallel training with and without Local SGD, on two or more real processes
(lesson 03).

``train_loop`` is lesson 2's Accelerate loop plus the slide's Local SGD lines, as
lesson 03 shows it.
``launch(configs)`` runs it from a notebook on 2 processes (through
``helpers.launcher``), and measures from outside the loop what each run communicated
(``helpers.collectives``). The same training runs as a script:

    accelerate launch --multi_gpu --num_processes 2 helpers/local_sgd.py
    --local-sgd-steps 8

(``--multi_gpu`` makes Accelerate start the processes with torchrun; without a GPU the
worker's ``Accelerator(cpu=True)`` connects them over gloo. With ``--cpu`` instead,
Accelerate 1.x starts a single process, and the worker refuses to run alone.)
"""
import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate.local_sgd import LocalSGD

from helpers.collectives import CollectiveCounter, count_ddp, weight_gap
from helpers.launcher import LAUNCH_TIMEOUT_S, run_in_processes, worker_accelerator
from helpers.training import LEARNING_RATE, MAX_GRAD_NORM, WARMUP_SHARE, WEIGHT_DECAY


@dataclass
class RunConfig:
    """One training run. ``local_sgd_steps=None`` is plain data parallelism (DDP)."""
    name: str
    # counts calls of local_sgd.step(): micro-batches
    local_sgd_steps: int | None = None
    optimizer_steps: int = 250  # the same for every run, so that costs compare
    # per process: a global batch of 64 on 2, lesson 2's Trainer batch
    micro_batch_size: int = 32
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
    learning_rate: float = LEARNING_RATE
    seed: int = 0
    # also measure how far apart the workers' weights are, after every step
    track_drift: bool = False
    # the validation loss and accuracy at the end (None when False)
    evaluate: bool = True

    def __post_init__(self):
        validate_local_sgd_steps(self.local_sgd_steps)
        for field in ("optimizer_steps", "micro_batch_size",
                      "gradient_accumulation_steps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a whole number >= 1, got {value!r}")


def validate_local_sgd_steps(local_sgd_steps):
    """``local_sgd_steps`` must be None (plain DDP) or a whole number >= 1."""
    if local_sgd_steps is None:
        return
    if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int):
        raise TypeError("local_sgd_steps must be a whole number of steps (an int), "
                        f"got {local_sgd_steps!r}")
    if local_sgd_steps < 1:
        raise ValueError("local_sgd_steps must be at least 1 (1 synchronizes every "
                         f"step), got {local_sgd_steps}")


# The deck's Local SGD loop, line for line as lesson 03 shows it (a test checks it,
# tests/test_new_lines.py): lesson 2's Accelerate loop plus the lines marked NEW.
def train_loop(accelerator, model, optimizer, lr_scheduler, dataloader):
    model.train()
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8,  # NEW
                  enabled=True) as local_sgd:  # NEW
        for batch in dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                local_sgd.step()  # NEW


# train_loop with k and enabled as arguments, its lines otherwise the same (a test
# checks): the DDP runs (enabled=False: LocalSGD does nothing) and other values of k.
def train_loop_every(accelerator, model, optimizer, lr_scheduler, dataloader,
                     local_sgd_steps, enabled):
    model.train()
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps,
                  enabled=enabled) as local_sgd:
        for batch in dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                local_sgd.step()


def run_loop(accelerator, model, optimizer, lr_scheduler, dataloader, local_sgd_steps):
    """DDP when ``local_sgd_steps`` is None, else Local SGD every ``local_sgd_steps``
    calls of ``local_sgd.step()`` (micro-batches): k = 8 runs the deck's loop itself."""
    if local_sgd_steps == 8:
        train_loop(accelerator, model, optimizer, lr_scheduler, dataloader)
    elif local_sgd_steps is None:  # DDP
        train_loop_every(accelerator, model, optimizer, lr_scheduler, dataloader,
                         local_sgd_steps=1, enabled=False)
    else:
        train_loop_every(accelerator, model, optimizer, lr_scheduler, dataloader,
                         local_sgd_steps=local_sgd_steps, enabled=True)


def micro_batches(dataloader, count):
    """``count`` micro-batches from ``dataloader``, starting a new pass over the data as
    often as needed."""
    served = 0
    while served < count:
        for batch in dataloader:
            yield batch
            served += 1
            if served == count:
                return


def measured(batches, optimizer, counter, on_step=None):
    """``batches``, labelling the collectives of each micro-batch with the optimizer
    step it belongs to.

    Watches from outside the loop: the optimizer's step hook counts real optimizer
    steps, and ``on_step(step)`` runs once the loop has finished an optimizer step
    (after local_sgd.step(), when the next batch is drawn, or when the batches run out).
    """
    steps_done = [0]
    # inside Accelerate's wrapper: steps really taken
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)
    torch_optimizer.register_step_post_hook(
        lambda *args: steps_done.__setitem__(0, steps_done[0] + 1)
    )
    reported = 0
    for batch in batches:
        if on_step and steps_done[0] > reported:
            reported = steps_done[0]
            on_step(reported)
        # the optimizer step this micro-batch belongs to
        counter.step = steps_done[0] + 1
        yield batch
    if on_step and steps_done[0] > reported:
        on_step(steps_done[0])


def train_one_run(accelerator, config, tokenized, tokenizer):
    """Build, train (DDP or Local SGD) and evaluate one run; return what was measured on
    this process."""
    from transformers import get_linear_schedule_with_warmup

    from helpers.data import make_dataloader
    from helpers.metrics import evaluate
    from helpers.models import build_model

    accelerator.gradient_accumulation_steps = config.gradient_accumulation_steps
    model = build_model("tiny", seed=config.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=WEIGHT_DECAY
    )
    dataloader = make_dataloader(tokenized["train"], tokenizer, config.micro_batch_size,
                                 shuffle=True, seed=config.seed)
    # A prepared scheduler advances once per process at every optimizer step (Accelerate
    # assumes it was sized for one process), so size it for all of them.
    total = config.optimizer_steps * accelerator.num_processes
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, math.ceil(WARMUP_SHARE * total), total
    )
    model, optimizer, dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, dataloader, lr_scheduler
    )
    count_ddp(model)
    counter, losses, gaps = CollectiveCounter(), [], []
    # each micro-batch's training loss, read from the model's output as the loop runs
    loss_hook = model.register_forward_hook(
        lambda module, inputs, outputs: losses.append(outputs.loss.item())
    )
    track = ((lambda step: gaps.append((step, weight_gap(accelerator, model, counter))))
             if config.track_drift else None)
    batches = micro_batches(
        dataloader, config.optimizer_steps * config.gradient_accumulation_steps
    )
    start = time.perf_counter()
    with counter:
        run_loop(accelerator, model, optimizer, lr_scheduler,
                 measured(batches, optimizer, counter, track), config.local_sgd_steps)
    seconds = time.perf_counter() - start
    loss_hook.remove()
    final_gap = weight_gap(accelerator, model, counter)
    val_metrics = {"loss": None, "accuracy": None}
    if config.evaluate:
        validation = make_dataloader(tokenized["validation"], tokenizer, batch_size=128)
        val_metrics = evaluate(
            accelerator.unwrap_model(model), validation, accelerator.device
        )
    events_by_rank = accelerator.gather_for_metrics(
        [counter.events], use_gather_object=True
    )
    return {"config": asdict(config), "seconds": seconds, **counter.totals(),
            "events_by_rank": events_by_rank,
            "train_loss": sum(losses[-20:]) / len(losses[-20:]),
            "val_loss": val_metrics["loss"], "val_accuracy": val_metrics["accuracy"],
            "gaps": gaps, "final_gap": final_gap}


def train_worker(accelerator, configs):
    """What every process runs: each config in turn; returns the runs (process 0's
    result is kept)."""
    from helpers.data import load_tokenized

    if accelerator.num_processes < 2:
        raise RuntimeError(
            f"only {accelerator.num_processes} process joined the training, so there "
            "is nothing to synchronize and "
            "LocalSGD would silently do nothing. Start it with "
            "helpers.local_sgd.launch(...), with "
            "notebook_launcher(..., num_processes=2) and Accelerator(cpu=True) made "
            "in each process when there is no "
            "GPU, or with `accelerate launch --multi_gpu --num_processes 2`.")
    tokenized, tokenizer = load_tokenized()
    runs = [train_one_run(accelerator, as_config(config), tokenized, tokenizer)
            for config in configs]
    return {"processes": accelerator.num_processes, "runs": runs}


def as_config(config):
    """A RunConfig from a RunConfig or a dict of its fields (validated)."""
    return config if isinstance(config, RunConfig) else RunConfig(**config)


def launch(configs, num_processes=2, port=None, timeout_s=LAUNCH_TIMEOUT_S):
    """Train each of ``configs`` on ``num_processes`` processes started from a notebook;
    process 0's results.

    The configs are checked here, before any process starts; see
    ``helpers.launcher.run_in_processes`` for what the launch guards against (an
    existing Accelerator, a busy port, failing or stuck workers).
    """
    configs = [asdict(as_config(config)) for config in configs]
    return run_in_processes(train_worker, (configs,), num_processes, port, timeout_s)


def main():
    """The script form: one run, on the processes that `accelerate launch` or torchrun
    started."""
    parser = argparse.ArgumentParser(description="Data-parallel training of the tiny "
                                                 "DistilBERT, with Local SGD.")
    parser.add_argument("--local-sgd-steps", type=int, default=None,
                        help="synchronize every K steps (default: DDP)")
    parser.add_argument(
        "--optimizer-steps", type=int, default=RunConfig.optimizer_steps
    )
    parser.add_argument("--results", default="local_sgd_results.json",
                        help="where process 0 writes the results")
    args = parser.parse_args()
    name = f"Local SGD k={args.local_sgd_steps}" if args.local_sgd_steps else "DDP"
    config = RunConfig(name, args.local_sgd_steps, optimizer_steps=args.optimizer_steps)
    torch.set_num_threads(1)  # one core per process: the processes share the machine
    accelerator = worker_accelerator()
    results = train_worker(accelerator, [config])
    if accelerator.is_main_process:
        Path(args.results).write_text(json.dumps(results))
        run = results["runs"][0]
        print(f"{name}: {run['collectives']} collectives, {run['bytes']:,} bytes "
              "sent per process, "
              f"validation loss {run['val_loss']:.3f}")
    accelerator.wait_for_everyone()
    accelerator.end_training()  # not forked: destroying the process group is safe here
    # End without finalizing the interpreter, as forked workers end (multiprocessing's
    # os._exit). A gloo thread may still be freeing a finished collective's tensors,
    # which takes the GIL, and on Python <= 3.13 a thread that takes it during
    # finalization is ended (the note on PyGILState_Ensure, Python's C-API docs) in the
    # middle of C++ code: the process aborts, "terminate called without an active
    # exception" (2 launches of about 240 here).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
