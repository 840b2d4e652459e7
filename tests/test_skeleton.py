"""The course foundation: offline model, offline data, tokenizer, determinism, clear
errors."""
import filecmp
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import data as course_data
from helpers.device import NetworkBlockedError, get_device, no_network
from helpers.models import (
    MODEL_CONFIG_DIRS,
    build_model,
    count_parameters,
    model_config,
)
from helpers.paths import REPO_ROOT


def test_full_size_distilbert_builds_offline_with_the_slides_parameter_count():
    with no_network():
        model = build_model("base", num_labels=2)
    assert count_parameters(model) == (65_783_042, 104)


def test_tiny_model_takes_the_same_code_path():
    tiny, base = build_model("tiny"), build_model("base")
    assert type(tiny) is type(base)
    def tensor_kinds(model):  # parameter names with the layer number taken out
        return {re.sub(r"layer\.\d+\.", "layer.N.", name)
                for name, _ in model.named_parameters()}
    # same tensors, fewer layers, smaller shapes
    assert tensor_kinds(tiny) == tensor_kinds(base)
    assert count_parameters(tiny)[0] < 1_000_000


def test_same_seed_same_weights_and_other_seed_other_weights():
    a, b, c = build_model(seed=1), build_model(seed=1), build_model(seed=2)
    torch.testing.assert_close(a.state_dict(), b.state_dict())
    assert not torch.equal(a.classifier.weight, c.classifier.weight)


def test_the_seed_gives_the_weights_of_seeding_torch_and_building_from_the_config():
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(3)
    reference = AutoModelForSequenceClassification.from_config(model_config("tiny"))
    torch.testing.assert_close(
        build_model("tiny", seed=3).state_dict(), reference.state_dict(), rtol=0, atol=0
    )


def test_initialising_once_draws_from_the_same_distributions():
    usual, once = build_model("tiny"), build_model("tiny", initialise_once=True)
    buffers = dict(once.named_buffers())  # position ids: not in the state dict
    assert all(torch.equal(buffers[name], b) for name, b in usual.named_buffers())
    for (name, a), (other, b) in zip(usual.named_parameters(), once.named_parameters()):
        assert (name, a.shape, a.dtype) == (other, b.shape, b.dtype)
        assert torch.isfinite(b).all(), name  # nothing left as to_empty's garbage
        if a.numel() >= 1000:  # enough values for their spread to agree
            assert b.std().item() == pytest.approx(a.std().item(), rel=0.2), name
        else:  # biases 0, LayerNorm weights 1: the same values
            assert b.std() <= a.std() * 1.2 + 1e-6, name
    assert build_model("tiny", seed=3, initialise_once=True).state_dict().keys() == (
        usual.state_dict().keys())


def test_building_a_model_leaves_the_learners_random_numbers_alone():
    def draws_after_seeding(build_first):
        torch.manual_seed(123)
        if build_first:
            build_model(seed=0)
        # the CPU's generator, and the GPU's where there is one: torch.manual_seed seeds
        # both
        return torch.rand(3), torch.rand(3, device=get_device()).cpu()

    torch.testing.assert_close(
        draws_after_seeding(True), draws_after_seeding(False), rtol=0, atol=0
    )


@pytest.mark.parametrize("bad", [0, -3, 2.0, "2", True])
def test_bad_num_labels_says_what_is_valid(bad):
    with pytest.raises(
        ValueError,
        match=r"num_labels must be an integer >= 1.*got " + re.escape(repr(bad)),
    ):
        build_model("tiny", num_labels=bad)


def test_unknown_model_size_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown model size 'huge'.*tiny, base"):
        build_model("huge")


def test_no_network_really_blocks_connections():
    import socket
    with no_network(), pytest.raises(NetworkBlockedError):
        socket.create_connection(("127.0.0.1", 9))


def test_the_tiny_model_runs_a_forward_pass_on_the_device_the_lessons_use():
    device = get_device()
    model = build_model("tiny").to(device)
    logits = model(input_ids=torch.arange(16, device=device).reshape(2, 8)).logits
    assert logits.shape == (2, 2) and logits.device.type == device.type
    # the README's promise: a CUDA GPU whenever PyTorch sees one, else the CPU
    assert logits.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_splits_columns_and_label_balance():
    with no_network():
        dataset = course_data.load_paraphrase_dataset()
    assert {split: dataset[split].num_rows for split in dataset} == {"train": 4000,
                                                                     "validation": 400,
                                                                     "test": 400}
    for split in dataset.values():
        assert set(split.column_names) == {"idx", "sentence1", "sentence2", "label"}
        labels = split["label"]
        assert set(labels) == {0, 1}
        majority_share = max(labels.count(0), labels.count(1)) / len(labels)
        assert majority_share <= 0.55


def test_splits_share_no_sentence_pair():
    dataset = course_data.load_paraphrase_dataset()
    pairs = {split: set(zip(dataset[split]["sentence1"], dataset[split]["sentence2"]))
             for split in dataset}
    assert not pairs["train"] & pairs["validation"]
    assert not pairs["train"] & pairs["test"]


def test_tokenizer_round_trip_on_a_sentence_pair():
    tokenizer = course_data.load_tokenizer()
    first, second = "Alice bought two lamps in Oslo.", ("In Oslo, Alice purchased two "
                                                        "lamps.")
    encoded = tokenizer(first, second)
    # DistilBERT takes no token_type_ids
    assert set(encoded) == {"input_ids", "attention_mask"}
    assert tokenizer.decode(encoded["input_ids"]) == (f"[CLS] {first} [SEP] {second} "
                                                      "[SEP]")
    assert tokenizer.unk_token_id not in encoded["input_ids"]


