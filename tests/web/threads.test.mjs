// Threaded and relaxed-SIMD wasm in Node 20: the bundles tests/web/test_node_threads.py compiled with every variant
// run on one thread and on several (worker_threads over one shared memory), against each other bit for bit and
// against onnxruntime; then the fallbacks. Run through pytest, which passes TESSEL_WEB_CASES, and with relaxed SIMD
// switched on (--experimental-wasm-relaxed-simd) as a second run.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { cp, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const RTOL = 1e-4;
const ATOL = 1e-5;

const casesFile = process.env.TESSEL_WEB_CASES;
if (!casesFile) throw new Error("set TESSEL_WEB_CASES to the cases.json that tests/web/test_node_threads.py writes");
const { cases, plain, scratch, relaxed } = JSON.parse(await readFile(casesFile, "utf8"));
const ARRAY_TYPES = { float32: Float32Array, int64: BigInt64Array };

async function readArray({ file, dtype }) {
  const bytes = await readFile(file);
  return new ARRAY_TYPES[dtype](bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

async function feedsOf(item) {
  const feeds = {};
  for (const [name, spec] of Object.entries(item.inputs)) feeds[name] = await readArray(spec);
  return feeds;
}

function assertClose(actual, expected, label) {
  assert.equal(actual.length, expected.length, `${label}: length`);
  for (let index = 0; index < expected.length; index++) {
    const excess = Math.abs(actual[index] - expected[index]) - (ATOL + RTOL * Math.abs(expected[index]));
    if (!(excess <= 0)) assert.fail(`${label}[${index}] = ${actual[index]}, expected ${expected[index]}`);
  }
}

function poolJoins(model) {
  return model.executor.instance.exports.tessel_pool_joins();
}

async function runAll(model, item) {
  const feeds = await feedsOf(item);
  const runs = [];
  for (let round = 0; round < 3; round++) runs.push(await model.run(feeds));
  return runs;
}

describe("threads give the one-thread results", () => {
  for (const item of cases) {
    test(item.name, async () => {
      const single = await tessel.load(item.bundle, { threads: 1, relaxedSimd: false });
      assert.deepEqual(single.variant, { code: "model.wasm", features: [], threads: 1 });
      const [expected] = await runAll(single, item);
      for (const threads of [2, 3]) {
        const model = await tessel.load(item.bundle, { threads, relaxedSimd: false });
        assert.deepEqual(model.variant, { code: "model.threads.wasm", features: ["threads"], threads });
        for (const outputs of await runAll(model, item)) {
          for (const name of model.outputNames) {
            // every element is computed by the same code in the same order, whichever thread runs it
            assert.deepEqual(outputs[name].data, expected[name].data, `${item.name} ${name} at ${threads} threads`);
            assert.equal(outputs[name].data.buffer instanceof SharedArrayBuffer, false);
          }
        }
        if (item.name === "dwconv_block") assert.ok(poolJoins(model) > 0, "no worker joined a parallel loop");
        model.dispose();
      }
      for (const [name, spec] of Object.entries(item.expected)) {
        assertClose(expected[name].data, await readArray(spec), `${item.name} ${name} against onnxruntime`);
      }
      single.dispose();
    });
  }
});

describe("loading a threaded variant", () => {
  test("a corrupted params.bin holds back every result of a threaded run (hashed from its own copy)", async () => {
    const item = cases.find((entry) => entry.name === "digits");
    const directory = join(scratch, "corrupted-params");
    await cp(item.bundle, directory, { recursive: true });
    const params = await readFile(join(directory, "params.bin"));
    params[7] ^= 0x01;
    await writeFile(join(directory, "params.bin"), params);
    const model = await tessel.load(directory, { threads: 2, relaxedSimd: false });
    assert.equal(model.variant.threads, 2);
    const feeds = await feedsOf(item);
    await assert.rejects(model.run(feeds), /params\.bin does not match the manifest's sha256/);
    await assert.rejects(model.run(feeds), /params\.bin does not match the manifest's sha256/);
    model.dispose();
  });

  test("a threaded variant's params are hashed piece by piece out of shared memory: a flip in a later piece fails", async () => {
    const item = cases.find((entry) => entry.name === "digits");
    const feeds = await feedsOf(item);
    const size = 4096;
    for (const flip of [null, 3 * size + 5]) {
      const directory = join(scratch, `chunked-params-${flip}`);
      await cp(item.bundle, directory, { recursive: true });
      const params = await readFile(join(directory, "params.bin"));
      const pieces = [];
      for (let start = 0; start < params.byteLength; start += size) {
        pieces.push(createHash("sha256").update(params.subarray(start, start + size)).digest());
      }
      const manifest = JSON.parse(await readFile(join(directory, "manifest.json"), "utf8"));
      const root = createHash("sha256").update(Buffer.concat(pieces)).digest("hex");
      manifest.chunked_files = { chunk_bytes: size, sha256: { "params.bin": root } };
      await writeFile(join(directory, "manifest.json"), JSON.stringify(manifest));
      if (flip !== null) {
        params[flip] ^= 0x01;
        await writeFile(join(directory, "params.bin"), params);
      }
      const model = await tessel.load(directory, { threads: 2, relaxedSimd: false });
      assert.equal(model.variant.threads, 2);
      if (flip === null) await model.run(feeds);
      else await assert.rejects(model.run(feeds), /params\.bin does not match the manifest's sha256/);
      model.dispose();
    }
  });
});

describe("relaxed SIMD", () => {
  test(`the probe says ${relaxed} and the variant follows it`, async () => {
    assert.equal(tessel.hasWasmRelaxedSimd(), relaxed);
    const item = cases.find((entry) => entry.name === "dwconv_block");
    const plain = await tessel.load(item.bundle, { threads: 1, relaxedSimd: false });
    const chosen = await tessel.load(item.bundle, { threads: 1 });
    const threaded = await tessel.load(item.bundle, { threads: 2 });
    assert.deepEqual(chosen.variant.features, relaxed ? ["relaxed-simd"] : []);
    assert.deepEqual(threaded.variant.features, relaxed ? ["threads", "relaxed-simd"] : ["threads"]);
    const [reference] = await runAll(plain, item);
    for (const model of [chosen, threaded]) {
      const [outputs] = await runAll(model, item);
      for (const name of model.outputNames) assertClose(outputs[name].data, reference[name].data, model.variant.code);
      model.dispose();
    }
    plain.dispose();
  });
});

describe("fallbacks", () => {
  const digits = cases.find((entry) => entry.name === "digits");

  test("the default is the cores, at most 4", async () => {
    const { availableParallelism } = await import("node:os");
    const model = await tessel.load(digits.bundle, { relaxedSimd: false });
    assert.equal(model.variant.threads, Math.min(availableParallelism(), 4));
    model.dispose();
  });

  test("without SharedArrayBuffer: one thread and one warning", async () => {
    const shared = globalThis.SharedArrayBuffer;
    const warn = console.warn;
    const warnings = [];
    console.warn = (message) => warnings.push(message);
    delete globalThis.SharedArrayBuffer;
    try {
      for (let load = 0; load < 2; load++) {
        const model = await tessel.load(digits.bundle, { threads: 2, relaxedSimd: false });
        assert.deepEqual(model.variant, { code: "model.wasm", features: [], threads: 1 });
        const outputs = await model.run(await feedsOf(digits));
        assertClose(outputs.probabilities.data, await readArray(digits.expected.probabilities), "digits");
        model.dispose();
      }
    } finally {
      globalThis.SharedArrayBuffer = shared;
      console.warn = warn;
    }
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /running on 1 thread: this engine has no SharedArrayBuffer/);
  });

  test("a bundle without variants runs its one code file at any thread count", async () => {
    const model = await tessel.load(plain, { threads: 4 });
    assert.deepEqual(model.variant, { code: "model.wasm", features: [], threads: 1 });
    model.dispose();
  });

  test("a malformed variants list is refused before any memory is sized from it", async () => {
    const directory = join(scratch, "malformed");
    await cp(digits.bundle, directory, { recursive: true });
    const manifest = JSON.parse(await readFile(join(directory, "manifest.json"), "utf8"));
    manifest.variants[0].wasm_import.initial_pages = -1;
    await writeFile(join(directory, "manifest.json"), JSON.stringify(manifest));
    await assert.rejects(tessel.load(directory), { code: "manifest", field: "variants[0].wasm_import.initial_pages" });
  });

  test("a damaged threaded variant is refused by its digest", async () => {
    const directory = join(scratch, "damaged");
    await cp(digits.bundle, directory, { recursive: true });
    const path = join(directory, "model.threads.wasm");
    const bytes = await readFile(path);
    bytes[bytes.length - 40] ^= 0xff;
    await writeFile(path, bytes);
    const options = { threads: 2, relaxedSimd: false };
    await assert.rejects(tessel.load(directory, options), /model.threads.wasm does not match the manifest's sha256/);
    (await tessel.load(directory, { ...options, threads: 1 })).dispose();
  });

  test("workers that cannot start: one thread and one warning", async () => {
    const workers = await import("node:worker_threads");
    const warn = console.warn;
    const warnings = [];
    console.warn = (message) => warnings.push(message);
    // a worker whose code throws at once stands for one a page's policy refuses
    const post = workers.Worker.prototype.postMessage;
    workers.Worker.prototype.postMessage = function () {
      this.emit("error", new Error("refused by policy"));
    };
    try {
      const model = await tessel.load(digits.bundle, { threads: 2, relaxedSimd: false });
      assert.deepEqual(model.variant, { code: "model.threads.wasm", features: ["threads"], threads: 1 });
      const outputs = await model.run(await feedsOf(digits));
      assertClose(outputs.probabilities.data, await readArray(digits.expected.probabilities), "digits");
      model.dispose();
    } finally {
      workers.Worker.prototype.postMessage = post;
      console.warn = warn;
    }
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /running on 1 thread: a wasm thread-pool worker did not start \(refused by policy\)/);
  });

  test("a thread count that is not a whole number", async () => {
    await assert.rejects(tessel.load(digits.bundle, { threads: 0 }), /threads must be a whole number of at least 1/);
    await assert.rejects(tessel.load(digits.bundle, { threads: 1.5 }), /threads must be a whole number/);
  });
});
