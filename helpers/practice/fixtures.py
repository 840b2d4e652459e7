"""What the practice checks (lessons 01-06) run answers on, toy models included, on the
GPU if any, as the lessons: Accelerate refuses use_cpu=True after a GPU Accelerator."""
import contextlib
import functools
import gc
import tempfile
from types import SimpleNamespace

import torch

from helpers.data import load_tokenized, make_dataloader
from helpers.models import build_model
from helpers.practice.core import learner, returned
from helpers.random_state import global_random_state_kept

ON_CPU = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if ON_CPU else "cuda")


def tiny_model(seed=0):
    """The tiny DistilBERT with eager attention, on the checks' device."""
    model = build_model("tiny", seed=seed)
    model.set_attn_implementation("eager")
    return model.to(DEVICE)


@functools.lru_cache(maxsize=None)
def training_examples(n):
    """(the first ``n`` tokenized training examples, the course's tokenizer)."""
    tokenized, tokenizer = load_tokenized()
    return tokenized["train"].select(range(n)), tokenizer


def fixed_batches(batch_size, count):
    """``count`` batches of ``batch_size`` training examples, the same every time."""
    examples, tokenizer = training_examples(batch_size * count)
    return [{key: value.to(DEVICE) for key, value in batch.items()}
            for batch in make_dataloader(examples, tokenizer, batch_size)]


@contextlib.contextmanager
def fresh_accelerate_state(states=None):
    """Accelerate's state made ``states`` (or clean); yields the learner's, put back."""
    from accelerate.state import AcceleratorState, PartialState
    # Borgs: an instance's __dict__ is its class's _shared_state, so swapping the dicts
    # leaves the learner's Accelerators whole
    classes = (PartialState, AcceleratorState)
    learners = [vars(cls)["_shared_state"] for cls in classes]
    for cls, state in zip(classes, states or ({}, {})):
        cls._shared_state = state
    try:
        yield learners
    finally:
        for cls, state in zip(classes, learners):
            cls._shared_state = state


def args_with(**settings):
    """make_training_args as a learner writes it: TrainingArguments(``settings``)."""
    from transformers import TrainingArguments
    return lambda folder: TrainingArguments(folder, report_to="none", **settings)


def learners_arguments(make_training_args):
    """The TrainingArguments the learner's ``make_training_args`` returns (or Wrong)."""
    from transformers import TrainingArguments
    with tempfile.TemporaryDirectory() as folder, fresh_accelerate_state():
        return returned(learner(make_training_args, folder), TrainingArguments,
                        "make_training_args")


def trainer_run(examples, micro_batch_size, accumulation=1, make_args=None,
                model=None, compute_loss_func=None, steps=1, **arguments):
    """The Trainer after ``steps`` steps on ``examples`` examples; states put back."""
    from transformers import DataCollatorWithPadding, Trainer
    from transformers.trainer_callback import PrinterCallback
    one_step = dict(max_steps=steps, logging_steps=1, save_strategy="no", report_to=[],
                    per_device_train_batch_size=micro_batch_size, disable_tqdm=True,
                    gradient_accumulation_steps=accumulation, eval_strategy="no",
                    train_sampling_strategy="sequential", dataloader_pin_memory=False)
    data, tokenizer = training_examples(examples)
    with (tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as output_dir,
          fresh_accelerate_state(), global_random_state_kept()):
        args = (make_args or args_with(use_cpu=ON_CPU, **arguments))(output_dir)
        vars(args).update(one_step)  # made a short run
        trainer = Trainer(model=model or tiny_model(), args=args, train_dataset=data,
                          compute_loss_func=compute_loss_func,
                          data_collator=DataCollatorWithPadding(tokenizer))
        trainer.remove_callback(PrinterCallback)  # it would print every log
        gc.freeze()  # train() starts with gc.collect(): 0.5 s over a kernel's objects
        try:
            trainer.train()
        finally:
            gc.unfreeze()
    return trainer


def logged_losses(trainer):  # the training losses, one per optimizer step
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


class SmallClassifier(torch.nn.Sequential):
    """Practice 3's: Linears and dropout (so eval() matters); ``model(**batch).loss``"""

    def __init__(self, hidden, features=8, classes=2):
        linear, relu, drop = torch.nn.Linear, torch.nn.ReLU, torch.nn.Dropout(0.1)
        super().__init__(linear(features, hidden), relu(), drop, linear(hidden, hidden),
                         relu(), drop, linear(hidden, classes))

    def forward(self, inputs, labels):
        logits = super().forward(inputs)
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels))


class GatedBlock(torch.nn.Module):
    """A residual gated MLP (SwiGLU, as in Llama): h + down(silu(gate(h)) * up(h))."""

    def __init__(self, width, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(width, hidden)
        self.up_proj = torch.nn.Linear(width, hidden)
        self.down_proj = torch.nn.Linear(hidden, width)

    def forward(self, h):  # h: (rows, width); each Linear runs as aten.addmm
        gate, up = self.gate_proj(h), self.up_proj(h)  # (rows, hidden) each
        return h + self.down_proj(torch.nn.functional.silu(gate) * up)


class SmallNet(torch.nn.Module):
    """Exercise 5.1's model: embedding, Linear, GELU, LayerNorm, Linear, softmax."""

    def __init__(self, vocabulary=50, width=16, hidden=64, classes=4):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocabulary, width)
        self.up = torch.nn.Linear(width, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.down = torch.nn.Linear(hidden, classes)

    def forward(self, tokens, targets):
        h = self.embedding(tokens)  # (batch, width)
        h = torch.nn.functional.gelu(self.up(h))  # (batch, hidden)
        h = self.norm(h)
        probabilities = self.down(h).softmax(dim=-1)  # (batch, classes)
        return torch.nn.functional.mse_loss(probabilities, targets)
