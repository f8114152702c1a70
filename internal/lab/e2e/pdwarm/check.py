#!/usr/bin/env python3
"""check.py URL [MODEL] -- does a warm request's form reach a real engine's
prefix cache as the next turn's prefix?

kvmesh's warm request (proxy/pdwarm.go, --pd-warm) sends the replica that
prefilled a turn the conversation followed by the answer as an assistant
message, one token, add_generation_prompt false (vLLM's form; SGLang's keeps
the generation prompt). This sends, per form, a fresh conversation to one
OpenAI-compatible server: the turn's prefill (max_tokens 1), then the warm
request (none, vLLM's form or the generation-prompt form), then the next turn
with that answer, and prints the next turn's prompt and cached tokens. The
answer is text of its own (the decode replica's, in a split deployment, which
this server never saw). Run it against a server of one slot and no host
prompt cache, so only the last prompt is held.
"""
import json
import random
import sys
import urllib.request

url = sys.argv[1].rstrip("/")
model = sys.argv[2] if len(sys.argv) > 2 else None
rng = random.Random(7)
words = "river stone light garden window paper music silver cloud harbor forest engine letter summer".split()


def text(n):
    return " ".join(rng.choice(words) for _ in range(n))


def chat(messages, **extra):
    body = {"messages": messages, "max_tokens": 1, "temperature": 0}
    if model:
        body["model"] = model
    body.update(extra)
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        u = json.load(r)["usage"]
    return u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


print("form                         warm prompt  next-turn prompt  cached  share")
for form in ("no warm", "add_generation_prompt=false", "generation prompt kept"):
    q1, answer, q2 = text(300), text(120), text(20)
    first = [{"role": "user", "content": q1}]
    chat(first)  # the turn's prefill leg
    warm, warmed = first + [{"role": "assistant", "content": answer}], 0
    if form == "add_generation_prompt=false":
        warmed, _ = chat(warm, add_generation_prompt=False)
    elif form == "generation prompt kept":
        warmed, _ = chat(warm)
    prompt, cached = chat(warm + [{"role": "user", "content": q2}])
    print(f"{form:28} {warmed:12d} {prompt:17d} {cached:7d}  {cached / prompt:.3f}")
