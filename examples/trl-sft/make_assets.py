"""Make what TRL's SFT script needs to train offline: a small Llama-architecture model with
random weights, a word-level tokenizer and a text dataset, all built here (no hub, no network).

    python examples/trl-sft/make_assets.py [FOLDER]      (default: examples/trl-sft/assets)

FOLDER/model holds the model and its tokenizer (`--model_name_or_path FOLDER/model`),
FOLDER/data/train.jsonl the dataset (`--dataset_name FOLDER/data`). Needs transformers and
tokenizers (`pip install 'netsim-ddp[examples]'`). The same folder comes out byte-identical
for the same arguments: the weights and the text are seeded.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = ("the a one two every some packet link switch node rank gradient bucket step loss "
         "model layer wire byte queue delay rate sends reduces waits trains drops counts "
         "shapes fast slow late early small large busy idle").split()
SPECIAL = ["<pad>", "<unk>", "<eos>"]


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) + "."
            for _ in range(count)]


def make(folder: Path, *, hidden: int, layers: int, rows: int, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate([*SPECIAL, *WORDS, "."])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                        unk_token="<unk>", eos_token="<eos>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden,
                         intermediate_size=hidden * 4, num_hidden_layers=layers,
                         num_attention_heads=max(1, hidden // 64),
                         max_position_embeddings=256, pad_token_id=vocab["<pad>"],
                         eos_token_id=vocab["<eos>"], bos_token_id=None,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = None
    (folder / "model").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "data").mkdir(parents=True, exist_ok=True)
    with open(folder / "data" / "train.jsonl", "w") as out:
        for text in sentences(rows, seed):
            out.write(json.dumps({"text": text}) + "\n")
    params = sum(p.numel() for p in model.parameters())
    print(f"{folder}: model {params / 1e6:.2f}M parameters, {rows} rows of text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path,
                        default=Path(__file__).resolve().parent / "assets")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--rows", type=int, default=2000, help="dataset rows (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make(args.folder, hidden=args.hidden, layers=args.layers, rows=args.rows, seed=args.seed)


if __name__ == "__main__":
    main()
