// tessel.js's model.generate on GPT-2 (small, random weights) exported with its KV cache and compiled for wasm with
// symbolic past (0..63) and seq (1..64): greedy tokens equal Python's Module.generate, each step's logits row equals
// Python's bit for bit, and per step only that row is copied out of the wasm memory while only the cache rows the step
// before added move inside it; on 2 threads too; stop tokens, seeded sampling, onToken awaited and the loop yielding, a
// cache past its range, bad options and prompts, models without a cache, a run between steps, dispose and WebGPU. Run
// by tests/web/test_node_generate.py, which passes TESSEL_GENERATE_CASES.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { describe, test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const cases = JSON.parse(await readFile(process.env.TESSEL_GENERATE_CASES, "utf8"));
const { bundle, prompt, greedy, sampledPrompt, tokens: TOKENS } = cases;
const N = greedy.length;

async function readRows({ file, shape }) {
  const bytes = await readFile(file);
  const rows = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  return Array.from({ length: shape[0] }, (_, row) => rows.subarray(row * shape[1], (row + 1) * shape[1]));
}

async function rejects(promise, code, field, pattern) {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof tessel.TesselError, `a TesselError, got ${error}`);
    assert.equal(error.code, code, error.message);
    assert.equal(error.field, field, error.message);
    assert.match(error.message, pattern);
    return true;
  });
}

// Every copy between the wasm memory and JavaScript arrays that tessel.js makes goes through TypedArray's set (moveBox,
// copyOut); copyWithin moves bytes inside the memory. These count them, per step, for one memory.
const TypedArray = Object.getPrototypeOf(Uint8Array.prototype);
const { set, copyWithin } = TypedArray;
function watch(memory) {
  const steps = [];
  const count = () => steps.at(-1);
  const begin = () => steps.push({ read: 0, reads: [], written: 0, within: 0 });
  TypedArray.set = function (source, offset) {
    const bytes = ArrayBuffer.isView(source) ? source.byteLength : source.length * this.BYTES_PER_ELEMENT;
    const from = ArrayBuffer.isView(source) && source.buffer === memory;
    if (count() && from && this.buffer !== memory) {
      count().read += bytes;
      count().reads.push(new Float32Array(new Uint8Array(source.buffer, source.byteOffset, source.byteLength).slice().buffer));
    }
    if (count() && this.buffer === memory && !from) count().written += bytes;
    return set.call(this, source, offset);
  };
  TypedArray.copyWithin = function (target, start, end) {
    if (count() && this.buffer === memory) count().within += (end ?? this.length) - start;
    return copyWithin.call(this, target, start, end);
  };
  begin();
  return {
    steps,
    begin,
    stop() {
      TypedArray.set = set;
      TypedArray.copyWithin = copyWithin;
    },
  };
}

