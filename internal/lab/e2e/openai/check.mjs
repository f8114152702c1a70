// End-to-end check of one kvmesh router with the official openai client:
// the router must look like any OpenAI-compatible server to it, chat and
// the Responses API, streaming and errors included, and a conversation's
// second turn must find the first turn's prompt and answer in a replica's
// prefix cache (chat, and Responses by items sent again or by
// previous_response_id).
//
// Environment: KVMESH_URL (router base URL, required), KVMESH_MODEL
// (default kvmesh-sim), KVMESH_API_KEY (the router's client key, when it
// wants one; https with a private CA needs NODE_EXTRA_CA_CERTS). Exits
// non-zero with a message on the first failure.
import OpenAI from "openai";
import { randomUUID } from "node:crypto";

const base = process.env.KVMESH_URL;
if (!base) {
  console.error("check.mjs: KVMESH_URL is not set");
  process.exit(2);
}
const model = process.env.KVMESH_MODEL || "kvmesh-sim";
// No retries: a retried 5xx would hide a router fault this check is for.
const apiKey = process.env.KVMESH_API_KEY || "unused";
const client = new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0, timeout: 30_000 });

class CheckError extends Error {}
function assert(cond, msg) {
  if (!cond) throw new CheckError(msg);
}
async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
  } catch (err) {
    const why = err instanceof CheckError ? err.message : (err && err.stack) || String(err);
    console.error(`FAIL ${name} against ${base}: ${why}`);
    process.exit(1);
  }
  console.log(`ok   ${name} (${Date.now() - t0} ms)`);
}

// A unique run id at the front of the prompt keeps each run's
// conversation cold in the caches, so turn 1 cannot hit an earlier run.
const run = randomUUID();
const system = `Run ${run}. You are a helpful assistant who answers at length. `.repeat(12);
const question = "Tell me how gossip protocols spread state, and what Bloom filters cost. ".repeat(8);

await step("non-streaming chat completion", async () => {
  const r = await client.chat.completions.create({
    model,
    max_tokens: 8,
    messages: [{ role: "user", content: `Run ${run}: say hello.` }],
  });
  assert(r.object === "chat.completion", `object is ${JSON.stringify(r.object)}`);
  assert(r.model === model, `model is ${JSON.stringify(r.model)}, want ${model}`);
  const c = r.choices?.[0];
  assert(c?.message?.role === "assistant", `first choice has no assistant message: ${JSON.stringify(r.choices)}`);
  assert(typeof c.message.content === "string" && c.message.content.length > 0, "empty answer");
  assert(c.finish_reason === "length" || c.finish_reason === "stop", `finish_reason ${c.finish_reason}`);
  assert(r.usage?.completion_tokens === 8, `usage.completion_tokens ${r.usage?.completion_tokens}, want 8`);
});

await step("streaming chat completion with include_usage", async () => {
  const stream = await client.chat.completions.create({
    model,
    max_tokens: 16,
    stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: "user", content: `Run ${run}: stream a few words.` }],
  });
  let contentChunks = 0;
  let text = "";
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    assert(chunk.object === "chat.completion.chunk", `chunk object ${JSON.stringify(chunk.object)}`);
    for (const c of chunk.choices ?? []) {
      if (c.delta?.content) {
        contentChunks++;
        text += c.delta.content;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert(contentChunks >= 2, `${contentChunks} content chunks, want at least 2`);
  assert(text.length > 0, "streamed no text");
  assert(finish !== null, "no chunk carried a finish_reason");
  assert(usage !== null, "no usage chunk although stream_options.include_usage was set");
  assert(usage.completion_tokens === 16, `usage.completion_tokens ${usage.completion_tokens}, want 16`);
  assert(usage.prompt_tokens > 0, `usage.prompt_tokens ${usage.prompt_tokens}`);
});

