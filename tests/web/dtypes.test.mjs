// tessel.js's dtypes in Node 20: every dtype in and out of a bundle against onnxruntime, the typed arrays each input
// takes and the error for any other, and float32ToFloat16Bits / float16BitsToFloat32 against numpy's float16. Run by
// tests/web/test_node_dtypes.py, which passes TESSEL_DTYPE_CASES.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { describe, test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const { models, conversions } = JSON.parse(await readFile(process.env.TESSEL_DTYPE_CASES, "utf8"));

// numpy's dtype -> the typed array of its bytes; Node 20 has no Float16Array, so float16 results are its bits
const ARRAYS = {
  float16: Uint16Array,
  float32: Float32Array,
  float64: Float64Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  int32: Int32Array,
  int64: BigInt64Array,
  bool: Uint8Array,
  uint16: Uint16Array,
  uint32: Uint32Array,
};

async function readArray({ file, dtype }) {
  const bytes = await readFile(file);
  return new ARRAYS[dtype](bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

const bytesOf = (array) => Array.from(new Uint8Array(array.buffer, array.byteOffset, array.byteLength));

test("Node 20 has no Float16Array: float16 results come back as Uint16Array bits", () => {
  assert.equal(typeof globalThis.Float16Array, "undefined");
});

describe("float16 conversions against numpy", () => {
  test("every float16 bit pattern as float32, exactly; NaN patterns as NaN", async () => {
    const halves = await readArray(conversions.halves);
    const expected = new Uint32Array((await readArray(conversions.halves_as_float)).buffer);
    assert.equal(halves.length, 65536);
    const floats = tessel.float16BitsToFloat32(halves);
    const words = new Uint32Array(floats.buffer);
    let nans = 0;
    for (let bits = 0; bits < 65536; bits++) {
      if ((bits & 0x7c00) === 0x7c00 && bits & 0x3ff) {
        nans++;
        assert.ok(Number.isNaN(floats[bits]), `0x${bits.toString(16)} is a NaN`);
        assert.equal(words[bits] >>> 31, bits >>> 15, `0x${bits.toString(16)} keeps its sign`);
      } else {
        assert.equal(words[bits], expected[bits], `0x${bits.toString(16)}`);
      }
    }
    assert.equal(nans, 2046);
    // and back: every float16 but NaN is its own float32's nearest float16
    const back = tessel.float32ToFloat16Bits(floats);
    for (let bits = 0; bits < 65536; bits++) {
      if (!Number.isNaN(floats[bits])) assert.equal(back[bits], bits, `0x${bits.toString(16)} round trip`);
      else assert.equal(back[bits] & 0xfc00 | 0x8000, 0xfc00, `0x${bits.toString(16)} stays NaN`);
    }
  });

  test("float32 values as the nearest float16, ties to even, overflow to infinity, subnormals, NaN", async () => {
    const floats = await readArray(conversions.floats);
    const expected = await readArray(conversions.floats_as_half);
    const bits = tessel.float32ToFloat16Bits(floats);
    const words = new Uint32Array(floats.buffer);
    let ties = 0;
    for (let position = 0; position < floats.length; position++) {
      const value = floats[position];
      if (Number.isNaN(value)) {
        assert.equal(bits[position] & 0x7c00, 0x7c00, `NaN ${words[position].toString(16)}`);
        assert.notEqual(bits[position] & 0x3ff, 0, `NaN ${words[position].toString(16)} stays NaN`);
        assert.equal(bits[position] >>> 15, words[position] >>> 31, "the sign of NaN");
      } else {
        assert.equal(bits[position], expected[position], `${value} (0x${words[position].toString(16)})`);
      }
      // a value exactly between two float16 values (its float32 bits below float16's precision are 1000...)
      if (Math.abs(value) >= 2 ** -14 && Math.abs(value) < 65504 && (words[position] & 0x1fff) === 0x1000) ties++;
    }
    assert.ok(ties > 30000, `${ties} ties checked`);
  });

  test("the helpers take only their typed array", () => {
    assert.throws(() => tessel.float32ToFloat16Bits([1, 2]), { name: "TesselError", code: "input", field: "values" });
    assert.throws(() => tessel.float32ToFloat16Bits(new Float64Array(2)), /takes a Float32Array, got Float64Array/);
    assert.throws(() => tessel.float16BitsToFloat32(new Int16Array(2)), { name: "TesselError", code: "input", field: "bits" });
  });
});

// a typed array that no dtype's input takes, to be refused
const WRONG = { float32: Float64Array, float64: Float32Array, float16: Int16Array, int8: Uint8Array, uint8: Int8Array };

for (const { dtype, bundle, runs } of models) {
  describe(`dtype ${dtype}`, () => {
    test("inputs and outputs, as typed arrays and as {data, dims}, as onnxruntime gives them", async () => {
      const model = await tessel.load(bundle);
      assert.deepEqual(model.inputs.map((spec) => spec.dtype), [dtype, "float32"]);
      assert.deepEqual(
        model.outputs.map((spec) => spec.dtype),
        [dtype, "float32", dtype, dtype, dtype],
      );
      for (const run of runs) {
        const x = await readArray(run.inputs.x);
        const f = await readArray(run.inputs.f);
        const given = [x, { data: x, dims: run.inputs.x.shape }];
        if (dtype === "float16") {
          // the same float16 values as float32: rounded to the same bits
          given.push(run.inputs.x_float32 ? await readArray(run.inputs.x_float32) : tessel.float16BitsToFloat32(x));
        }
        if (dtype === "uint8") given.push(new Uint8ClampedArray(x.buffer));
        for (const input of given) {
          const outputs = await model.run({ x: input, f });
          for (const [name, spec] of Object.entries(run.expected)) {
            const result = outputs[name];
            assert.equal(result.dtype, name === "as_float" ? "float32" : dtype, name);
            assert.deepEqual(result.dims, spec.shape, name);
            assert.ok(result.data instanceof ARRAYS[spec.dtype], `${name} is a ${ARRAYS[spec.dtype].name}`);
            assert.deepEqual(bytesOf(result.data), bytesOf(await readArray(spec)), `${name} from ${input.constructor.name}`);
          }
        }
      }
      model.dispose();
    });

    test("any other typed array is refused, naming the input, the dtype and the arrays it takes", async () => {
      const model = await tessel.load(bundle);
      const f = new Float32Array(24);
      const Wrong = WRONG[dtype] || Float32Array;
      const error = await model.run({ x: new Wrong(24), f }).catch((caught) => caught);
      assert.ok(error instanceof tessel.TesselError, String(error));
      assert.equal(error.code, "input");
      assert.equal(error.field, "x");
      assert.match(error.message, new RegExp(`input "x" \\(dtype ${dtype}\\) must be .*, got ${Wrong.name}`));
      const takes = {
        float16: /a Uint16Array of float16 bits or a Float32Array \(rounded to float16\)/,
        int8: /must be an Int8Array/,
        int16: /must be an Int16Array/,
        int32: /must be an Int32Array/,
        int64: /must be a BigInt64Array.*BigInt64Array\.from\(values, BigInt\)/,
        uint8: /must be a Uint8Array or a Uint8ClampedArray/,
        float64: /must be a Float64Array/,
        bool: /must be a Uint8Array of 0 and 1/,
      }[dtype];
      assert.match(error.message, takes);
      if (dtype === "bool") {
        await assert.rejects(model.run({ x: Uint8Array.from({ length: 24 }, (_, i) => (i === 5 ? 2 : 1)), f }), {
          code: "input",
          field: "x",
          message: /holds 2 at 5; a bool is 0 or 1/,
        });
      }
      model.dispose();
    });
  });
}
