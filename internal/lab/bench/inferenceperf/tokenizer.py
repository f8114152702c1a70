"""Builds a local byte-level BPE tokenizer for inference-perf, offline.

inference-perf's synthetic data generators need a Hugging Face tokenizer
to cut prompts to exact token lengths. Downloading one is not possible on
an offline machine, so this trains a small byte-level BPE with the
`tokenizers` package on local text and saves it as a directory that
`transformers.AutoTokenizer.from_pretrained` loads.

    python tokenizer.py TEXT_FILE OUT_DIR [VOCAB_SIZE]

TEXT_FILE is read as JSON lines when it parses as such (every string
value is training text, as in MT-Bench's question file), else as plain
text. The training is deterministic for a given file.
"""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def texts(path):
    """Yields the training strings of path: every string of each JSON line, or the raw lines."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                yield line
                continue
            stack = [obj]
            while stack:
                v = stack.pop()
                if isinstance(v, str):
                    yield v
                elif isinstance(v, dict):
                    stack.extend(v.values())
                elif isinstance(v, list):
                    stack.extend(v)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(src), trainer=trainer)
    os.makedirs(out, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.model_max_length = 1 << 20
    fast.save_pretrained(out)
    print(f"tokenizer: {tok.get_vocab_size()} tokens in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