await step("second turn reuses the first turn's cache", async () => {
  const turn1 = [
    { role: "system", content: system },
    { role: "user", content: question },
  ];
  const r1 = await client.chat.completions.create({ model, max_tokens: 32, messages: turn1 });
  const answer = r1.choices?.[0]?.message?.content;
  assert(answer, "turn 1 has no answer");
  const cached1 = r1.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  // A user reads the answer before replying; give the mesh one gossip
  // round (the routers run the 50 ms test profile) to tell every router
  // which replica holds turn 1, as it would have in any real conversation.
  await new Promise((resolve) => setTimeout(resolve, 500));
  const turn2 = [
    ...turn1,
    { role: "assistant", content: answer },
    { role: "user", content: "And how do they fail under partitions? ".repeat(4) },
  ];
  const r2 = await client.chat.completions.create({ model, max_tokens: 8, messages: turn2 });
  const details = r2.usage?.prompt_tokens_details;
  assert(details && typeof details.cached_tokens === "number", `turn 2 usage has no prompt_tokens_details.cached_tokens: ${JSON.stringify(r2.usage)}`);
  assert(
    details.cached_tokens > cached1,
    `turn 2 cached ${details.cached_tokens} tokens, turn 1 ${cached1}: the second turn missed the first turn's cache`,
  );
  // Everything turn 1 sent and got back is in the cache, less at most one
  // partial engine block at its end.
  assert(
    details.cached_tokens >= r1.usage.prompt_tokens,
    `turn 2 cached ${details.cached_tokens} tokens, less than turn 1's prompt (${r1.usage.prompt_tokens})`,
  );
  console.log(`     turn 1: ${r1.usage.prompt_tokens} prompt tokens, ${cached1} cached; turn 2: ${r2.usage.prompt_tokens} prompt tokens, ${details.cached_tokens} cached`);
});

await step("non-streaming Responses, retrieved by id", async () => {
  const r = await client.responses.create({ model, input: `Run ${run}: say hello.`, max_output_tokens: 8 });
  assert(r.object === "response", `object is ${JSON.stringify(r.object)}`);
  assert(typeof r.id === "string" && r.id.startsWith("resp_"), `id ${JSON.stringify(r.id)}`);
  assert(r.status === "completed", `status ${JSON.stringify(r.status)}`);
  assert(typeof r.output_text === "string" && r.output_text.length > 0, `no output text: ${JSON.stringify(r.output)}`);
  assert(r.usage?.output_tokens === 8, `usage.output_tokens ${r.usage?.output_tokens}, want 8`);
  // Only the replica that produced it holds it; the router knows which.
  const again = await client.responses.retrieve(r.id);
  assert(again.id === r.id && again.output_text === r.output_text, `retrieved ${again.id} ${JSON.stringify(again.output_text)}, want ${r.id}`);
});

await step("streaming Responses", async () => {
  const stream = await client.responses.create({ model, input: `Run ${run}: stream a few words.`, max_output_tokens: 16, stream: true });
  const types = [];
  let text = "";
  let final = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed") final = ev.response;
  }
  assert(types[0] === "response.created", `first event ${types[0]}, want response.created`);
  const deltas = types.filter((t) => t === "response.output_text.delta").length;
  assert(deltas >= 2, `${deltas} text deltas, want at least 2`);
  assert(final !== null, `no response.completed among ${JSON.stringify([...new Set(types)])}`);
  const finalText = final.output?.[0]?.content?.[0]?.text;
  assert(finalText === text, `streamed ${JSON.stringify(text)}, completed response says ${JSON.stringify(finalText)}`);
  assert(final.usage?.output_tokens === 16, `usage.output_tokens ${final.usage?.output_tokens}, want 16`);
});

