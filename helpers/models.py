"""DistilBERT built offline from the configurations in data/models (introduced in
00_start_here)."""
import socket
from urllib.parse import urlparse

import torch

from helpers.paths import DATA_DIR, REGENERATE_COMMAND

MODEL_CONFIG_DIRS = {
    # same code path, trains in seconds
    "tiny": DATA_DIR / "models" / "distilbert-tiny",
    "base": DATA_DIR / "models" / "distilbert-base-cased",  # the slides' model
}
# the Hub name, used only when a learner opts in
PRETRAINED_NAME = "distilbert-base-cased"


def model_config(size="tiny", num_labels=2):
    """The DistilBERT configuration for ``size`` ('tiny' or 'base'), read from
    data/models."""
    from transformers import AutoConfig

    if size not in MODEL_CONFIG_DIRS:
        raise ValueError(f"unknown model size {size!r}; valid sizes are: "
                         f"{', '.join(MODEL_CONFIG_DIRS)}")
    if (not isinstance(num_labels, int) or isinstance(num_labels, bool)
        or num_labels < 1):
        raise ValueError("num_labels must be an integer >= 1 (the number of classes; "
                         "2 for paraphrase "
                         f"or not), got {num_labels!r}")
    folder = MODEL_CONFIG_DIRS[size]
    if not (folder / "config.json").exists():
        raise FileNotFoundError(
            f"data/models/{folder.name}/config.json is missing; regenerate it with: "
            f"{REGENERATE_COMMAND}")
    return AutoConfig.from_pretrained(folder, num_labels=num_labels)


def build_model(size="tiny", num_labels=2, seed=0, pretrained=False, cache_dir=None):
    """DistilBERT for sequence classification, randomly initialised with ``seed``; no
    download.

    ``pretrained=True`` (base size only) loads the real weights with ``from_pretrained``
    from the local cache or the Hub, and fails fast with a clear message when neither is
    there.
    """
    from transformers import AutoModelForSequenceClassification

    config = model_config(size, num_labels)
    if pretrained:
        return _load_pretrained(size, num_labels, cache_dir)
    # Seed a fork of the CPU generator only: the weights are made on the CPU, the
    # learner's random numbers continue as if nothing ran, and the GPU is not touched
    # (CUDA state cannot be read in a process forked from one that used CUDA, like
    # lesson 03's workers).
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config)


def preload_training_modules():
    """Import the model's and the data's code now, once (seconds): processes forked
    later share it.

    ``helpers.launcher.run_in_processes`` calls it before it forks lesson 03's workers,
    so that each worker does not import DistilBERT's modeling code, datasets and the
    tokenizer classes again.
    """
    import datasets  # noqa: F401
    import transformers.models.distilbert.modeling_distilbert  # noqa: F401
    from transformers import AutoTokenizer, DataCollatorWithPadding  # noqa: F401


def count_parameters(model):
    """(number of parameters, number of parameter tensors) of ``model``."""
    parameters = list(model.parameters())
    return sum(p.numel() for p in parameters), len(parameters)


def flat_parameters(model):
    """Every parameter of ``model`` in one 1-D tensor (detached), to compare two models'
    weights at once."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _hub_reachable(timeout_s=3.0):
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _load_pretrained(size, num_labels, cache_dir):
    from transformers import AutoModelForSequenceClassification

    if size != "base":
        raise ValueError("pretrained weights exist only for size 'base' "
                         f"({PRETRAINED_NAME}), not {size!r}")
    try:  # the cache first: no network at all
        return AutoModelForSequenceClassification.from_pretrained(PRETRAINED_NAME,
                                                                  num_labels=num_labels,
                                                                  cache_dir=cache_dir,
                                                                  local_files_only=True)
    except OSError:
        pass
    if not _hub_reachable():
        raise RuntimeError(
            f"pretrained weights for {PRETRAINED_NAME} are not in the local cache and "
            "the Hub cannot be "
            "reached. The course does not need them: call build_model(...) with "
            "pretrained=False (the "
            "default), or connect once so that from_pretrained can cache them.")
    return AutoModelForSequenceClassification.from_pretrained(
        PRETRAINED_NAME, num_labels=num_labels, cache_dir=cache_dir)
