// tessel.js on a bundle with symbolic sizes (seq in 1..40, past in 1..9): every run of one bundle matches onnxruntime
// and the Python runtime bit for bit, on one thread and two; the model says what it takes (shapes with size
// expressions, its sizes); inputs outside the ranges, of the wrong rank, whose sizes disagree or without dims are
// refused naming the input, the axis and the size; manifests with wrong sizes are refused naming the field. Run by
// tests/web/test_node_sizes.py, which passes TESSEL_SIZES_CASES.

import assert from "node:assert/strict";
import { cp, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const { bundle, static: staticBundle, runs, scratch } = JSON.parse(await readFile(process.env.TESSEL_SIZES_CASES, "utf8"));
const RTOL = 1e-4;
const ATOL = 1e-5;

async function readArray({ file }) {
  const bytes = await readFile(file);
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

async function feedsOf(run) {
  const feeds = {};
  for (const [name, spec] of Object.entries(run.inputs)) feeds[name] = { data: await readArray(spec), dims: spec.shape };
  return feeds;
}

function assertClose(actual, expected, label) {
  assert.equal(actual.length, expected.length, `${label}: length`);
  for (let index = 0; index < expected.length; index++) {
    const excess = Math.abs(actual[index] - expected[index]) - (ATOL + RTOL * Math.abs(expected[index]));
    if (!(excess <= 0)) assert.fail(`${label}[${index}] = ${actual[index]}, onnxruntime says ${expected[index]}`);
  }
}

const feed = (dims) => ({ data: new Float32Array(dims.reduce((product, size) => product * size, 1)), dims });
const feedsAt = (seq, past) => ({ x: feed([1, seq, 16]), bias: feed([seq, 8]), past: feed([past, 8]) });

describe("one bundle runs every size in its ranges", () => {
  for (const threads of [1, 2]) {
    test(`against onnxruntime and the Python runtime, ${threads} thread(s)`, async () => {
      const model = await tessel.load(bundle, { threads });
      assert.equal(model.variant.threads, threads);
      for (const run of runs) {
        const outputs = await model.run(await feedsOf(run));
        const label = `seq ${run.seq}, past ${run.past}`;
        for (const [name, spec] of Object.entries(run.expected)) {
          assert.deepEqual(outputs[name].dims, spec.shape, `${label}: ${name}'s dims`);
          assert.ok(outputs[name].data instanceof Float32Array);
          assertClose(outputs[name].data, await readArray(spec), `${label}: ${name}`);
          const python = await readArray(run.python[name]);
          assert.deepEqual(Array.from(outputs[name].data), Array.from(python), `${label}: ${name} bit for bit as Python's`);
        }
      }
      model.dispose();
    });
  }

  test("a run after a larger one gives what a fresh model gives (no leftovers in the largest-shape slots)", async () => {
    const small = runs.find((run) => run.seq === 7);
    const large = runs.find((run) => run.seq === 40);
    const fresh = await tessel.load(bundle);
    const expected = await fresh.run(await feedsOf(small));
    const model = await tessel.load(bundle);
    await model.run(await feedsOf(large));
    const again = await model.run(await feedsOf(small));
    for (const name of model.outputNames) assert.deepEqual(Array.from(again[name].data), Array.from(expected[name].data), name);
    // the caller's arrays are neither kept nor changed
    const feeds = await feedsOf(small);
    const copy = Array.from(feeds.x.data);
    const first = await model.run(feeds);
    assert.deepEqual(Array.from(feeds.x.data), copy);
    assert.notEqual((await model.run(feeds)).y.data, first.y.data);
  });
});

describe("the model says what it takes", () => {
  test("shapes with size expressions, and the sizes with their ranges", async () => {
    const model = await tessel.load(bundle);
    assert.deepEqual(model.sizes, [
      { name: "past", min: 1, max: 9 },
      { name: "seq", min: 1, max: 40 },
    ]);
    assert.deepEqual(model.inputs, [
      { name: "x", shape: [1, "seq", 16], dtype: "float32" },
      { name: "bias", shape: ["seq", 8], dtype: "float32" },
      { name: "past", shape: ["past", 8], dtype: "float32" },
    ]);
    assert.deepEqual(
      model.outputs.map(({ name, shape }) => [name, shape]),
      [["y", [1, "seq", 8]], ["t", [1, 8, "seq"]], ["s", [1, 1, 8]], ["c", ["past+seq", 8]]],
    );
    assert.deepEqual(model.manifest.entry.arguments, ["inputs...", "outputs...", "params", "arena", "sizes"]);
    // a static model has no sizes and runs as before
    const fixed = await tessel.load(staticBundle);
    assert.deepEqual(fixed.sizes, []);
    assert.deepEqual(fixed.inputs, [{ name: "x", shape: [2, 3], dtype: "float32" }]);
    const { y } = await fixed.run({ x: Float32Array.of(-1, 2, -3, 4, -5, 6) });
    assert.deepEqual([Array.from(y.data), y.dims], [[0, 2, 0, 4, 0, 6], [2, 3]]);
    await assert.rejects(fixed.run({ x: { data: new Float32Array(6), dims: [3, 2] } }), /compile with another input shape/);
  });
});

describe("inputs a run refuses", () => {
  const refusals = [
    [
      "seq above its range",
      feedsAt(41, 1),
      "x",
      new RegExp(
        String.raw`input "x" axis 1 gives the size seq = 41, outside the range 1\.\.40 the model was` +
          String.raw` compiled for; compile it with a range that holds it \(tessel compile --dim seq=LOW\.\.HIGH\)`,
      ),
    ],
    [
      "past below its range",
      feedsAt(3, 0),
      "past",
      /input "past" axis 0 gives the size past = 0, outside the range 1\.\.9/,
    ],
    [
      "a wrong rank",
      { ...feedsAt(3, 2), x: feed([3, 16]) },
      "x",
      /input "x" has dims \[3, 16\], of rank 2; the model takes rank 3 \(\[1, seq, 16\]\)/,
    ],
    [
      "sizes that disagree",
      { ...feedsAt(3, 2), bias: feed([4, 8]) },
      "bias",
      new RegExp(
        String.raw`input "bias" has 4 at axis 0, which is the size seq, but input "x" axis 1 gives seq = 3;` +
          String.raw` give inputs whose seq agrees`,
      ),
    ],
    [
      "a fixed dim that differs",
      { ...feedsAt(3, 2), x: feed([1, 3, 15]) },
      "x",
      /input "x" has dims \[1, 3, 15\], the model takes \[1, 3, 16\] \(\[1, seq, 16\]\) at past = 2, seq = 3/,
    ],
    [
      "no dims for a symbolic input",
      { ...feedsAt(3, 2), x: new Float32Array(48) },
      "x",
      /input "x" has the symbolic shape \[1, seq, 16\]: give it as \{data, dims\}/,
    ],
    [
      "dims that do not hold the data",
      { ...feedsAt(3, 2), x: { data: new Float32Array(40), dims: [1, 3, 16] } },
      "x",
      /input "x" has 40 elements, its dims \[1, 3, 16\] hold 48/,
    ],
    [
      "dims that are not whole numbers",
      { ...feedsAt(3, 2), past: { data: new Float32Array(16), dims: [2.5, 8] } },
      "past",
      /input "past" has dims \[2\.5, 8\]; each must be a whole number/,
    ],
  ];
  for (const [label, feeds, field, message] of refusals) {
    test(label, async () => {
      const model = await tessel.load(bundle);
      await assert.rejects(model.run(feeds), (error) => {
        assert.equal(error.name, "TesselError");
        assert.equal(error.code, "input");
        assert.equal(error.field, field);
        assert.match(error.message, message);
        return true;
      });
      // and the model still runs
      assert.deepEqual((await model.run(feedsAt(2, 1))).c.dims, [3, 8]);
      model.dispose();
    });
  }
});

describe("manifests a load refuses", () => {
  const edits = [
    [
      "an empty range",
      (manifest) => (manifest.sizes[1].min = 41),
      "sizes[1].max",
      /sizes\[1\]\.max must be at least its min \(41\), got 40/,
    ],
    [
      "a repeated size",
      (manifest) => (manifest.sizes[1].name = "past"),
      "sizes[1].name",
      /must be a name no other size has, got "past"/,
    ],
    ["a size that is no name", (manifest) => (manifest.sizes[0].name = "2past"), "sizes[0].name", /must be a name/],
    [
      "a size above int32",
      (manifest) => (manifest.sizes[1].max = 2 ** 31),
      "sizes[1].max",
      /a whole number in \[0, 2147483647\]/,
    ],
    [
      "an unknown size",
      (manifest) => (manifest.inputs[0].shape[1] = "seqq"),
      "inputs[0].shape[1]",
      /must be a size expression over the sizes past, seq, got "seqq"/,
    ],
    [
      "a broken expression",
      (manifest) => (manifest.outputs[3].shape[0] = "past+-seq"),
      "outputs[3].shape[0]",
      /a size expression over the sizes/,
    ],
    [
      "a negative largest dim",
      (manifest) => (manifest.outputs[3].shape[0] = "-seq"),
      "outputs[3].shape[0]",
      /a size expression/,
    ],
    [
      "a character no expression has",
      (manifest) => (manifest.outputs[0].shape[1] = "seq/2"),
      "outputs[0].shape[1]",
      /must be a size expression, got "seq\/2"/,
    ],
    ["size expressions without sizes", (manifest) => delete manifest.sizes, "inputs[0].shape[1]", /over no sizes/],
    [
      "a size no input dim is alone",
      (manifest) => (manifest.inputs[2].shape[0] = "2*past"),
      "sizes[0]",
      /no input dimension is the size past alone/,
    ],
  ];
  for (const [label, edit, field, message] of edits) {
    test(label, async () => {
      const directory = join(scratch, label.replace(/\W+/g, "-"));
      await cp(bundle, directory, { recursive: true });
      const manifest = JSON.parse(await readFile(join(directory, "manifest.json"), "utf8"));
      edit(manifest);
      await writeFile(join(directory, "manifest.json"), JSON.stringify(manifest));
      await assert.rejects(tessel.load(directory), (error) => {
        assert.equal(error.name, "TesselError");
        assert.equal(error.code, "manifest");
        assert.equal(error.field, field);
        assert.match(error.message, message);
        return true;
      });
    });
  }

  test("an equivalent expression that passes the schema is still bound by the binding digest", async () => {
    const directory = join(scratch, "respelled");
    await cp(bundle, directory, { recursive: true });
    const manifest = JSON.parse(await readFile(join(directory, "manifest.json"), "utf8"));
    manifest.outputs[3].shape[0] = "seq+past";
    await writeFile(join(directory, "manifest.json"), JSON.stringify(manifest));
    await assert.rejects(tessel.load(directory), { name: "TesselError", code: "binding" });
  });
});
