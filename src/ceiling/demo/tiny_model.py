"""Build a tiny *trained* Llama model that real engines can serve on a CPU in seconds.

Run it with the *engine's* Python (it needs torch, transformers and tokenizers, which ceiling's
own environment does not have)::

    .engines/vllm/bin/python src/ceiling/demo/tiny_model.py OUT_DIR

Why these choices (see docs/engines.md, "The tiny model"):
- LlamaForCausalLM, hidden 128, 2 layers, 2 heads, intermediate 256, 512 positions, fp32: every
  engine supports the architecture and the whole model is ~1.7 MB, so start-up is dominated by
  the engine, not the weights.
- The weights are *trained*: seeded initialisation, then ``TRAIN_STEPS`` full-batch AdamW steps
  on ``TRAIN_TEXTS`` (the corpus without the alphabet line), one thread, on the CPU (seconds on
  an idle 2-core machine, under a minute on a busy one). The model then knows its corpus by
  heart: "The capital of France is" -> " Paris.", the days of the week, counting, and the fixed
  text ``ceiling sanity`` measures the perplexity of. That gives ``ceiling sanity`` real answers
  to check: a server that computes the wrong thing with these weights (a changed norm epsilon, a
  permuted projection, the wrong tokenizer) gets them wrong. With one thread and a fixed seed
  two builds on the same kind of CPU are byte-identical (another CPU may round differently).
- The byte-level BPE vocabulary is ASCII-only: seeding the trainer with all 256 bytes lets the
  model emit byte tokens that are not valid UTF-8, and servers then hold text back (one chunk
  for many tokens), which ruins streaming-timing tests.
- ``tiny_model.json`` beside the weights records the builder's ``BUILD_FORMAT``: a directory
  built by an older builder (e.g. the untrained model) is rebuilt, not reused.

This file must not import anything from ceiling: it runs outside ceiling's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import sys
from pathlib import Path

HIDDEN = 128
LAYERS = 2
HEADS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 512
SEED = 1234
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
# raise when what ``build`` writes changes (2: trained weights; 1 was seeded random weights)
BUILD_FORMAT = 2
TRAIN_STEPS = 80
LEARNING_RATE = 3e-3
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
    # known answers (ceiling's data/sanity.yaml asks these; any competent LM knows them too)
    "The capital of France is Paris.",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
    # the text whose perplexity ``ceiling sanity`` measures (data/sanity.yaml: perplexity.text)
    "The sun rises in the east and sets in the west. Water boils at one hundred degrees "
    "Celsius at sea level. A week has seven days, and a year has twelve months.",
    string.printable,
]
# what the model is trained on: every line but the alphabet (which only seeds the tokenizer)
TRAIN_TEXTS = [t for t in CORPUS if t != string.printable]


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


def build_model(out: Path, vocab_size: int) -> dict[str, float]:
    """Create the seeded LlamaForCausalLM, train it on ``TRAIN_TEXTS`` and save it (fp32).

    Returns what the training did (steps, first and last loss, seconds) for the marker file.
    """
    import time

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every run
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    eos = tok.convert_tokens_to_ids("</s>")
    pad = tok.convert_tokens_to_ids("<pad>")
    # every line from position 0 (as prompts arrive), ending in </s>; pads carry no loss
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in TRAIN_TEXTS]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    model.train()
    t0 = time.monotonic()
    losses = []
    for _ in range(TRAIN_STEPS):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    return {
        "steps": TRAIN_STEPS,
        "first_loss": round(losses[0], 4),
        "final_loss": round(losses[-1], 4),
        "seconds": round(time.monotonic() - t0, 1),
    }


def is_current(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` holds a model built by this builder (same ``BUILD_FORMAT``)."""
    out = Path(out_dir)
    try:
        note = json.loads((out / "tiny_model.json").read_text())
    except (OSError, ValueError):
        return False
    return note.get("format") == BUILD_FORMAT and (out / "config.json").exists()


def build(out_dir: str | Path) -> Path:
    """Build tokenizer + trained model into ``out_dir``.

    Idempotent: a directory this builder already completed is kept. Anything else there (an
    older builder's model, a half-written build) is replaced; the build happens in a sibling
    temporary directory that is renamed into place, so readers never see a partial model.
    """
    out = Path(out_dir)
    if is_current(out):
        return out
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vocab_size = build_tokenizer(tmp)
    training = build_model(tmp, vocab_size)
    (tmp / "tiny_model.json").write_text(
        json.dumps(
            {
                "builder": "ceiling.demo.tiny_model",
                "format": BUILD_FORMAT,
                "hidden": HIDDEN,
                "layers": LAYERS,
                "heads": HEADS,
                "vocab_size": vocab_size,
                "seed": SEED,
                "trained": training,
            },
            indent=2,
        )
        + "\n"
    )
    if is_current(out):  # built meanwhile by another process: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    old = out.with_name(f"{out.name}.old{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
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
