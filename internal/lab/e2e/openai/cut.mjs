// End-to-end check of a stream cut mid-body, with the official openai npm
// client. Two roles, one file:
//
//   node cut.mjs replica PORT   a fake OpenAI replica on 127.0.0.1:PORT whose
//                               chat streams send two events and then nothing
//                               until the router closes the connection (its
//                               upstream idle timeout); /v1/models and
//                               /metrics answer the router's health checks.
//   node cut.mjs                the check, against the router at KVMESH_URL
//                               (in front of that replica, directly or over a
//                               hop): the stream yields the two chunks, then
//                               the client throws APIError from the router's
//                               error event, not the APIConnectionError of a
//                               cut connection, within KVMESH_CUT_BOUND
//                               seconds (default 20) of the last chunk.
//
// Environment: KVMESH_URL, KVMESH_MODEL (default kvmesh-sim), KVMESH_API_KEY
// (the router's client key, when it wants one; https with a private CA needs
// NODE_EXTRA_CA_CERTS). Exits non-zero with a message on failure.
import http from "node:http";

const model = process.env.KVMESH_MODEL || "kvmesh-sim";

if (process.argv[2] === "replica") {
  const server = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/v1/models") {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ object: "list", data: [{ id: model, object: "model" }] }));
      return;
    }
    if (req.method === "GET" && req.url === "/metrics") {
      res.writeHead(200, { "Content-Type": "text/plain" });
      res.end("# no engine metrics\n");
      return;
    }
    if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
      res.writeHead(404).end("not found\n");
      return;
    }
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      for (const i of [0, 1]) {
        const chunk = { id: "chatcmpl-cut", object: "chat.completion.chunk", created: 1, model,
          choices: [{ index: 0, delta: { content: `t${i}` }, finish_reason: null }] };
        res.write(`data: ${JSON.stringify(chunk)}\n\n`);
      }
      // Nothing more: the router's idle timeout closes the connection.
    });
  });
  server.listen(Number(process.argv[3]), "127.0.0.1");
} else {
  const { default: OpenAI } = await import("openai");
  const base = process.env.KVMESH_URL;
  if (!base) {
    console.error("cut.mjs: KVMESH_URL is not set");
    process.exit(2);
  }
  const bound = Number(process.env.KVMESH_CUT_BOUND || "20") * 1000;
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: process.env.KVMESH_API_KEY || "unused", maxRetries: 0, timeout: 60_000 });
  const got = [];
  let last = Date.now();
  const fail = (why) => {
    console.error(`FAIL cut stream against ${base}: ${why}`);
    process.exit(1);
  };
  try {
    const stream = await client.chat.completions.create({ model, stream: true, messages: [{ role: "user", content: "Tell me a story." }] });
    for await (const chunk of stream) {
      got.push(chunk.choices?.[0]?.delta?.content);
      last = Date.now();
    }
  } catch (err) {
    const took = Date.now() - last;
    const problems = [];
    if (!(err instanceof OpenAI.APIError) || err instanceof OpenAI.APIConnectionError) {
      problems.push(`threw ${err?.constructor?.name}: ${err?.message}, want APIError from the error event`);
    }
    if (JSON.stringify(got) !== JSON.stringify(["t0", "t1"])) problems.push(`chunks ${JSON.stringify(got)}, want ["t0","t1"]`);
    if (err?.error?.code !== "upstream_timeout" || !err?.error?.message) {
      problems.push(`error ${JSON.stringify(err?.error)}, want the router's upstream_timeout error`);
    }
    if (took > bound) problems.push(`threw ${took} ms after the last chunk, over ${bound} ms`);
    if (problems.length) fail(problems.join("; "));
    console.log(`ok   cut stream throws APIError (${JSON.stringify(err.error.message)}) ${took} ms after the last chunk`);
    process.exit(0);
  }
  fail(`the stream ended without an error after ${JSON.stringify(got)}`);
}
