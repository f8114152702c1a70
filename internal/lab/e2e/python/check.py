"""End-to-end check of one kvmesh router with the official openai Python client.

The router must look like any OpenAI-compatible server to it: chat and the
Responses API, streaming and not, and a conversation's second turn must find
the first turn's prompt and answer in a replica's prefix cache, for chat and
for Responses (the earlier items sent again, or previous_response_id).

Environment: KVMESH_URL (router base URL, required), KVMESH_MODEL (default
kvmesh-sim), KVMESH_PEER_URL (another router of the same mesh: a turn sent
there by previous_response_id must still reach the replica that stored the
first). Exits non-zero with a message on the first failure.
"""

import os
import sys
import time
import traceback
import uuid

import openai
from openai import OpenAI

BASE = os.environ.get("KVMESH_URL")
if not BASE:
    print("check.py: KVMESH_URL is not set", file=sys.stderr)
    sys.exit(2)
MODEL = os.environ.get("KVMESH_MODEL", "kvmesh-sim")
# No retries: a retried 5xx would hide a router fault this check is for.
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=30)
PEER = os.environ.get("KVMESH_PEER_URL")


class CheckError(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CheckError(msg)


def step(name):
    def run(fn):
        t0 = time.monotonic()
        try:
            fn()
        except CheckError as e:
            print(f"FAIL {name} against {BASE}: {e}", file=sys.stderr)
            sys.exit(1)
        except Exception:  # noqa: BLE001 - any client error fails the check
            print(f"FAIL {name} against {BASE}:\n{traceback.format_exc()}", file=sys.stderr)
            sys.exit(1)
        print(f"ok   {name} ({(time.monotonic() - t0) * 1000:.0f} ms)")
        return fn

    return run


# A unique run id at the front of each prompt keeps each run's
# conversations cold in the caches, so turn 1 cannot hit an earlier run.
RUN = str(uuid.uuid4())
SYSTEM = f"Run {RUN}. You are a helpful assistant who answers at length. " * 12
QUESTION = "Tell me how gossip protocols spread state, and what Bloom filters cost. " * 8
FOLLOW_UP = "And how do they fail under partitions? " * 4


def gossip_pause():
    # A user reads the answer before replying; give the mesh a few gossip
    # rounds (the routers run the 50 ms test profile) to tell every router
    # which replica holds turn 1, as it would have in a real conversation.
    time.sleep(0.5)


@step("non-streaming chat completion")
def _():
    r = client.chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": f"Run {RUN}: say hello."}]
    )
    check(r.object == "chat.completion", f"object is {r.object!r}")
    check(r.model == MODEL, f"model is {r.model!r}, want {MODEL}")
    c = r.choices[0]
    check(c.message.role == "assistant" and c.message.content, f"no assistant answer: {r.choices}")
    check(c.finish_reason in ("length", "stop"), f"finish_reason {c.finish_reason}")
    check(r.usage.completion_tokens == 8, f"usage.completion_tokens {r.usage.completion_tokens}, want 8")


@step("streaming chat completion with include_usage")
def _():
    stream = client.chat.completions.create(
        model=MODEL,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"Run {RUN}: stream a few words."}],
    )
    chunks, text, usage, finish = 0, "", None, None
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object!r}")
        for c in chunk.choices:
            if c.delta and c.delta.content:
                chunks += 1
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
        if chunk.usage:
            usage = chunk.usage
    check(chunks >= 2 and text, f"{chunks} content chunks, want at least 2")
    check(finish is not None, "no chunk carried a finish_reason")
    check(usage is not None and usage.completion_tokens == 16, f"usage {usage}, want 16 completion tokens")


@step("chat second turn reuses the first turn's cache")
def _():
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    r1 = client.chat.completions.create(model=MODEL, max_tokens=32, messages=turn1)
    answer = r1.choices[0].message.content
    check(answer, "turn 1 has no answer")
    gossip_pause()
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]
    r2 = client.chat.completions.create(model=MODEL, max_tokens=8, messages=turn2)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    check(cached >= r1.usage.prompt_tokens, f"turn 2 cached {cached} tokens, less than turn 1's prompt ({r1.usage.prompt_tokens})")
    print(f"     turn 1: {r1.usage.prompt_tokens} prompt tokens; turn 2: {r2.usage.prompt_tokens}, {cached} cached")


@step("non-streaming Responses, retrieved by id")
def _():
    r = client.responses.create(model=MODEL, input=f"Run {RUN}: say hello.", max_output_tokens=8)
    check(r.object == "response", f"object is {r.object!r}")
    check(r.id.startswith("resp_"), f"id {r.id!r}")
    check(r.status == "completed", f"status {r.status!r}")
    check(r.output_text, f"no output text: {r.output}")
    check(r.usage.output_tokens == 8, f"usage.output_tokens {r.usage.output_tokens}, want 8")
    check(r.usage.input_tokens > 0, f"usage.input_tokens {r.usage.input_tokens}")
    # Only the replica that produced it holds it; the router knows which.
    again = client.responses.retrieve(r.id)
    check(again.id == r.id and again.output_text == r.output_text, f"retrieved {again.id} {again.output_text!r}, want {r.id} {r.output_text!r}")