def test_same_seed_gives_the_same_batch():
    tokenized, tokenizer = course_data.load_tokenized()
    def first_batch(seed):
        return next(
            iter(
                course_data.make_dataloader(
                    tokenized["train"], tokenizer, 8, shuffle=True, seed=seed
                )
            )
        )
    a, b, c = first_batch(0), first_batch(0), first_batch(1)
    torch.testing.assert_close(dict(a), dict(b))
    assert not torch.equal(a["labels"], c["labels"]) or not torch.equal(
        a["input_ids"], c["input_ids"]
    )


def test_missing_data_file_names_the_file_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(course_data, "PARAPHRASE_DIR", tmp_path / "paraphrase")
    monkeypatch.setattr(course_data, "REPO_ROOT", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"paraphrase/train\.jsonl.*python "
                                                r"data/make_data\.py"):
        course_data.load_paraphrase_dataset()


def test_missing_model_configuration_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setitem(MODEL_CONFIG_DIRS, "tiny", tmp_path / "distilbert-tiny")
    with pytest.raises(FileNotFoundError, match="python data/make_data.py"):
        build_model("tiny")


@pytest.fixture(scope="module")
def generated_data(tmp_path_factory):
    """A fresh run of data/make_data.py: the folder it wrote and the files in it,
    relative to it."""
    out = tmp_path_factory.mktemp("data")
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "data" / "make_data.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    made = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert made, "the generator wrote nothing"
    return out, made


def test_the_committed_data_is_what_the_generator_makes(generated_data):
    out, made = generated_data
    for relative in sorted(made):
        assert filecmp.cmp(
            out / relative, REPO_ROOT / "data" / relative, shallow=False
        ), relative


def test_every_committed_data_file_is_made_by_the_generator(generated_data):
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout, to list the committed files "
                    "under data/")
    listing = subprocess.run(["git", "ls-files", "data"], cwd=REPO_ROOT, check=True,
                             capture_output=True, text=True)
    committed = {line.removeprefix("data/") for line in listing.stdout.splitlines()
                 # recorded by tools/record_reference.py and tools/validate_planner.py
                 if not line.startswith(("data/reference/", "data/planner/"))}
    committed -= {"make_data.py", "README.md"}
    assert committed, "git lists no data files"
    _, made = generated_data
    assert not committed - made, ("committed under data/ but not made by "
                                  f"make_data.py: {sorted(committed - made)}")


def test_base_configuration_is_the_distilbert_base_cased_architecture():
    config = json.loads((MODEL_CONFIG_DIRS["base"] / "config.json").read_text())
    expected = {"vocab_size": 28996, "dim": 768, "n_layers": 6, "n_heads": 12,
                "hidden_dim": 3072, "max_position_embeddings": 512}
    assert {key: config[key] for key in expected} == expected


def test_the_version_checks_read_the_pins_and_say_what_is_wrong():
    from helpers.device import environment_report, pinned_versions, version_checks

    # the pin DEVELOPERS.md and requirements.txt require
    assert pinned_versions()["torch"] == "2.13.0"
    # this venv
    assert all(
        line.endswith(("as pinned", "(3.11 to 3.13)")) for line in version_checks()
    )
    # lesson 4's version, checked
    assert any(line.startswith("bitsandbytes: ") for line in version_checks())
    report = {**environment_report(), "python": "3.10.4", "torch": "2.12.1+cu126"}
    lines = version_checks(report)
    assert lines[0] == "python: 3.10.4 is not supported: use Python 3.11 to 3.13"
    assert lines[1] == ("torch: 2.12.1, but requirements.txt pins 2.13.0: run "
                        "`make lab` again")
    report = {**environment_report(), "python": "3.13.1", "torch": "2.13.0+cu126"}
    assert version_checks(report)[:2] == ["python: supported (3.11 to 3.13)",
                                          "torch: 2.13.0, as pinned"]


@pytest.mark.parametrize("cuda, hip, mps_built, mps_available, gpus, expected", [
    # pip's torch on Linux, no GPU
    ("13.0", None, False, False, 0, "CUDA 13.0, no GPU visible"),
    ("12.6", None, False, False, 2, "CUDA 12.6, 2 GPUs visible"),
    # PyTorch's CPU index, or Windows
    (None, None, False, False, 0, "CPU only, no GPU visible"),
    (None, "6.4", False, False, 1, "ROCm 6.4, 1 GPU visible"),
    # macOS
    (None, None, True, True, 0,
     "CPU, with Apple's MPS, Apple GPU visible (the lessons use the CPU)")])
def test_the_torch_build_line_says_what_torch_was_built_for_and_the_gpus_it_sees(
        cuda, hip, mps_built, mps_available, gpus, expected, monkeypatch):
    from helpers.device import torch_build

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.version, "xpu", None, raising=False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: mps_built)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps_available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    line = torch_build()
    assert line == expected
    # lesson 00 prints it; nbval compares its form, not the machine's build
    # (tests/nbval_sanitize.cfg)
    from test_ranges import sanitize
    assert sanitize(f"python: ok\ntorch build: {line}\ndevice: cpu\n") == \
        "python: ok\ntorch build: THIS MACHINE'S BUILD\ndevice: cpu\n"


def test_the_torch_build_line_of_this_torch():
    from helpers.device import torch_build

    # the reference: torch.version itself
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    assert torch_build().startswith(build)
    assert torch_build().endswith("no GPU visible") == (torch.cuda.device_count() == 0)


def test_a_torch_build_line_of_another_form_is_compared_not_hidden():
    from test_ranges import sanitize

    for line in ("torch build: CUDA 13.0", "torch build: CPU only, no GPUs visible",
                 "torch: CPU only, no GPU visible"):
        assert sanitize(line) == line