describe("generate follows Python's loop", () => {
  for (const threads of [1, 2]) {
    test(`greedy on ${threads} thread(s): Python's tokens and logits rows; per step only that row leaves the memory, the new cache rows move inside it`, async () => {
      const model = await tessel.load(bundle, { threads });
      assert.equal(model.variant.threads, threads);
      const rows = await readRows(cases.logits);
      const vocabulary = model.outputs.find((spec) => spec.name === "logits").shape[2];
      // bytes of one token's keys and values over every cache input
      const cachePerToken = model.inputs
        .filter((spec) => spec.name.startsWith("past_key_values."))
        .reduce((sum, spec) => sum + spec.shape[1] * spec.shape[3] * 4, 0);
      const seen = [];
      const watcher = watch(model.executor.memory.buffer);
      let got;
      try {
        got = await model.generate(prompt, {
          maxNewTokens: N,
          onToken(token) {
            seen.push(token);
            watcher.begin();
          },
        });
      } finally {
        watcher.stop();
      }
      assert.deepEqual(got, greedy);
      assert.deepEqual(seen, greedy);
      watcher.steps.slice(0, N).forEach((step, index) => {
        const [seq, past] = index === 0 ? [prompt.length, 0] : [1, prompt.length + index - 1];
        assert.equal(step.read, vocabulary * 4, `step ${index}: only the last position's logits leave the memory`);
        assert.deepEqual(Array.from(step.reads[0]), Array.from(rows[index]), `step ${index}: the logits row, bit for bit as Python's`);
        // the ids and the mask (int64s) and the sizes (int32s) go in; no cache does
        assert.equal(step.written, 8 * (seq + past + seq) + 4 * model.sizes.length, `step ${index}: bytes written into memory`);
        // only the rows the step before added move: the prompt's before the first decode step, then one token's
        const added = index === 0 ? 0 : index === 1 ? prompt.length : 1;
        assert.equal(step.within, cachePerToken * added, `step ${index}: the new past rows moved within the memory`);
      });
      assert.equal(watcher.steps.length, N + 1);
      assert.deepEqual(watcher.steps[N], { read: 0, reads: [], written: 0, within: 0 }, "nothing after the last step");
      model.dispose();
    });
  }

  test("from typed arrays and a [1, n] prompt, the same tokens", async () => {
    const model = await tessel.load(bundle);
    assert.deepEqual(await model.generate(BigInt64Array.from(prompt, BigInt), { maxNewTokens: N }), greedy);
    assert.deepEqual(await model.generate([Int32Array.from(prompt)], { maxNewTokens: 5 }), greedy.slice(0, 5));
    model.dispose();
  });

  test("a stop token ends the run after it; maxNewTokens 0 runs nothing", async () => {
    const model = await tessel.load(bundle);
    const last = Math.max(...greedy.map((token, index) => (greedy.indexOf(token) === index ? index : 0)));
    const seen = [];
    const stopped = await model.generate(prompt, { maxNewTokens: N, stopToken: greedy[last], onToken: (token) => seen.push(token) });
    assert.deepEqual(stopped, greedy.slice(0, last + 1));
    assert.deepEqual(seen, stopped);
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: 0, onToken: () => assert.fail("no token") }), []);
    model.dispose();
  });

  test("sampling: a seed repeats its draws, another seed draws others, top-k 1 and a tiny top-p are greedy", async () => {
    const model = await tessel.load(bundle);
    const vocabulary = model.outputs.find((spec) => spec.name === "logits").shape[2];
    const options = { maxNewTokens: N, temperature: 0.9, topK: 50, topP: 0.95, seed: 7 };
    const first = await model.generate(sampledPrompt, options);
    assert.equal(first.length, N);
    assert.ok(first.every((token) => Number.isInteger(token) && token >= 0 && token < vocabulary));
    assert.deepEqual(await model.generate(sampledPrompt, options), first);
    assert.notDeepEqual(await model.generate(sampledPrompt, { ...options, seed: 8 }), first);
    const unseeded = await model.generate(sampledPrompt, { maxNewTokens: 3, temperature: 1 });
    assert.equal(unseeded.length, 3);
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: N, temperature: 2, topK: 1, seed: 1 }), greedy);
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: N, temperature: 2, topP: 1e-9, seed: 1 }), greedy);
    model.dispose();
  });

  test("onToken is awaited, and other tasks run between steps", async () => {
    const model = await tessel.load(bundle);
    // a task queued as one token is chosen has run when the next is chosen: the loop yields to the event loop
    const ran = [];
    let calls = 0;
    const onToken = (token) => {
      assert.equal(ran.length, calls);
      calls += 1;
      setImmediate(() => ran.push(token));
    };
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: 6, onToken }), greedy.slice(0, 6));
    // a promise onToken returns settles before the next step, and before generate resolves
    let [started, settled] = [0, 0];
    const later = () => {
      assert.equal(settled, started);
      started += 1;
      return new Promise((resolve) => setTimeout(resolve, 5)).then(() => (settled += 1));
    };
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: 6, onToken: later }), greedy.slice(0, 6));
    assert.equal(settled, 6);
    model.dispose();
  });
});