@step("streaming Responses")
def _():
    stream = client.responses.create(model=MODEL, input=f"Run {RUN}: stream a few words.", max_output_tokens=16, stream=True)
    types, text, final = [], "", None
    for ev in stream:
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        elif ev.type == "response.completed":
            final = ev.response
    check(types and types[0] == "response.created", f"first event {types[:1]}, want response.created")
    check(types.count("response.output_text.delta") >= 2, f"{types.count('response.output_text.delta')} text deltas, want at least 2")
    check(final is not None, f"no response.completed event among {sorted(set(types))}")
    check(final.output_text == text, f"streamed {text!r}, completed response says {final.output_text!r}")
    check(final.usage.output_tokens == 16, f"usage.output_tokens {final.usage.output_tokens}, want 16")


@step("Responses second turn (items sent again) reuses the first turn's cache")
def _():
    # Its own instructions: the chat conversation above renders the same
    # way and would otherwise have warmed this one.
    instructions = "Responses. " + SYSTEM
    first = [{"role": "user", "content": QUESTION}]
    r1 = client.responses.create(model=MODEL, instructions=instructions, input=first, max_output_tokens=32)
    check(r1.output_text, "turn 1 has no answer")
    check(r1.usage.input_tokens_details.cached_tokens == 0, f"turn 1 already cached: {r1.usage}")
    gossip_pause()
    # The documented way to carry a conversation without server-side state:
    # the earlier input, the earlier output items, then the new message.
    turn2 = first + [item.model_dump(exclude_none=True) for item in r1.output] + [{"role": "user", "content": FOLLOW_UP}]
    r2 = client.responses.create(model=MODEL, instructions=instructions, input=turn2, max_output_tokens=8)
    cached = r2.usage.input_tokens_details.cached_tokens
    check(cached >= r1.usage.input_tokens, f"turn 2 cached {cached} tokens, less than turn 1's input ({r1.usage.input_tokens})")
    print(f"     turn 1: {r1.usage.input_tokens} input tokens; turn 2: {r2.usage.input_tokens}, {cached} cached")


@step("Responses second turn by previous_response_id (streaming) reuses the cache")
def _():
    r1 = client.responses.create(model=MODEL, instructions="By id. " + SYSTEM, input=QUESTION, max_output_tokens=32)
    check(r1.usage.input_tokens_details.cached_tokens == 0, f"turn 1 already cached: {r1.usage}")
    stream = client.responses.create(model=MODEL, previous_response_id=r1.id, input=FOLLOW_UP, max_output_tokens=8, stream=True)
    final = None
    for ev in stream:
        if ev.type == "response.completed":
            final = ev.response
    check(final is not None, "no response.completed event")
    check(final.previous_response_id == r1.id, f"previous_response_id {final.previous_response_id!r}, want {r1.id!r}")
    cached = final.usage.input_tokens_details.cached_tokens
    check(cached >= r1.usage.input_tokens, f"turn 2 cached {cached} tokens, less than turn 1's input ({r1.usage.input_tokens})")
    print(f"     turn 1: {r1.usage.input_tokens} input tokens; turn 2: {final.usage.input_tokens}, {cached} cached")


if PEER:
    peer = OpenAI(base_url=PEER + "/v1", api_key="unused", max_retries=0, timeout=30)

    @step("previous_response_id at another router reaches the replica that stored the response")
    def _():
        # Behind DNS round-robin the next turn lands on any router. Only
        # the replica that stored a response has it (any other answers
        # 404), so each of these turns fails unless the router finds it;
        # four conversations leave no room for luck.
        for i in range(4):
            r1 = client.responses.create(model=MODEL, instructions=f"Elsewhere {i}. " + SYSTEM, input=QUESTION, max_output_tokens=16)
            r2 = peer.responses.create(model=MODEL, previous_response_id=r1.id, input=FOLLOW_UP, max_output_tokens=8, stream=i % 2 == 1)
            if i % 2 == 1:
                final = None
                for ev in r2:
                    if ev.type == "response.completed":
                        final = ev.response
                check(final is not None, "no response.completed event")
                r2 = final
            check(r2.previous_response_id == r1.id, f"previous_response_id {r2.previous_response_id!r}, want {r1.id!r}")
            cached = r2.usage.input_tokens_details.cached_tokens
            check(cached >= r1.usage.input_tokens, f"turn 2 at the other router cached {cached} tokens, less than turn 1's input ({r1.usage.input_tokens})")
            got = peer.responses.retrieve(r1.id)
            check(got.id == r1.id, f"retrieved {got.id!r} at the other router, want {r1.id!r}")


@step("prompt_cache_key is accepted")
def _():
    r = client.chat.completions.create(
        model=MODEL, max_tokens=4, prompt_cache_key=f"conv-{RUN}", messages=[{"role": "user", "content": "hi"}]
    )
    check(r.choices[0].message.content, "no answer")


@step("unknown model is a 404 APIError")
def _():
    try:
        client.chat.completions.create(model=f"no-such-model-{RUN}", messages=[{"role": "user", "content": "hi"}])
    except openai.NotFoundError as e:
        check(isinstance(e.body, dict) and e.body.get("message"), f"no error message in the body: {e.body}")
        return
    raise CheckError("the request succeeded, want HTTP 404")


print(f"all checks passed against {BASE}")
