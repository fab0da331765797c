// tessel.js's cache in Node 20: a Cache API made of a Map (Node has none), a bundle served over HTTP, and
// crypto.subtle.digest wrapped to record the sha256 of everything it hashes, so each file and each piece of
// params.bin's chunked digest can be counted. Run by tests/web/test_node_cache.py, which passes TESSEL_CACHE_CASES.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { join } from "node:path";
import { after, before, beforeEach, test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const cases = JSON.parse(await readFile(process.env.TESSEL_CACHE_CASES, "utf8"));
const manifest = JSON.parse(await readFile(join(cases.bundle, "manifest.json"), "utf8"));
const params = await readFile(join(cases.bundle, "params.bin"));
const bytesOf = async (file) => {
  const bytes = await readFile(file);
  return bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
};
const input = new Float32Array(await bytesOf(cases.input));
const expected = new Float32Array(await bytesOf(cases.output));
const sha = (bytes) => createHash("sha256").update(bytes).digest("hex");
const CHUNK = manifest.chunked_files.chunk_bytes;
const pieces = [];
for (let start = 0; start < params.byteLength; start += CHUNK) pieces.push(sha(params.subarray(start, start + CHUNK)));
const keyOf = (name) => `https://tessel-runtime.invalid/sha256/${manifest.files[name]}`;

// the Cache API as tessel.js uses it: caches.open(name) -> {match, put, delete}; caches.delete(name)
const entries = new Map();
globalThis.caches = {
  async open() {
    return {
      match: async (key) => (entries.has(key) ? new Response(entries.get(key).slice()) : undefined),
      put: async (key, response) => void entries.set(key, new Uint8Array(await response.arrayBuffer())),
      delete: async (key) => entries.delete(key),
    };
  },
  delete: async () => entries.clear() ?? true,
};

// what crypto.subtle.digest was given, as the sha256 of each input, taken when it is called (it copies then too)
const hashed = [];
const digest = crypto.subtle.digest.bind(crypto.subtle);
crypto.subtle.digest = (algorithm, data) => {
  hashed.push(sha(ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : new Uint8Array(data)));
  return digest(algorithm, data);
};

// the bundle's files over HTTP; a name in `damaged` is served damaged: params.bin with 4 KiB of its second piece set
// to 0xff (NaN weights), a code file with its middle byte flipped
const requests = [];
const damaged = new Set();
const damage = (bytes) => {
  const copy = new Uint8Array(bytes);
  if (copy.length > CHUNK + 8192) copy.fill(0xff, CHUNK + 4096, CHUNK + 8192);
  else copy[copy.length >> 1] ^= 0xff;
  return copy;
};
let server, base;
before(async () => {
  server = createServer(async (request, response) => {
    const name = request.url.split("/").pop();
    requests.push(name);
    try {
      const data = await readFile(join(cases.bundle, name));
      response.writeHead(200, { "Content-Length": data.byteLength, "Content-Type": name.endsWith(".wasm") ? "application/wasm" : "application/octet-stream" });
      response.end(damaged.has(name) ? damage(data) : data);
    } catch {
      response.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${server.address().port}/matmul/`;
});
after(() => server.close());
beforeEach(async () => {
  await tessel.clearCache();
  damaged.clear();
});

/** Load and run once; the hashes and requests of that alone, and the output. */
async function loadAndRun(options = {}) {
  hashed.length = 0;
  requests.length = 0;
  const model = await tessel.load(base, { threads: 1, ...options });
  const outputs = await model.run({ input });
  const code = await readFile(join(cases.bundle, model.variant.code));
  model.dispose();
  return { output: outputs.output.data, requests: [...requests].sort(), hashed: [...hashed], code: sha(code), variant: model.variant };
}

function assertClose(actual, label) {
  assert.equal(actual.length, expected.length);
  for (let index = 0; index < expected.length; index++) {
    const excess = Math.abs(actual[index] - expected[index]) - (1e-5 + 1e-4 * Math.abs(expected[index]));
    if (!(excess <= 0)) assert.fail(`${label}: output[${index}] = ${actual[index]}, onnxruntime says ${expected[index]}`);
  }
}

test("params.bin is three pieces of its chunked digest, the last one short", () => {
  assert.equal(pieces.length, 3);
  assert.ok(params.byteLength % CHUNK > 0);
});

for (const threads of [1, 2]) {
  test(`${threads} thread(s): a download and then a cache hit each hash code and params.bin once`, async () => {
    const first = await loadAndRun({ threads });
    assert.equal(first.variant.threads, threads);
    assert.deepEqual(first.requests, ["manifest.json", first.variant.code, "params.bin"].sort());
    assertClose(first.output, "download");
    const second = await loadAndRun({ threads });
    assert.deepEqual(second.requests, ["manifest.json"], "the second load fetched code or params");
    assertClose(second.output, "cache hit");
    for (const [label, run] of [["download", first], ["cache hit", second]]) {
      assert.deepEqual(pieces.map((piece) => run.hashed.filter((item) => item === piece).length), [1, 1, 1], `${label}: each piece once`);
      assert.equal(run.hashed.filter((item) => item === sha(params)).length, 0, `${label}: params.bin is not hashed whole as well`);
      assert.equal(run.hashed.filter((item) => item === run.code).length, 1, `${label}: ${run.variant.code} once`);
    }
  });
}

test("a damaged cached params.bin of the right size is found by that one check, fetched again and replaced", async () => {
  await loadAndRun();
  const good = entries.get(keyOf("params.bin"));
  assert.deepEqual(Buffer.from(good), params);
  entries.set(keyOf("params.bin"), damage(good));
  // the run starts at once, on the damaged bytes (NaN), before their check ends: its result must not be kept
  const repaired = await loadAndRun();
  assert.deepEqual(repaired.requests, ["manifest.json", "params.bin"]);
  assertClose(repaired.output, "after the damaged entry");
  const damagedPiece = sha(damage(params).subarray(CHUNK, 2 * CHUNK));
  assert.equal(repaired.hashed.filter((item) => item === damagedPiece).length, 1, "the damaged piece is hashed once");
  assert.deepEqual(pieces.map((piece) => repaired.hashed.filter((item) => item === piece).length), [2, 1, 2], "the cached read, then the download");
  assert.deepEqual(Buffer.from(entries.get(keyOf("params.bin"))), params, "the entry now holds the right bytes");
  const after = await loadAndRun();
  assert.deepEqual(after.requests, ["manifest.json"]);
  assertClose(after.output, "the load after");
});

test("a cached params.bin of the wrong size is passed over without hashing it, and replaced", async () => {
  await loadAndRun();
  const cut = entries.get(keyOf("params.bin")).slice(0, CHUNK + 100);
  entries.set(keyOf("params.bin"), cut);
  const repaired = await loadAndRun();
  assert.deepEqual(repaired.requests, ["manifest.json", "params.bin"]);
  assertClose(repaired.output, "after the truncated entry");
  // the first piece, which the cut entry holds whole, was not hashed from it
  assert.deepEqual(pieces.map((piece) => repaired.hashed.filter((item) => item === piece).length), [1, 1, 1]);
  assert.equal(entries.get(keyOf("params.bin")).byteLength, params.byteLength);
});

test("a damaged cached model.wasm is fetched again and replaced", async () => {
  const { variant } = await loadAndRun();
  const good = entries.get(keyOf(variant.code));
  const bad = good.slice();
  bad[bad.length >> 1] ^= 0x01;
  entries.set(keyOf(variant.code), bad);
  const repaired = await loadAndRun();
  assert.deepEqual(repaired.requests, ["manifest.json", variant.code]);
  assertClose(repaired.output, "after the damaged code");
  assert.equal(repaired.hashed.filter((item) => item === sha(bad)).length, 1);
  assert.equal(repaired.hashed.filter((item) => item === repaired.code).length, 1);
  assert.deepEqual(entries.get(keyOf(variant.code)), good);
});

test("damaged in the cache and on the server: every run is refused, and nothing damaged is stored", async () => {
  await loadAndRun();
  entries.set(keyOf("params.bin"), damage(entries.get(keyOf("params.bin"))));
  damaged.add("params.bin");
  const model = await tessel.load(base, { threads: 1 });
  for (let run = 0; run < 2; run++) {
    await assert.rejects(model.run({ input }), {
      name: "TesselError",
      code: "digest",
      field: "params.bin",
      message: /params\.bin does not match the manifest's sha256; the bundle is corrupted, export it again/,
    });
  }
  model.dispose();
  assert.equal(entries.has(keyOf("params.bin")), false, "the damaged entry is dropped, the damaged download not stored");
  damaged.clear();
  const fresh = await loadAndRun();
  assert.deepEqual(fresh.requests, ["manifest.json", "params.bin"]);
  assertClose(fresh.output, "once the server is right again");
});

test("a damaged model.wasm from the server with a damaged cached one is refused by its digest", async () => {
  const { variant } = await loadAndRun();
  const bad = entries.get(keyOf(variant.code)).slice();
  bad[100] ^= 0x01;
  entries.set(keyOf(variant.code), bad);
  damaged.add(variant.code);
  await assert.rejects(tessel.load(base, { threads: 1 }), { name: "TesselError", code: "digest", field: variant.code });
  assert.equal(entries.has(keyOf(variant.code)), false);
});
