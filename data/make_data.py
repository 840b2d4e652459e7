"""Make every file in data/: the paraphrase data set, its tokenizer, the model
configurations.

Run from the repository root:  python data/make_data.py
The output is deterministic: running it again rewrites the same bytes.
"""
import argparse
import json
import random
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
SEED = 2016  # the year of Chen et al.'s checkpointing paper; any fixed value works
SPLIT_SIZES = {"train": 4000, "validation": 400, "test": 400}
TOKENIZER_VOCAB_SIZE = 1000

# The words a sentence is built from. Each verb has synonyms so that a paraphrase
# can say the same thing with other words.
NAMES = ["Alice", "Bruno", "Chen", "Dara", "Elena", "Farid", "Grace", "Hugo", "Ines",
         "Jonas", "Kemal", "Lena", "Marta", "Nikhil", "Olga", "Pavel", "Quinn", "Rosa",
         "Samir", "Tara", "Umar", "Vera", "Wei", "Yara"]
VERBS = [("bought", ["purchased", "picked up"]),
         ("sold", ["got rid of", "traded away"]), ("repaired", ["fixed", "mended"]),
         ("painted", ["coloured", "decorated"]), ("ordered", ["requested", "booked"]),
         ("found", ["discovered", "came across"]), ("lost", ["misplaced", "mislaid"]),
         ("delivered", ["dropped off", "brought over"])]
THINGS = ["bicycles", "lamps", "chairs", "tables", "boxes", "books", "kettles",
          "clocks", "radios", "guitars", "maps", "tents", "jackets", "mirrors",
          "baskets", "drums"]
PLACES = ["Lisbon", "Oslo", "Cairo", "Lima", "Delhi", "Quito", "Seoul", "Dakar",
          "Porto", "Hanoi", "Tunis", "Bergen", "Kyoto", "Accra", "Riga", "Perth"]
COUNTS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
          "twelve"]

# How a first sentence says it, and the ways a second sentence can say it again.
FIRST_TEMPLATE = "{name} {verb} {count} {thing} in {place}."
PARAPHRASE_TEMPLATES = ["In {place}, {name} {verb} {count} {thing}.",
                        "{count} {thing} were {verb} by {name} in {place}.",
                        "It was in {place} that {name} {verb} {count} {thing}."]


def random_facts(rng):
    """One event: who did what to how many of which things, where and when."""
    return {"name": rng.choice(NAMES), "verb": rng.randrange(len(VERBS)),
            "thing": rng.choice(THINGS), "place": rng.choice(PLACES),
            "count": rng.choice(COUNTS)}


def first_sentence(facts):
    return FIRST_TEMPLATE.format(**{**facts, "verb": VERBS[facts["verb"]][0]})


def paraphrase(facts, rng):
    verb = rng.choice(VERBS[facts["verb"]][1])
    sentence = rng.choice(PARAPHRASE_TEMPLATES).format(**{**facts, "verb": verb})
    return sentence[0].upper() + sentence[1:]


def make_pair(rng, label):
    """A sentence pair: label 1 means the second sentence says the same as the first;
    label 0, that it tells another random event."""
    facts = random_facts(rng)
    other = facts
    while label == 0 and other == facts:
        other = random_facts(rng)
    return {"sentence1": first_sentence(facts), "sentence2": paraphrase(other, rng),
            "label": label}


