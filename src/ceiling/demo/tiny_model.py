"""Build a tiny random Llama model that real engines can serve on a CPU in seconds.

Run it with the *engine's* Python (it needs torch, transformers and tokenizers, which ceiling's
own environment does not have)::

    .engines/vllm/bin/python src/ceiling/demo/tiny_model.py OUT_DIR

Why these choices (see ../shared/engines-on-cpu.md):
- LlamaForCausalLM, hidden 128, 2 layers, 2 heads, intermediate 256, 512 positions, fp32: every
  engine supports the architecture and the whole model is ~1.7 MB, so start-up is dominated by
  the engine, not the weights.
- Weights are random but seeded, so two builds are byte-identical.
- The byte-level BPE vocabulary is ASCII-only: seeding the trainer with all 256 bytes lets a
  random model emit byte tokens that are not valid UTF-8, and servers then hold text back (one
  chunk for many tokens), which ruins streaming-timing tests.

This file must not import anything from ceiling: it runs outside ceiling's environment.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

HIDDEN = 128
LAYERS = 2
HEADS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 512
SEED = 1234
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant: ' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "How fast can this deployment go, and where does the time go?",
    "Decode is bound by memory bandwidth; prefill is bound by compute.",
    "Tensor parallel ranks exchange activations with an allreduce per layer.",
    "Hello, world! This is a tiny model for testing inference engines.",
    "user: write a short poem about GPUs\nassistant: silicon rivers hum",
    string.printable,
]


def build_tokenizer(out: Path, vocab_size: int = 512) -> int:
    """Train a byte-level BPE on an ASCII corpus and save it as a fast HF tokenizer.

    Returns the real vocabulary size (the embedding table is sized from it).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # The initial alphabet is the byte-level mapping of printable ASCII only (not all 256 bytes).
    ascii_alphabet = sorted(set(_byte_level_chars(string.printable)))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=ascii_alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    vocab = tok.get_vocab()
    for token in vocab:
        text = "".join(_byte_level_decode(token)) if token not in SPECIAL_TOKENS else ""
        if not text.isascii():
            raise SystemExit(f"non-ASCII token in vocabulary: {token!r}")
    return tok.get_vocab_size()


def _byte_level_chars(text: str) -> list[str]:
    """The byte-level (GPT-2) characters that represent ``text``'s UTF-8 bytes."""
    table = bytes_to_unicode()
    return [table[b] for b in text.encode("utf-8")]


def _byte_level_decode(token: str) -> list[str]:
    inverse = {v: k for k, v in bytes_to_unicode().items()}
    return [chr(inverse[c]) if c in inverse else "\ufffd" for c in token]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table (the ByteLevel alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def build_model(out: Path, vocab_size: int) -> None:
    """Create the seeded random LlamaForCausalLM and save it as safetensors (fp32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)


def build(out_dir: str | Path) -> Path:
    """Build tokenizer + model into ``out_dir`` (idempotent: skipped when already complete)."""
    out = Path(out_dir)
    marker = out / "tiny_model.json"
    if marker.exists() and (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(out)
    build_model(out, vocab_size)
    marker.write_text(
        json.dumps(
            {
                "builder": "ceiling.demo.tiny_model",
                "hidden": HIDDEN,
                "layers": LAYERS,
                "heads": HEADS,
                "vocab_size": vocab_size,
                "seed": SEED,
            },
            indent=2,
        )
        + "\n"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = build(args[0])
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
