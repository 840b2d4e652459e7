"""DistilBERT built offline from the configurations in data/models (introduced in
00_start_here). No lesson loads pretrained weights: every model is built from its
configuration, with random weights."""
import torch

from helpers.paths import DATA_DIR, REGENERATE_COMMAND

MODEL_CONFIG_DIRS = {
    # same code path, trains in seconds
    "tiny": DATA_DIR / "models" / "distilbert-tiny",
    "base": DATA_DIR / "models" / "distilbert-base-cased",  # the slides' model
}


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


def build_model(size="tiny", num_labels=2, seed=0, initialise_once=False):
    """DistilBERT for sequence classification, randomly initialised with ``seed``; no
    download.

    ``initialise_once=True`` (lesson 06) lays the model out on PyTorch's meta device,
    then allocates it and draws each weight once, from the same distributions: about
    ten times faster for the base model, with other random values.
    """
    from transformers import AutoModelForSequenceClassification

    config = model_config(size, num_labels)
    # Seed a fork of the CPU generator only: the weights are made on the CPU, the
    # learner's random numbers continue as if nothing ran, and the GPU is not touched
    # (CUDA state cannot be read in a process forked from one that used CUDA, like
    # lesson 03's workers).
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        if not initialise_once:
            return AutoModelForSequenceClassification.from_config(config)
        with torch.device("meta"):  # shapes only: no memory, no random draws
            model = AutoModelForSequenceClassification.from_config(config)
        model = model.to_empty(device="cpu")
        model.init_weights()  # Transformers' own initialisation, buffers included
        return model


def count_parameters(model):
    """(number of parameters, number of parameter tensors) of ``model``."""
    parameters = list(model.parameters())
    return sum(p.numel() for p in parameters), len(parameters)


def flat_parameters(model):
    """Every parameter of ``model`` in one 1-D tensor (detached), to compare two models'
    weights at once."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