await step("Responses second turn reuses the first turn's cache", async () => {
  // Own instructions: the chat conversation above renders the same way.
  const instructions = "Responses. " + system;
  const first = [{ role: "user", content: question }];
  const r1 = await client.responses.create({ model, instructions, input: first, max_output_tokens: 32 });
  assert(r1.output_text, "turn 1 has no answer");
  const cached1 = r1.usage?.input_tokens_details?.cached_tokens ?? 0;
  assert(cached1 === 0, `turn 1 already cached ${cached1} tokens`);
  await new Promise((resolve) => setTimeout(resolve, 500));
  const r2 = await client.responses.create({
    model,
    instructions,
    input: [...first, ...r1.output, { role: "user", content: "And how do they fail under partitions? ".repeat(4) }],
    max_output_tokens: 8,
  });
  const cached = r2.usage?.input_tokens_details?.cached_tokens;
  assert(typeof cached === "number", `turn 2 usage has no input_tokens_details.cached_tokens: ${JSON.stringify(r2.usage)}`);
  assert(cached >= r1.usage.input_tokens, `turn 2 cached ${cached} tokens, less than turn 1's input (${r1.usage.input_tokens})`);
  // The same conversation carried on by previous_response_id instead.
  const r3 = await client.responses.create({ model, previous_response_id: r2.id, input: "One more thing. ", max_output_tokens: 8 });
  // The engine's cache works in 16-token blocks: all of turn 2's prompt
  // and answer but at most one partial block.
  const cached3 = r3.usage?.input_tokens_details?.cached_tokens ?? 0;
  const want3 = r2.usage.input_tokens + r2.usage.output_tokens - 16;
  assert(cached3 >= want3, `turn 3 (previous_response_id) cached ${cached3} tokens, want at least ${want3} (turn 2: ${r2.usage.input_tokens} in, ${r2.usage.output_tokens} out)`);
  console.log(`     turn 1: ${r1.usage.input_tokens} input tokens; turn 2: ${r2.usage.input_tokens}, ${cached} cached; turn 3: ${r3.usage.input_tokens}, ${cached3} cached`);
});

await step("models.list contains the model", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert(ids.includes(model), `models are ${JSON.stringify(ids)}, want ${model} among them`);
});

// expectAPIError runs fn and asserts it throws the client's APIError with status.
async function expectAPIError(fn, status, what) {
  let err = null;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  assert(err !== null, `${what}: the request succeeded, want HTTP ${status}`);
  assert(err instanceof OpenAI.APIError, `${what}: threw ${err?.constructor?.name}: ${err?.message}, want an OpenAI.APIError`);
  assert(err.status === status, `${what}: status ${err.status}, want ${status} (${err.message})`);
  // OpenAI-shaped error body: the client exposes it as err.error.
  assert(typeof err.error?.message === "string" && err.error.message.length > 0, `${what}: no error.message in the body: ${JSON.stringify(err.error)}`);
  assert(typeof err.type === "string", `${what}: no error.type in the body: ${JSON.stringify(err.error)}`);
  return err;
}

if (process.env.KVMESH_API_KEY) {
  await step("a wrong API key is a 401 AuthenticationError", async () => {
    const wrong = new OpenAI({ baseURL: base + "/v1", apiKey: apiKey + "-wrong", maxRetries: 0, timeout: 30_000 });
    const err = await expectAPIError(() => wrong.models.list(), 401, "wrong key");
    assert(err instanceof OpenAI.AuthenticationError, `wrong key: ${err.constructor.name}, want AuthenticationError`);
  });
}

await step("unknown model is a 404 APIError", async () => {
  await expectAPIError(
    () => client.chat.completions.create({ model: `no-such-model-${run}`, messages: [{ role: "user", content: "hi" }] }),
    404,
    "unknown model",
  );
});

await step("malformed request is a 400 APIError", async () => {
  await expectAPIError(
    // messages must be an array; the client sends what it is given.
    () => client.chat.completions.create({ model, messages: "not a list of messages" }),
    400,
    "malformed request",
  );
});

console.log(`all checks passed against ${base}`);
