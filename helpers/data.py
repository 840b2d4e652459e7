"""The paraphrase data set and its tokenizer, loaded from data/ (introduced in
00_start_here)."""
import contextlib

import torch

from helpers.paths import DATA_DIR, REGENERATE_COMMAND, REPO_ROOT

PARAPHRASE_DIR = DATA_DIR / "paraphrase"
TOKENIZER_DIR = DATA_DIR / "tokenizer"
SPLITS = ("train", "validation", "test")


def _require(path):
    if not path.exists():
        relative = path.relative_to(REPO_ROOT)
        raise FileNotFoundError(f"{relative} is missing; regenerate the course data "
                                f"with: {REGENERATE_COMMAND}")
    return path


@contextlib.contextmanager
def _quiet_datasets():
    """Hide datasets' progress bars (they change from run to run), then restore the
    setting."""
    from datasets.utils import logging as datasets_logging

    was_enabled = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            datasets_logging.enable_progress_bar()


def load_paraphrase_dataset():
    """The MRPC-shaped paraphrase data (sentence1, sentence2, label) as a
    DatasetDict."""
    from datasets import load_dataset

    files = {
        split: str(_require(PARAPHRASE_DIR / f"{split}.jsonl")) for split in SPLITS
    }
    with _quiet_datasets():
        return load_dataset("json", data_files=files)


def load_tokenizer():
    """The WordPiece tokenizer trained on the train split, via AutoTokenizer."""
    from transformers import AutoTokenizer

    _require(TOKENIZER_DIR / "tokenizer.json")
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def tokenize_dataset(dataset, tokenizer, max_length=64):
    """Tokenize sentence pairs; keep only input_ids, attention_mask and labels."""
    def encode(batch):
        return tokenizer(batch["sentence1"], batch["sentence2"], truncation=True,
                         max_length=max_length)

    with _quiet_datasets():
        encoded = dataset.map(encode, batched=True)
        encoded = encoded.rename_column("label", "labels")
        keep = {"input_ids", "attention_mask", "labels"}
        return encoded.remove_columns(
            [c for c in encoded["train"].column_names if c not in keep]
        )


def load_tokenized(max_length=64):
    """(tokenized DatasetDict, tokenizer): the one-liner most lessons start from."""
    tokenizer = load_tokenizer()
    return tokenize_dataset(load_paraphrase_dataset(), tokenizer, max_length), tokenizer


def make_dataloader(split, tokenizer, batch_size=32, shuffle=False, seed=0):
    """A DataLoader over one tokenized split, padding each batch; ``seed`` fixes the
    order."""
    from transformers import DataCollatorWithPadding

    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(
        split, batch_size=batch_size, shuffle=shuffle, generator=generator,
        collate_fn=DataCollatorWithPadding(tokenizer, return_tensors="pt"))
