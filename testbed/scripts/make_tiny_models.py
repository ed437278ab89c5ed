"""Writes tiny random-weight models for the real-vLLM tests (no downloads).

Two models, saved with ``transformers`` in safetensors form (~5 MB each):

* ``llama``: full attention only (LlamaConfig: 2 layers, hidden 128, vocab
  8192), so vLLM has one KV-cache group of kind full_attention;
* ``hybrid``: the same Llama with one full-attention layer and one
  sliding-window layer (``layer_types``, as gpt-oss / Gemma-style configs
  declare them; vLLM's Llama reads it), so vLLM builds two KV-cache groups
  and the sliding-window one keeps only the last blocks of a run (window 48
  tokens: a hit must end on 2 contiguous blocks of 32). vLLM 0.32 refuses
  Qwen2/3's max_window_layers form of the same model.

The weights are random (seeded); the tests need a real engine's cache
behaviour, not sensible text. vLLM is run with --skip-tokenizer-init and
token-id prompts, so no tokenizer is written.
"""

from __future__ import annotations

import argparse
import json
import os

VOCAB = 32000  # the harness workloads draw token ids in [100, 30000)
SLIDING_WINDOW = 48


def _common() -> dict:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
    }


def make(kind: str, out: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(1234)
    if kind == "llama":
        cfg = LlamaConfig(**_common())
    elif kind == "hybrid":
        cfg = LlamaConfig(**_common())
        cfg.layer_types = ["full_attention", "sliding_attention"]
        cfg.sliding_window = SLIDING_WINDOW
    else:
        raise ValueError(f"unknown model kind {kind!r} (want llama or hybrid)")
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    path = os.path.join(out, kind)
    model.save_pretrained(path, safe_serialization=True)
    with open(os.path.join(path, "kvc_tiny_model.json"), "w") as f:
        json.dump({"kind": kind, "sliding_window": SLIDING_WINDOW if kind == "hybrid" else None}, f)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory that receives <kind>/")
    ap.add_argument("--kinds", default="llama,hybrid")
    args = ap.parse_args()
    for kind in args.kinds.split(","):
        marker = os.path.join(args.out, kind, "kvc_tiny_model.json")
        if os.path.exists(marker):
            print(f"{kind}: present")
            continue
        print(f"{kind}: {make(kind, args.out)}")


if __name__ == "__main__":
    main()
