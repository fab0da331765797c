// tessel.js refuses what compiler/runtime refuses: an index out of range (the run entry's failed call), a
// damaged model.wasm (the digest message before the engine's CompileError), a rehashed one (a clear message
// instead of the raw CompileError) and a manifest whose sizes are not whole numbers. Run by
// tests/web/test_node_checks.py, which passes TESSEL_CHECK_CASES.

import assert from "node:assert/strict";
import { cp, readFile, writeFile } from "node:fs/promises";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { describe, test } from "node:test";

import * as tessel from "../../web_runtime/tessel.js";

const { gather, expected, scratch } = JSON.parse(await readFile(process.env.TESSEL_CHECK_CASES, "utf8"));
const data = Float32Array.from({ length: 15 }, (_, index) => index);
const feeds = (last) => ({ x: { data, dims: [5, 3] }, i: { data: BigInt64Array.from([2n, last]), dims: [2] } });

async function copyBundle(name, edit) {
  const directory = join(scratch, name);
  await cp(gather, directory, { recursive: true });
  const manifest = JSON.parse(await readFile(join(directory, "manifest.json"), "utf8"));
  await edit(directory, manifest);
  return directory;
}

async function rehash(directory, manifest) {
  for (const name of Object.keys(manifest.files)) {
    manifest.files[name] = createHash("sha256").update(await readFile(join(directory, name))).digest("hex");
  }
  await writeFile(join(directory, "manifest.json"), JSON.stringify(manifest));
}

describe("index checks", () => {
  for (const index of [5n, 1000n, -1000n, 2n ** 40n, 2n ** 32n + 1n]) {
    test(`index ${index} into a dim of 5 is refused`, async () => {
      const model = await tessel.load(gather);
      await assert.rejects(model.run(feeds(index)), /index is out of range in Gather \(group /);
      model.dispose();
    });
  }

  test("negative indices in range match onnxruntime, also after a failure", async () => {
    const model = await tessel.load(gather);
    await assert.rejects(model.run(feeds(5n)));
    for (const [index, rows] of Object.entries(expected)) {
      const { y } = await model.run(feeds(BigInt(index)));
      assert.deepEqual(Array.from(y.data), rows);
    }
    model.dispose();
  });
});

describe("damaged bundles", () => {
  test("a truncated model.wasm gives the digest message", async () => {
    const directory = await copyBundle("truncated", async (path) => {
      const code = await readFile(join(path, "model.wasm"));
      await writeFile(join(path, "model.wasm"), code.subarray(0, code.length >> 1));
    });
    await assert.rejects(tessel.load(directory), /model\.wasm does not match the manifest's sha256/);
  });

  test("a truncated model.wasm, rehashed, is named as not a valid module", async () => {
    const directory = await copyBundle("truncated-rehashed", async (path, manifest) => {
      const code = await readFile(join(path, "model.wasm"));
      await writeFile(join(path, "model.wasm"), code.subarray(0, code.length >> 1));
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), /tessel: model\.wasm is not a valid wasm module/);
  });

  test("an arena size that is not a whole number is refused before memory is sized", async () => {
    const directory = await copyBundle("arena", async (path, manifest) => {
      manifest.memory.arena_bytes = -64;
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), /memory\.arena_bytes must be a whole number/);
  });

  test("an entry that does not take the manifest's arguments is refused", async () => {
    const directory = await copyBundle("inputs", async (path, manifest) => {
      manifest.inputs.push({ ...manifest.inputs[0], name: "extra" });
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), /has no entry taking the manifest's 6 arguments/);
  });
});
