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

const { gather, other, digests, expected, scratch } = JSON.parse(await readFile(process.env.TESSEL_CHECK_CASES, "utf8"));
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

  test("a truncated model.wasm, rehashed, fails its own seal", async () => {
    const directory = await copyBundle("truncated-rehashed", async (path, manifest) => {
      const code = await readFile(join(path, "model.wasm"));
      await writeFile(join(path, "model.wasm"), code.subarray(0, code.length >> 1));
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), { name: "TesselError", code: "seal", field: "model.wasm" });
  });

  test("bytes that are no wasm, sealed and rehashed, are named as not a valid module", async () => {
    const directory = await copyBundle("resealed", async (path, manifest) => {
      await writeFile(join(path, "model.wasm"), seal(Buffer.from("\0asm\x01\0\0\0 not a module")));
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

  test("a manifest edited and rehashed is refused by the code's binding digest", async () => {
    const directory = await copyBundle("inputs", async (path, manifest) => {
      manifest.inputs.push({ ...manifest.inputs[0], name: "extra" });
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), { name: "TesselError", code: "binding", field: "model.wasm" });
  });
});

// The same sealed code for another manifest: what a copied or swapped model.wasm looks like.
function seal(body) {
  const name = Buffer.from("tessel.sha256");
  const digest = createHash("sha256").update(body).digest();
  return Buffer.concat([body, Buffer.from([0, name.length + 33, name.length]), name, digest]);
}

describe("every field is checked and named", () => {
  const edits = {
    "outputs[0].shape": (manifest) => (manifest.outputs[0].shape = manifest.outputs[0].shape.map((size) => size * 2)),
    "outputs[0].dtype": (manifest) => (manifest.outputs[0].dtype = "int32"),
    "target": (manifest) => (manifest.target = "tpu"),
    "code": (manifest) => (manifest.code = "../model.wasm"),
    "inputs[1].shape[0]": (manifest) => (manifest.inputs[1].shape[0] = -1),
    "inputs[0].dtype": (manifest) => (manifest.inputs[0].dtype = "complex64"),
    "entry.name": (manifest) => delete manifest.entry.name,
    "params.layout[0]": (manifest) =>
      manifest.params.layout.push({ name: "w", shape: [4], dtype: "float32", offset: manifest.params.bytes, nbytes: 16 }),
    "outputs[0].source.index": (manifest) => (manifest.outputs[0].source = { region: "input", index: 7 }),
    "calls[0].kernel": (manifest) => (manifest.calls[0].kernel = "kernel_99"),
    "memory.wasm_import.maximum_pages": (manifest) => (manifest.memory.wasm_import.maximum_pages = 0),
  };
  for (const [field, edit] of Object.entries(edits)) {
    test(`${field}, edited and rehashed, is refused naming it`, async () => {
      const directory = await copyBundle(`field-${field}`, async (path, manifest) => {
        edit(manifest);
        await rehash(path, manifest);
      });
      await assert.rejects(tessel.load(directory), (error) => {
        assert.equal(error.name, "TesselError");
        assert.ok(error instanceof tessel.TesselError);
        assert.ok(["manifest", "binding"].includes(error.code), error.message);
        if (error.code === "manifest") assert.equal(error.field, field, error.message);
        return true;
      });
    });
  }

  test("a bundle compiled for another runtime version is refused saying which to install", async () => {
    const [major, minor, patch] = tessel.VERSION.split(".").map(Number);
    const manifest = JSON.parse(await readFile(join(gather, "manifest.json"), "utf8"));
    assert.equal(manifest.runtime_version, tessel.VERSION);
    const versions = [`${major}.${minor + 1}.0`, `${major + 1}.${minor}.${patch}`, `${major}.${minor}.${patch + 1}`, "x", undefined];
    for (const version of versions) {
      const directory = await copyBundle(`version-${version}`, async (path, copy) => {
        if (version === undefined) delete copy.runtime_version;
        else copy.runtime_version = version;
        await writeFile(join(path, "manifest.json"), JSON.stringify(copy));
      });
      await assert.rejects(tessel.load(directory), (error) => {
        assert.equal(error.code, "version");
        assert.equal(error.field, "runtime_version");
        assert.match(error.message, version && version !== "x" ? /install tessel-runtime@\^/ : /compile the model again/);
        return true;
      });
    }
  });

  test("a shape doubled consistently is refused by the binding digest", async () => {
    const directory = await copyBundle("doubled", async (path, manifest) => {
      manifest.outputs[0].shape[0] *= 2;
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), { code: "binding" });
  });

  test("a files digest that is not one is named", async () => {
    const directory = await copyBundle("digest", async (path, manifest) => {
      manifest.files["model.wasm"] = "not a digest";
      await writeFile(join(path, "manifest.json"), JSON.stringify(manifest));
    });
    await assert.rejects(tessel.load(directory), { code: "manifest", field: "files.model.wasm" });
  });

  test("a files entry outside the bundle is refused before anything is read", async () => {
    const directory = await copyBundle("traversal", async (path, manifest) => {
      manifest.files["../../etc/passwd"] = manifest.files["model.wasm"];
      await writeFile(join(path, "manifest.json"), JSON.stringify(manifest));
    });
    await assert.rejects(tessel.load(directory), { code: "manifest", field: "files" });
  });

  test("an output source renamed is refused by name or binding", async () => {
    const directory = await copyBundle("source", async (path, manifest) => {
      manifest.outputs[0].source = { region: "weights", index: 0 };
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), { code: "manifest", field: "outputs[0].source.region" });
  });

  test("another model's model.wasm with rehashed digests is refused", async () => {
    const directory = await copyBundle("swapped", async (path, manifest) => {
      await writeFile(join(path, "model.wasm"), await readFile(join(other, "model.wasm")));
      await rehash(path, manifest);
    });
    await assert.rejects(tessel.load(directory), { code: "binding", field: "model.wasm" });
  });
});

describe("the digests tessel.js computes", () => {
  test("the binding digest of odd manifest texts is Python's", async () => {
    for (const { text, binding } of digests) assert.equal(await tessel.bindingDigest(text), binding, text.slice(0, 200));
  });

  test("SHA-256 without crypto.subtle (an http page) matches WebCrypto's", async () => {
    const saved = Object.getOwnPropertyDescriptor(globalThis, "crypto");
    const inputs = [0, 1, 55, 56, 63, 64, 65, 1000, 70001].map((length) =>
      Uint8Array.from({ length }, (_, index) => (index * 131 + length) & 255),
    );
    const expected = inputs.map((bytes) => createHash("sha256").update(bytes).digest("hex"));
    Object.defineProperty(globalThis, "crypto", { value: undefined, configurable: true });
    try {
      const found = await Promise.all(inputs.map(async (bytes) => Buffer.from(await tessel.sha256(bytes)).toString("hex")));
      assert.deepEqual(found, expected);
      // and a whole load checks its digests with it
      const model = await tessel.load(gather);
      const { y } = await model.run(feeds(1n));
      assert.equal(y.data.length, 6);
    } finally {
      Object.defineProperty(globalThis, "crypto", saved);
    }
  });
});
