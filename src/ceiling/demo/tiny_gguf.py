"""Build a tiny Llama as one GGUF file, for llama.cpp (llama-cpp-python's server).

Run it with the llama.cpp environment's Python (it needs ``gguf`` and ``numpy``, which
scripts/install-llamacpp.sh installs there; ceiling's own environment does not have them)::

    .engines/llamacpp/bin/python src/ceiling/demo/tiny_gguf.py OUT.gguf

The model mirrors ``tiny_model.py`` (docs/engines.md, "The tiny model"): llama architecture,
hidden 128, 2 layers, 2 heads, feed-forward 256, context 512, f32, the same RMSNorm epsilon and
rope theta, and a GPT-2-style byte-level BPE vocabulary trained on the same ASCII corpus with the
same special tokens (``<s>``, ``</s>``, ``<pad>``, marked CONTROL) and chat template. Its weights
are seeded *random*, not trained (training needs torch, which the llama.cpp environment does not
have): ``ceiling sanity`` calls this model broken, which is true of a random model. The BPE is trained here in plain
Python (the llama.cpp environment has no ``tokenizers``), so token ids need not match the HF
tiny model's, and no token is longer than 16 bytes (see ``MAX_TOKEN_BYTES``). **The vocabulary is
ASCII-only**: a random model would otherwise emit byte tokens that are not valid UTF-8, and the
server holds such text back and sends a response in one burst.

This file must not import anything from ceiling: it runs outside ceiling's environment.
"""

from __future__ import annotations

import json
import os
import re
import string
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

# The model's shape, seed, special tokens, chat template and corpus are tiny_model.py's (the HF
# twin served by vLLM): one definition, imported from the sibling file, which loads no heavy
# package at import time (torch/transformers are imported inside its functions).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_model import (
    CHAT_TEMPLATE,
    CORPUS,
    HEADS,
    HIDDEN,
    LAYERS,
    RMS_EPS,
    SEED,
    SPECIAL_TOKENS,
    bytes_to_unicode,
)
from tiny_model import INTERMEDIATE as FEED_FORWARD
from tiny_model import MAX_POSITIONS as CONTEXT
from tiny_model import ROPE_THETA as ROPE_BASE

BUILD_FORMAT = 3  # raise when the file's content changes (3: the corpus grew, 512 tokens)
VOCAB_TARGET = 512
# longest token, in bytes: llama-cpp-python 0.3.36 turns tokens into text through a 32-byte buffer
# and a longer piece comes out EMPTY (a streamed chunk with no text); string.printable in the
# corpus would otherwise merge into tokens of up to 52 letters
MAX_TOKEN_BYTES = 16
# GPT-2's pre-tokenizer, for ASCII text (\p{L} -> letters, \p{N} -> digits)
_PRE = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""
)


def train_bpe(corpus: list[str], vocab_target: int = VOCAB_TARGET) -> tuple[list[str], list[str]]:
    """A deterministic byte-level BPE over printable ASCII: (tokens in id order, merges).

    Specials first, then the byte-level characters of ``string.printable`` (not all 256 bytes),
    then one token per merge, most frequent pair first (ties: the smaller pair), no token longer
    than ``MAX_TOKEN_BYTES``.
    """
    table = bytes_to_unicode()
    alphabet = sorted({table[b] for b in string.printable.encode()})
    words: Counter[tuple[str, ...]] = Counter()
    for text in corpus * 4:
        for piece in _PRE.findall(text):
            words[tuple(table[b] for b in piece.encode())] += 1
    tokens = [*SPECIAL_TOKENS, *alphabet]
    merges: list[str] = []
    while len(tokens) < vocab_target:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in pairwise(word):
                if len(a) + len(b) <= MAX_TOKEN_BYTES:  # byte-level: one character per byte
                    pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        if merged not in tokens:
            tokens.append(merged)
        new_words: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += count
        words = new_words
    inverse = {c: b for b, c in table.items()}
    for tok in tokens[len(SPECIAL_TOKENS) :]:
        if not bytes(inverse[c] for c in tok).isascii():
            raise SystemExit(f"non-ASCII token in vocabulary: {tok!r}")
    return tokens, merges


def build(out_path: str | Path) -> Path:
    """Write the GGUF file and a JSON note beside it (kept when the note matches this builder)."""
    import gguf
    import numpy as np

    out = Path(out_path)
    note_path = out.with_suffix(".json")
    note = _note()
    if out.exists() and note_path.exists():
        try:
            if json.loads(note_path.read_text()) == note:
                return out
        except ValueError:
            pass
    out.parent.mkdir(parents=True, exist_ok=True)
    tokens, merges = train_bpe(CORPUS)
    vocab = len(tokens)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("ceiling-tiny")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FEED_FORWARD)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(vocab)
    w.add_file_type(0)  # all f32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    types = [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
    types += [gguf.TokenType.NORMAL] * (vocab - len(SPECIAL_TOKENS))
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(SEED)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(HIDDEN, dtype=np.float32)
    # numpy shapes are (rows = outputs, cols = inputs); GGUF stores them reversed
    w.add_tensor("token_embd.weight", rand(vocab, HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", rand(HIDDEN, HIDDEN))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", rand(FEED_FORWARD, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", rand(FEED_FORWARD, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", rand(HIDDEN, FEED_FORWARD))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", rand(vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    note_path.write_text(json.dumps(note, indent=2) + "\n")
    return out


def _note() -> dict[str, object]:
    """What the file was built with (a changed builder rebuilds it)."""
    return {
        "builder": "ceiling.demo.tiny_gguf",
        "format": BUILD_FORMAT,
        "hidden": HIDDEN,
        "layers": LAYERS,
        "heads": HEADS,
        "context": CONTEXT,
        "vocab_size": len(train_bpe(CORPUS)[0]),
        "max_token_bytes": MAX_TOKEN_BYTES,
        "special_token_ids": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
        "seed": SEED,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python tiny_gguf.py OUT.gguf", file=sys.stderr)
        return 2
    print(build(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
