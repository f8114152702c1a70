// Fails unless kvmesh beat round-robin on the replicas' own hit ratio, with
// no errors, in a `kvmesh demo --json` result.
import { readFileSync } from "node:fs";

const fronts = JSON.parse(readFileSync(process.argv[2], "utf8")).frontends;
const by = Object.fromEntries(fronts.map((f) => [f.name, f]));
for (const f of fronts) {
  console.log(`${f.name}: ${f.requests} ok, ${f.errors} errors, hit ratio ${f.hit_ratio.toFixed(3)}, TTFT p50 ${f.ttft_p50_ms.toFixed(0)} ms`);
}
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
if (!by.kvmesh || !by["round-robin"]) fail("missing front ends");
if (!(by.kvmesh.hit_ratio > by["round-robin"].hit_ratio)) fail("kvmesh hit ratio is not above round-robin's");
if (by.kvmesh.errors > 0) fail("kvmesh had errors");
