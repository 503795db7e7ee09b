"""Writes what torchtitan's llama3 debug model reads besides its code, which its wheel
leaves out (its repository's tests/assets): a tokenizer of at most the model's 2,048
tokens and a small text corpus in C4's layout, both made here, deterministically, so a
GPU machine without internet runs the example.

    python examples/torchtitan/assets.py DIR    # DIR/tokenizer/, DIR/corpus/train.jsonl

The corpus is sentences drawn with a fixed seed from a small grammar (the model learns
its statistics, so the loss falls); the tokenizer is a byte-level BPE trained on it
(Hugging Face ``tokenizers``) with Llama 3's begin/end-of-text tokens. Pass them to
torchtitan as ``--hf_assets_path=DIR/tokenizer --dataloader.dataset_path=DIR/corpus``.
"""

from __future__ import annotations

import json
import os
import random
import sys

#: The debug model's vocabulary (torchtitan/models/llama3/__init__.py: _debugmodel).
VOCAB = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

SUBJECTS = ["the scheduler", "a training job", "the cluster", "every worker", "the planner", "a pipeline stage"]
VERBS = ["moves", "measures", "shards", "checkpoints", "resumes", "restarts", "allocates", "predicts"]
OBJECTS = ["the optimizer states", "its activations", "four GPUs", "the gradients", "a micro-batch", "the layers"]
TAILS = ["before the next round", "after a reconfiguration", "at every step", "when memory runs out", "in parallel"]


def corpus(documents: int = 2000, seed: int = 0) -> list[str]:
    """``documents`` texts of a few sentences each, the same for the same seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(documents):
        sentences = []
        for _ in range(rng.randint(3, 12)):
            number = rng.randint(1, 512)
            parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(TAILS)]
            sentences.append(f"{' '.join(parts).capitalize()} ({number}).")
        out.append(" ".join(sentences))
    return out


def write(directory: str) -> None:
    """The tokenizer and the corpus under ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = corpus()
    data = os.path.join(directory, "corpus")
    tok = os.path.join(directory, "tokenizer")
    os.makedirs(data, exist_ok=True)
    os.makedirs(tok, exist_ok=True)
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.get_vocab_size() > VOCAB:
        raise SystemExit(f"assets: the tokenizer has {tokenizer.get_vocab_size()} tokens, more than {VOCAB}")
    tokenizer.save(os.path.join(tok, "tokenizer.json"))
    with open(os.path.join(tok, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False}, f)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    write(argv[0])
    print(f"assets: {argv[0]}/tokenizer and {argv[0]}/corpus written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