describe("what generate refuses", () => {
  test("a cache past its range names the size, after the tokens that fit", async () => {
    const model = await tessel.load(bundle);
    const long = Array.from({ length: TOKENS - 5 }, (_, index) => index + 1);
    const seen = [];
    await rejects(
      model.generate(long, { maxNewTokens: 10, onToken: (token) => seen.push(token) }),
      "input",
      "past_key_values.0.key",
      /generate stopped after 6 new tokens.*the size past = 64, outside the range 0\.\.63/,
    );
    assert.equal(seen.length, 6);
    const tooLong = Array.from({ length: TOKENS + 1 }, (_, index) => index + 1);
    await rejects(model.generate(tooLong, { maxNewTokens: 1 }), "input", "input_ids", /the size seq = 65, outside the range 1\.\.64/);
    // and the model generates on
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: N }), greedy);
    model.dispose();
  });

  test("bad options and prompts, by name", async () => {
    const model = await tessel.load(bundle);
    const bad = [
      [{}, "maxNewTokens", /generate needs maxNewTokens/],
      [{ maxNewTokens: -1 }, "maxNewTokens", /maxNewTokens must be a whole number >= 0, got -1/],
      [{ maxNewTokens: 1.5 }, "maxNewTokens", /got 1\.5/],
      [{ maxNewTokens: "3" }, "maxNewTokens", /got "3"/],
      [{ maxNewTokens: 3, temperature: -1 }, "temperature", /temperature must be >= 0 \(0: greedy\), got -1/],
      [{ maxNewTokens: 3, temperature: NaN }, "temperature", /got NaN/],
      [{ maxNewTokens: 3, temperature: 1, topK: 0 }, "topK", /topK must be a whole number >= 1, got 0/],
      [{ maxNewTokens: 3, topK: 2.5 }, "topK", /got 2\.5/],
      [{ maxNewTokens: 3, temperature: 1, topP: 0 }, "topP", /topP must lie in \(0, 1\], got 0/],
      [{ maxNewTokens: 3, topP: 1.5 }, "topP", /got 1\.5/],
      [{ maxNewTokens: 3, seed: -1 }, "seed", /seed must be a whole number >= 0, got -1/],
      [{ maxNewTokens: 3, stopToken: "eos" }, "stopToken", /stopToken must be a token id/],
      [{ maxNewTokens: 3, onToken: 5 }, "onToken", /onToken must be a function/],
      [{ max_new_tokens: 3 }, "max_new_tokens", /unknown option "max_new_tokens"; generate takes maxNewTokens, temperature/],
    ];
    for (const [options, field, pattern] of bad) await rejects(model.generate(prompt, options), "options", field, pattern);
    await rejects(model.generate(prompt), "options", "maxNewTokens", /generate takes the options/);
    await rejects(model.generate(prompt, 12), "options", "maxNewTokens", /generate takes the options/);
    for (const [given, pattern] of [
      [[], /non-empty array of token ids .*got an empty one/],
      [[1, 2.5], /got one holding 2\.5 at 1/],
      [["1"], /got one holding "1" at 0/],
      ["abc", /got "abc"/],
      [Float32Array.of(), /got an empty one/],
    ]) {
      await rejects(model.generate(given, { maxNewTokens: 1 }), "input", "prompt", pattern);
    }
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: N, topK: null, topP: undefined }), greedy);
    model.dispose();
  });

  test("a model without a cache, or without input_ids, says what is missing", async () => {
    const noCache = await tessel.load(cases.noCache);
    await rejects(noCache.generate([1, 2], { maxNewTokens: 2 }), "generate", "past_key_values", /exported with its cache .*use_cache=True/);
    noCache.dispose();
    const relu = await tessel.load(cases.static);
    await rejects(relu.generate([1, 2], { maxNewTokens: 2 }), "generate", "input_ids", /generate needs a model that takes input_ids; this one takes x/);
    relu.dispose();
  });

  test("a run between two steps: that generate rejects, the next one runs right", async () => {
    const model = await tessel.load(bundle);
    const feeds = {
      input_ids: { data: BigInt64Array.of(7n, 8n), dims: [1, 2] },
      attention_mask: { data: BigInt64Array.of(1n, 1n), dims: [1, 2] },
    };
    for (const spec of model.inputs.filter((spec) => spec.name.startsWith("past_key_values."))) {
      feeds[spec.name] = { data: new Float32Array(0), dims: [1, spec.shape[1], 0, spec.shape[3]] };
    }
    let ran = false;
    const interrupted = model.generate(prompt, {
      maxNewTokens: N,
      async onToken() {
        if (!ran) await model.run(feeds);
        ran = true;
      },
    });
    await rejects(interrupted, "generate", null, /the cache of this generate was overwritten/);
    // two at once: the second's prefill overwrites the first's cache
    const [first, second] = await Promise.allSettled([
      model.generate(prompt, { maxNewTokens: N }),
      model.generate(prompt, { maxNewTokens: N }),
    ]);
    assert.equal(first.status, "rejected");
    assert.equal(first.reason.code, "generate");
    assert.deepEqual(second.value, greedy);
    assert.deepEqual(await model.generate(prompt, { maxNewTokens: N }), greedy);
    model.dispose();
  });

  test("dispose during generate, and a backend without steps (WebGPU)", async () => {
    const model = await tessel.load(bundle);
    await rejects(model.generate(prompt, { maxNewTokens: N, onToken: () => model.dispose() }), "disposed", null, /disposed during generate/);
    await rejects(model.generate(prompt, { maxNewTokens: 1 }), "disposed", null, /disposed/);
    const gpu = new tessel.Model(model.manifest, "webgpu", { run: async () => [], dispose() {} }, "asked for webgpu");
    await rejects(gpu.generate(prompt, { maxNewTokens: 1 }), "backend", "webgpu", /generate runs on the wasm backend.*WebGPU/);
  });
});
