// tessel.js's int64 inputs and outputs (BigInt64Array) against onnxruntime: the bundle and the runs that
// tests/web/test_node_int64.py wrote, fed as plain typed arrays and as {data, dims}. Run by that file, which passes
// TESSEL_INT64_CASES.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const { bundle, runs } = JSON.parse(await readFile(process.env.TESSEL_INT64_CASES, "utf8"));
const ARRAY_TYPES = { float32: Float32Array, int64: BigInt64Array };

async function readArray({ file, dtype }) {
  const bytes = await readFile(file);
  return new ARRAY_TYPES[dtype](bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

test("the manifest and the model describe the int64 input and output", async () => {
  const model = await tessel.load(bundle);
  assert.deepEqual(
    model.inputs.map(({ name, dtype }) => [name, dtype]),
    [
      ["table", "float32"],
      ["indices", "int64"],
    ],
  );
  assert.equal(model.outputs.find((spec) => spec.name === "code").dtype, "int64");
  model.dispose();
});

for (const [position, run] of runs.entries()) {
  test(`run ${position}: int64 in, int64 and float32 out, as onnxruntime gives`, async () => {
    const model = await tessel.load(bundle);
    const arrays = {};
    for (const [name, spec] of Object.entries(run.inputs)) arrays[name] = await readArray(spec);
    const dimensioned = Object.fromEntries(
      Object.entries(arrays).map(([name, data]) => [name, { data, dims: run.inputs[name].shape }]),
    );
    for (const feeds of [arrays, dimensioned]) {
      const outputs = await model.run(feeds);
      for (const [name, spec] of Object.entries(run.expected)) {
        const expected = await readArray(spec);
        assert.equal(outputs[name].dtype, spec.dtype, name);
        assert.deepEqual(outputs[name].dims, spec.shape, name);
        assert.ok(outputs[name].data instanceof ARRAY_TYPES[spec.dtype], `${name} is a ${spec.dtype} array`);
        // Gather copies, ArgMax and integer arithmetic are exact; the cast rounds as onnxruntime's does
        assert.deepEqual(Array.from(outputs[name].data), Array.from(expected), name);
      }
    }
    model.dispose();
  });
}

test("an int64 input given as a Float32Array is refused", async () => {
  const model = await tessel.load(bundle);
  const table = await readArray(runs[0].inputs.table);
  await assert.rejects(model.run({ table, indices: new Float32Array(4) }), /indices/);
  model.dispose();
});
