"""Writes small local stand-ins for the data sets inference-perf downloads.

    python datasets.py TEXT_FILE OUT_DIR

inference-perf's dataset types (shareGPT, cnn_dailymail,
billsum_conversations, infinity_instruct, visionarena) and its Weka trace
replay read Hugging Face data sets, which an offline machine cannot
fetch; each also reads a local file in the same layout. This writes one
per type into OUT_DIR, built from TEXT_FILE (MT-Bench's question file:
JSON lines with a "turns" list, else plain text lines), deterministically:

  sharegpt.json      [{"conversations": [{"from": "human"|"gpt", "value"}]}]
  cnn.json           [{"article", "highlights"}]
  billsum.json       [{"conversations": [...]}] (as ShareGPT's)
  infinity.json      [{"conversations": [...]}] (as ShareGPT's)
  visionarena.parquet  rows {"conversation": [{"role", "content"}],
                     "images": [{"bytes"}]} with a small PNG each
  weka/*.json        Weka KV-cache-tester traces: sessions of turns whose
                     block hash ids extend the previous turn's
  otel/*.json        OpenTelemetry traces of chat sessions: one "chat" span
                     per turn (gen_ai.input.messages: the history, the
                     last answer and a new question; gen_ai.output.text)

Only the layout is the real one; the text is the local file's, so the
prompt and answer lengths are not those of the real data sets.
"""

import io
import json
import os
import random
import sys


def lines(path):
    """The texts of path: every string of each JSON line's "turns", or its lines."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                out.append(line)
                continue
            turns = obj.get("turns") if isinstance(obj, dict) else None
            if turns:
                out.extend(t for t in turns if isinstance(t, str) and t)
    if len(out) < 4:
        raise SystemExit(f"datasets.py: {path} has {len(out)} texts; need at least 4")
    return out


def conversation(rng, texts, turns):
    """A ShareGPT conversation of turns human/gpt pairs from texts."""
    conv = []
    for _ in range(turns):
        conv.append({"from": "human", "value": rng.choice(texts)})
        conv.append({"from": "gpt", "value": " ".join(rng.sample(texts, 2))})
    return {"conversations": conv}


def png(rng, size=32):
    """A small PNG of random colour blocks (PIL, which inference-perf installs)."""
    from PIL import Image

    img = Image.new("RGB", (size, size))
    for y in range(0, size, 8):
        for x in range(0, size, 8):
            c = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            for dy in range(8):
                for dx in range(8):
                    img.putpixel((x + dx, y + dy), c)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def weka_trace(rng, sid, turns, block_size=64):
    """A Weka trace of one session: each turn's hash ids extend the last's."""
    reqs, hashes, t = [], [], 0.0
    base = 1000 * (sid + 1)
    for k in range(turns):
        add = rng.randint(2, 5)
        hashes = hashes + [base + len(hashes) + j for j in range(add)]
        reqs.append(
            {"t": t, "type": "n", "model": "m", "in": len(hashes) * block_size, "out": rng.randint(8, 32), "hash_ids": list(hashes)}
        )
        t += rng.uniform(0.5, 2.0)
    return {"id": f"session-{sid}", "models": ["m"], "block_size": block_size, "requests": reqs}


def otel_trace(rng, texts, sid, turns):
    """An OTel trace of one chat session of turns spans, each a second apart."""
    spans, msgs = [], [{"role": "system", "content": "You are a helpful assistant. " + texts[0]}]
    for k in range(turns):
        msgs = msgs + [{"role": "user", "content": rng.choice(texts)}]
        answer = " ".join(rng.sample(texts, 1))
        spans.append(
            {
                "trace_id": f"trace-{sid}",
                "span_id": f"{sid:04d}{k:04d}",
                "name": "chat m",
                "start_time": f"2026-01-01T00:00:{2 * k:02d}.000000Z",
                "end_time": f"2026-01-01T00:00:{2 * k + 1:02d}.000000Z",
                "attributes": {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "m",
                    "gen_ai.request.max_tokens": 32,
                    "gen_ai.input.messages": json.dumps(msgs),
                    "gen_ai.output.text": answer,
                    "gen_ai.usage.input_tokens": sum(len(m["content"]) // 4 for m in msgs),
                    "gen_ai.usage.output_tokens": len(answer) // 4,
                },
            }
        )
        msgs = msgs + [{"role": "assistant", "content": answer}]
    return {"trace_id": f"trace-{sid}", "spans": spans}


def main():
    src, out = sys.argv[1], sys.argv[2]
    texts = lines(src)
    rng = random.Random(42)
    os.makedirs(out, exist_ok=True)

    def dump(name, rows):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(rows, f)

    dump("sharegpt.json", [conversation(rng, texts, rng.randint(1, 3)) for _ in range(400)])
    dump("billsum.json", [conversation(rng, texts, 1) for _ in range(400)])
    dump("infinity.json", [conversation(rng, texts, rng.randint(1, 2)) for _ in range(400)])
    dump(
        "cnn.json",
        [{"article": " ".join(rng.sample(texts, 6)), "highlights": " ".join(rng.sample(texts, 1))} for _ in range(400)],
    )

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"conversation": [{"role": "user", "content": rng.choice(texts)}], "images": [{"bytes": png(rng)}]}
        for _ in range(64)
    ]
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(out, "visionarena.parquet"))

    os.makedirs(os.path.join(out, "weka"), exist_ok=True)
    for sid in range(16):
        with open(os.path.join(out, "weka", f"trace-{sid}.json"), "w", encoding="utf-8") as f:
            json.dump(weka_trace(rng, sid, rng.randint(2, 5)), f)
    os.makedirs(os.path.join(out, "otel"), exist_ok=True)
    for sid in range(16):
        with open(os.path.join(out, "otel", f"trace-{sid}.json"), "w", encoding="utf-8") as f:
            json.dump(otel_trace(rng, texts, sid, rng.randint(2, 4)), f)


if __name__ == "__main__":
    main()