def make_split(rng, size, start_idx):
    """Half paraphrases, half pairs of two random events. (Negatives that changed only
    one detail of the same event made the tiny model need 4 epochs instead of 3.)"""
    labels = [1] * (size // 2) + [0] * (size - size // 2)
    rng.shuffle(labels)
    return [{"idx": start_idx + offset, **make_pair(rng, label)}
            for offset, label in enumerate(labels)]


def write_splits(out_dir):
    rng = random.Random(SEED)
    paraphrase_dir = out_dir / "paraphrase"
    paraphrase_dir.mkdir(parents=True, exist_ok=True)
    start = 0
    for split, size in SPLIT_SIZES.items():
        rows = make_split(rng, size, start)
        start += size
        with open(paraphrase_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return paraphrase_dir


def train_tokenizer(paraphrase_dir, out_dir):
    """A cased WordPiece tokenizer, BERT-style, trained on the train split only."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    rows = [json.loads(line)
            for line in open(paraphrase_dir / "train.jsonl", encoding="utf-8")]
    texts = [row[key] for row in rows for key in ("sentence1", "sentence2")]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE, special_tokens=specials, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # The trainer breaks ties between equally frequent merges in hash order, so the
    # intermediate word pieces (and all ids) change from run to run. Keep what is
    # stable, the characters and the whole words it learned, in a fixed order.
    learned = tokenizer.get_vocab()
    words = {word for text in texts
             for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)}
    missing = sorted(words - learned.keys())
    if missing:
        raise RuntimeError("raise TOKENIZER_VOCAB_SIZE: these words got no token of "
                           f"their own: {missing}")
    pieces = [t for t in learned if len(t) == 1 or (t.startswith("##") and len(t) == 3)]
    vocab = specials + sorted(set(pieces) - set(specials)) + sorted(words - set(pieces))
    tokenizer.model = models.WordPiece(
        vocab={t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"
    )
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=128,
        # DistilBERT takes no token_type_ids
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer_dir = out_dir / "tokenizer"
    fast.save_pretrained(tokenizer_dir)
    return fast


def write_model_configs(out_dir, vocab_size):
    """The real distilbert-base-cased architecture, and a tiny one with the same code
    path."""
    common = {"model_type": "distilbert",
              "architectures": ["DistilBertForSequenceClassification"],
              "activation": "gelu", "dropout": 0.1, "attention_dropout": 0.1,
              "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "initializer_range": 0.02,
              "pad_token_id": 0, "sinusoidal_pos_embds": False, "tie_weights_": True}
    configs = {
        "distilbert-base-cased": {**common, "vocab_size": 28996, "dim": 768,
                                  "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
                                  "max_position_embeddings": 512},
        "distilbert-tiny": {
            **common,
            "vocab_size": vocab_size,
            "dim": 64,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 256,
            "max_position_embeddings": 128,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "seq_classif_dropout": 0.0,
            # a wider initialisation lets this model, trained from
            # scratch, learn in seconds
            "initializer_range": 0.1,
        },
    }
    for name, config in configs.items():
        folder = out_dir / "models" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(
            json.dumps(config, indent=2, sort_keys=True) + "\n"
        )


def write_planner_model_configs(out_dir):
    """Published architectures for lesson 07's planner (configuration files only: the
    planner lays them out on the meta device, no weights), and two tiny ones with their
    code paths for its live validation. Values as in each model's published config.json
    on the Hugging Face Hub."""
    llama3_rope = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
             "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
             "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1,
             "tie_word_embeddings": False, "use_cache": True}
    llama3 = {**llama, "vocab_size": 128256, "num_key_value_heads": 8,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "rope_scaling": llama3_rope,
              "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 128}
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "activation_function": "gelu_new", "attn_pdrop": 0.1, "embd_pdrop": 0.1,
            "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
            "bos_token_id": 50256, "eos_token_id": 50256, "vocab_size": 50257,
            "n_positions": 1024, "n_ctx": 1024, "n_embd": 768, "n_head": 12,
            "n_layer": 12}
    configs = {
        "bert-large-uncased": {
            "model_type": "bert", "architectures": ["BertForMaskedLM"],
            "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "hidden_size": 1024, "initializer_range": 0.02,
            "intermediate_size": 4096, "layer_norm_eps": 1e-12,
            "max_position_embeddings": 512, "num_attention_heads": 16,
            "num_hidden_layers": 24, "pad_token_id": 0,
            "position_embedding_type": "absolute", "type_vocab_size": 2,
            "vocab_size": 30522},
        "gpt2": gpt2,
        # the same code path, small enough to train here
        "gpt2-tiny": {**gpt2, "vocab_size": 1024, "n_positions": 256, "n_ctx": 256,
                      "n_embd": 64, "n_head": 4, "n_layer": 2, "bos_token_id": 1023,
                      "eos_token_id": 1023},
        "llama-2-7b": {**llama, "vocab_size": 32000, "hidden_size": 4096,
                       "intermediate_size": 11008, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32,
                       "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                       "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2},
        "llama-3.1-8b": {**llama3, "hidden_size": 4096, "intermediate_size": 14336,
                         "num_hidden_layers": 32, "num_attention_heads": 32},
        "llama-3.1-70b": {**llama3, "hidden_size": 8192, "intermediate_size": 28672,
                          "num_hidden_layers": 80, "num_attention_heads": 64},
        # the same code path (grouped-query attention included), small
        "llama-tiny": {**llama, "vocab_size": 1024, "hidden_size": 64,
                       "intermediate_size": 176, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "num_key_value_heads": 2,
                       "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                       "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2},
    }
    for name, config in configs.items():
        folder = out_dir / "models" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(
            json.dumps(config, indent=2, sort_keys=True) + "\n"
        )


def main(out_dir=DATA_DIR):
    out_dir = Path(out_dir)
    paraphrase_dir = write_splits(out_dir)
    tokenizer = train_tokenizer(paraphrase_dir, out_dir)
    write_model_configs(out_dir, vocab_size=len(tokenizer))
    write_planner_model_configs(out_dir)
    print(f"wrote the data set, tokenizer and model configurations under {out_dir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DATA_DIR, help="folder to write into "
                                                        "(default: data/)")
    main(parser.parse_args().out)
