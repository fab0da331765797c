// The JavaScript runtime in Node 20: loads the WASM bundles that tests/web/test_node_runtime.py compiled,
// runs them on its inputs and compares with onnxruntime's outputs written beside them; then checks every
// error a caller can cause and the backend choice. Run through pytest, which passes TESSEL_WEB_CASES.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { cp, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { pathToFileURL } from "node:url";

import * as tessel from "../../web_runtime/tessel.js";

const RTOL = 1e-4;
const ATOL = 1e-5;

const casesFile = process.env.TESSEL_WEB_CASES;
if (!casesFile) throw new Error("set TESSEL_WEB_CASES to the cases.json that tests/web/test_node_runtime.py writes");
const { cases, scratch } = JSON.parse(await readFile(casesFile, "utf8"));
const digits = cases.find((item) => item.name === "digits");

const ARRAY_TYPES = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array };

async function readArray({ file, dtype }) {
  const bytes = await readFile(file);
  const Type = ARRAY_TYPES[dtype];
  return new Type(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

async function feedsOf(item) {
  const feeds = {};
  for (const [name, spec] of Object.entries(item.inputs)) {
    feeds[name] = { data: await readArray(spec), dims: spec.shape };
  }
  return feeds;
}

function assertClose(actual, expected, label) {
  assert.equal(actual.length, expected.length, `${label}: length`);
  let worst = 0;
  for (let index = 0; index < expected.length; index++) {
    const excess = Math.abs(actual[index] - expected[index]) - (ATOL + RTOL * Math.abs(expected[index]));
    if (!(excess <= 0)) assert.fail(`${label}[${index}] = ${actual[index]}, onnxruntime says ${expected[index]}`);
    worst = Math.max(worst, Math.abs(actual[index] - expected[index]));
  }
  return worst;
}

async function copyBundle(name, edit) {
  const directory = join(scratch, name);
  await cp(digits.bundle, directory, { recursive: true });
  await edit(directory);
  return directory;
}

describe("bundles match onnxruntime", () => {
  for (const item of cases) {
    test(item.name, async () => {
      const model = await tessel.load(item.bundle, { backend: "wasm" });
      assert.equal(model.backend, "wasm");
      assert.deepEqual(model.inputNames, Object.keys(item.inputs));
      assert.deepEqual(model.outputNames, Object.keys(item.expected));
      const outputs = await model.run(await feedsOf(item));
      for (const [name, spec] of Object.entries(item.expected)) {
        assert.deepEqual(outputs[name].dims, spec.shape);
        assert.equal(outputs[name].dtype, spec.dtype);
        assertClose(outputs[name].data, await readArray(spec), `${item.name} ${name}`);
      }
      model.dispose();
    });
  }

  test("repeated runs give the same outputs and do not reuse the caller's arrays", async () => {
    const model = await tessel.load(digits.bundle);
    const feeds = await feedsOf(digits);
    const first = await model.run(feeds);
    const second = await model.run({ input: feeds.input.data });
    const name = model.outputNames[0];
    assert.notEqual(first[name].data, second[name].data);
    assert.deepEqual(Array.from(first[name].data), Array.from(second[name].data));
  });
});

describe("loading", () => {
  test("reports progress for the manifest, the code and every params byte", async () => {
    const events = [];
    await tessel.load(digits.bundle, { onProgress: (event) => events.push(event) });
    assert.deepEqual([...new Set(events.map((event) => event.phase))], ["manifest", "code", "params", "ready"]);
    const params = events.filter((event) => event.phase === "params");
    const manifest = JSON.parse(await readFile(join(digits.bundle, "manifest.json"), "utf8"));
    assert.equal(params.at(-1).loaded, manifest.params.bytes);
    assert.equal(params.at(-1).total, manifest.params.bytes);
  });

  test("takes a file: URL", async () => {
    const model = await tessel.load(pathToFileURL(digits.bundle));
    assert.equal(model.outputs[0].name, "probabilities");
  });

  describe("over HTTP (fetch, streaming compilation)", () => {
    let server;
    let base;
    const requests = [];
    before(async () => {
      server = createServer(async (request, response) => {
        requests.push(request.url);
        try {
          // /bundles/no-params/ is digits without its params.bin
          const [, name, file] = request.url.match(/^\/bundles\/(digits|no-params)\/([\w.]+)$/);
          if (name === "no-params" && file === "params.bin") throw new Error("not served");
          const data = await readFile(join(digits.bundle, file));
          const type = request.url.endsWith(".wasm") ? "application/wasm" : "application/octet-stream";
          response.writeHead(200, { "Content-Type": type, "Content-Length": data.byteLength }).end(data);
        } catch {
          response.writeHead(404).end();
        }
      });
      await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
      base = `http://127.0.0.1:${server.address().port}/bundles/digits`;
    });
    after(() => server.close());

    test("loads and runs like the disk bundle", async () => {
      const fromDisk = await tessel.load(digits.bundle);
      const overHttp = await tessel.load(`${base}/`);
      const feeds = await feedsOf(digits);
      const expected = (await fromDisk.run(feeds)).probabilities.data;
      assert.deepEqual(Array.from((await overHttp.run(feeds)).probabilities.data), Array.from(expected));
    });

    test("Node has no cache: a second load fetches the code and params again, and nothing is said", async () => {
      const warn = console.warn;
      const said = [];
      console.warn = (...parts) => said.push(parts.join(" "));
      requests.length = 0;
      try {
        for (const cache of ["default", "default", "reload", "none"]) await tessel.load(`${base}/`, { cache });
        await tessel.clearCache();
      } finally {
        console.warn = warn;
      }
      for (const file of ["manifest.json", "model.wasm", "params.bin"]) {
        assert.equal(requests.filter((url) => url.endsWith(`/${file}`)).length, 4, `${file}: ${requests}`);
      }
      assert.deepEqual(said, []);
      await assert.rejects(tessel.load(`${base}/`, { cache: "sometimes" }), { name: "TesselError", code: "options", field: "cache" });
      await assert.rejects(tessel.load(`${base}/`, { worker: true }), { name: "TesselError", code: "options", field: "worker" });
    });

    test("a missing bundle names the URL and the HTTP status", async () => {
      await assert.rejects(tessel.load(`http://127.0.0.1:${server.address().port}/nothing/`), /HTTP 404/);
    });

    test("a params.bin that cannot be fetched names it, though its download starts beside the code's", async () => {
      const noParams = `http://127.0.0.1:${server.address().port}/bundles/no-params/`;
      await assert.rejects(tessel.load(noParams), /fetching .*no-params\/params\.bin failed with HTTP 404/);
    });
  });

  test("a corrupted params.bin is refused: its digest, checked beside the first run, holds back every result", async () => {
    const directory = await copyBundle("corrupted", async (path) => {
      const params = await readFile(join(path, "params.bin"));
      params[100] ^= 0xff;
      await writeFile(join(path, "params.bin"), params);
    });
    const model = await tessel.load(directory);
    const feeds = await feedsOf(digits);
    await assert.rejects(model.run(feeds), /params\.bin does not match the manifest's sha256/);
    await assert.rejects(model.run(feeds), /params\.bin does not match the manifest's sha256/);
  });

  // compiler/bundle.py's chunked_digest: the sha256 of the pieces' sha256 digests
  const chunkedDigest = (bytes, size) => {
    const pieces = [];
    for (let start = 0; start < bytes.byteLength; start += size) {
      pieces.push(createHash("sha256").update(bytes.subarray(start, start + size)).digest());
    }
    return createHash("sha256").update(Buffer.concat(pieces)).digest("hex");
  };
  const rechunked = (size, flip) =>
    copyBundle(`chunked-${size}-${flip}`, async (path) => {
      const params = await readFile(join(path, "params.bin"));
      const manifest = JSON.parse(await readFile(join(path, "manifest.json"), "utf8"));
      manifest.chunked_files = { chunk_bytes: size, sha256: { "params.bin": chunkedDigest(params, size) } };
      await writeFile(join(path, "manifest.json"), JSON.stringify(manifest));
      if (flip !== null) {
        params[flip] ^= 0x01;
        await writeFile(join(path, "params.bin"), params);
      }
    });

  test("params.bin is hashed piece by piece as it arrives: intact pieces pass, a flipped byte in any piece fails", async () => {
    const feeds = await feedsOf(digits);
    const expected = (await (await tessel.load(digits.bundle)).run(feeds)).probabilities.data;
    // 1000-byte pieces, and reads of 1 MiB from disk: several pieces per read, a last piece shorter
    const intact = await tessel.load(await rechunked(1000, null));
    assert.deepEqual(Array.from((await intact.run(feeds)).probabilities.data), Array.from(expected));
    const size = (await readFile(join(digits.bundle, "params.bin"))).byteLength;
    for (const flip of [0, 1500, size - 1]) {
      const model = await tessel.load(await rechunked(1000, flip));
      await assert.rejects(model.run(feeds), /params\.bin does not match the manifest's sha256/);
    }
  });

  test("a bundle without a chunked digest (an older export) still has params.bin checked whole", async () => {
    const directory = await copyBundle("unchunked-corrupted", async (path) => {
      const manifest = JSON.parse(await readFile(join(path, "manifest.json"), "utf8"));
      delete manifest.chunked_files;
      await writeFile(join(path, "manifest.json"), JSON.stringify(manifest));
      const params = await readFile(join(path, "params.bin"));
      params[100] ^= 0xff;
      await writeFile(join(path, "params.bin"), params);
    });
    const model = await tessel.load(directory);
    await assert.rejects(model.run(await feedsOf(digits)), /params\.bin does not match the manifest's sha256/);
  });

  test("a chunked digest without a positive piece size is refused", async () => {
    const directory = await copyBundle("chunked-zero", async (path) => {
      const manifest = JSON.parse(await readFile(join(path, "manifest.json"), "utf8"));
      manifest.chunked_files.chunk_bytes = 0;
      await writeFile(join(path, "manifest.json"), JSON.stringify(manifest));
    });
    await assert.rejects(tessel.load(directory), /chunked_files\.chunk_bytes must be positive/);
  });

  test("a truncated params.bin is refused", async () => {
    const directory = await copyBundle("truncated", async (path) => {
      const params = await readFile(join(path, "params.bin"));
      await writeFile(join(path, "params.bin"), params.subarray(0, 1000));
    });
    await assert.rejects(tessel.load(directory), /params\.bin has 1000 bytes, the manifest says/);
  });

  test("another bundle format version is refused", async () => {
    const directory = await copyBundle("future", async (path) => {
      const manifest = JSON.parse(await readFile(join(path, "manifest.json"), "utf8"));
      await writeFile(join(path, "manifest.json"), JSON.stringify({ ...manifest, format_version: 99 }));
    });
    await assert.rejects(tessel.load(directory), /format version 99; this runtime reads version 2/);
  });

  test("a directory that is not a bundle names the missing manifest", async () => {
    await assert.rejects(tessel.load(join(scratch, "no-such-bundle")), /cannot read .*manifest\.json/);
  });
});

describe("input validation, before anything runs", () => {
  let model;
  before(async () => {
    model = await tessel.load(digits.bundle);
  });

  test("an unknown input name", async () => {
    await assert.rejects(
      model.run({ input: new Float32Array(64), image: new Float32Array(64) }),
      /unknown input "image"; the model's inputs are input/,
    );
  });

  test("a missing input", async () => {
    await assert.rejects(model.run({}), /missing input "input"/);
  });

  test("the wrong dtype", async () => {
    const wanted = /input "input" \(dtype float32\) must be a Float32Array, got /;
    await assert.rejects(model.run({ input: new Float64Array(64) }), new RegExp(`${wanted.source}Float64Array`));
    await assert.rejects(model.run({ input: Array(64).fill(0) }), new RegExp(`${wanted.source}Array`));
  });

  test("the wrong number of elements", async () => {
    await assert.rejects(
      model.run({ input: new Float32Array(63) }),
      /has 63 elements, the model takes 64 \(shape \[1, 1, 8, 8\]\)/,
    );
  });

  test("the wrong dims", async () => {
    await assert.rejects(
      model.run({ input: { data: new Float32Array(64), dims: [1, 64] } }),
      /has dims \[1, 64\], the model takes \[1, 1, 8, 8\]/,
    );
  });

  test("feeds that are not an object of inputs", async () => {
    await assert.rejects(model.run(new Float32Array(64)), /run takes an object of input name/);
  });

  test("a disposed model", async () => {
    const disposed = await tessel.load(digits.bundle);
    disposed.dispose();
    await assert.rejects(disposed.run({ input: new Float32Array(64) }), /was disposed/);
  });
});

describe("backends", () => {
  test("the SIMD probe passes in Node 20", () => {
    assert.equal(tessel.hasWasmSimd(), true);
  });

  test("an engine without WebAssembly SIMD gets a clear error", async () => {
    const validate = WebAssembly.validate;
    WebAssembly.validate = () => false;
    try {
      await assert.rejects(tessel.load(digits.bundle, { backend: "wasm" }), /does not support WebAssembly SIMD/);
      await assert.rejects(tessel.load(digits.bundle), /no backend can run this bundle here.*WebAssembly SIMD/);
    } finally {
      WebAssembly.validate = validate;
    }
  });

  test("webgpu on a wasm-only bundle is refused with the way out", async () => {
    await assert.rejects(
      tessel.load(digits.bundle, { backend: "webgpu" }),
      /cannot use the webgpu backend: the bundle has no WebGPU code .*\{backend: "wasm"\}/,
    );
  });

  test("an unknown backend", async () => {
    await assert.rejects(
      tessel.load(digits.bundle, { backend: "cuda" }),
      /unknown backend "cuda"; choose auto, webgpu, wasm/,
    );
  });

  // A bundle that also lists WebGPU dispatches, and a fake navigator.gpu: `auto` must pick WebGPU only when an
  // adapter exists and its limits fit, and fall back to wasm otherwise, saying why; the same through a bundle set.
  describe("the WebGPU slot", () => {
    let bundle;
    before(async () => {
      bundle = await copyBundle("with-dispatches", async (path) => {
        const manifest = JSON.parse(await readFile(join(path, "manifest.json"), "utf8"));
        const webgpu = { limits: { maxStorageBufferBindingSize: 1 << 20 }, features: [] };
        const gpu = { dispatches: [], webgpu };
        await writeFile(join(path, "manifest.json"), JSON.stringify({ ...manifest, ...gpu }));
      });
    });

    // the edited bundle for webgpu, the untouched one for wasm
    const withWasm = () => ({ bundles: { webgpu: bundle, wasm: digits.bundle } });

    function withAdapter(limits) {
      const adapter = limits && { limits, features: new Set() };
      Object.defineProperty(globalThis, "navigator", {
        value: { gpu: { requestAdapter: async () => adapter } },
        configurable: true,
        writable: true,
      });
    }

    test("without an adapter, auto uses wasm and says why; webgpu is refused with the way out", async () => {
      withAdapter(null);
      const model = await tessel.load(withWasm());
      assert.equal(model.backend, "wasm");
      assert.match(model.backendReason, /auto chose wasm.*passing over webgpu \(WebGPU gave no adapter/);
      // the edited manifest itself is refused by the wasm code's binding digest
      await assert.rejects(tessel.load(bundle, { backend: "wasm" }), { code: "binding" });
      await assert.rejects(
        tessel.load(withWasm(), { backend: "webgpu" }),
        /cannot use the webgpu backend: WebGPU gave no adapter.*\{backend: "wasm"\}/,
      );
    });

    test("a bundle set: each backend runs its own bundle, the set's URLs relative to its file", async () => {
      const setDir = await mkdtemp(join(tmpdir(), "tessel-set-"));
      const setFile = join(setDir, "set.json");
      await cp(digits.bundle, join(setDir, "digits-wasm"), { recursive: true });
      await writeFile(setFile, JSON.stringify({ bundles: { webgpu: bundle, wasm: "digits-wasm/" } }));
      withAdapter(null);
      const model = await tessel.load(setFile);
      assert.equal(model.backend, "wasm");
      assert.match(model.backendReason, /passing over webgpu \(WebGPU gave no adapter/);
      const only = await tessel.load({ bundles: { wasm: digits.bundle } });
      assert.match(only.backendReason, /passing over webgpu \(the bundle set has no webgpu bundle\)/);
      await assert.rejects(tessel.load({ bundles: { webgpu: bundle } }, { backend: "wasm" }), /set has no wasm bundle/);
      await assert.rejects(tessel.load({ webgpu: bundle }), /a bundle set is \{bundles:/);
    });

    test("with an executor, auto picks webgpu when the adapter fits and wasm when it does not", async () => {
      const created = [];
      tessel.registerBackend({
        name: "webgpu",
        async create(manifest) {
          created.push(manifest.dispatches);
          return { run: async () => [new Float32Array(10).fill(0.1)], dispose() {} };
        },
      });
      withAdapter({ maxStorageBufferBindingSize: 1 << 30 });
      const onGpu = await tessel.load(withWasm());
      assert.equal(onGpu.backend, "webgpu");
      assert.equal(created.length, 1);
      assert.equal((await onGpu.run({ input: new Float32Array(64) })).probabilities.data[0], Math.fround(0.1));
      withAdapter({ maxStorageBufferBindingSize: 1024 });
      assert.equal((await tessel.load(withWasm())).backend, "wasm");
      await assert.rejects(
        tessel.load(withWasm(), { backend: "webgpu" }),
        /maxStorageBufferBindingSize is 1024, the bundle needs/,
      );
    });

    test("the WebGPU executor's manifest checks and the limits it asks the device for", async () => {
      const { checkWebGPUManifest, requiredLimits } = await import("../../web_runtime/tessel-webgpu.js");
      const entry = { name: "entry_0", regions: [{ binding: 0, access: "read_write" }], grid: [1, 1, 1] };
      const good = {
        webgpu: {
          entries: [{ ...entry, offsets_binding: 1, offsets_bytes: 16 }],
          buffers: [{ region: "arena", index: 0, bytes: 64 }],
          uniform_bytes: 256,
          limits: { maxStorageBufferBindingSize: 200 << 20, maxComputeInvocationsPerWorkgroup: 64 },
        },
        dispatches: [{ entry: "entry_0", regions: [{ region: "arena", index: 0 }], uniform_offset: 0, element_offsets: [0] }],
      };
      assert.equal(checkWebGPUManifest(good).size, 1);
      assert.deepEqual(requiredLimits(good), { maxStorageBufferBindingSize: 200 << 20 });
      const broken = (change) => {
        const copy = structuredClone(good);
        change(copy);
        return () => checkWebGPUManifest(copy);
      };
      assert.throws(broken((m) => delete m.webgpu), /not a valid WebGPU manifest: it has no webgpu section/);
      assert.throws(broken((m) => (m.dispatches[0].regions[0].region = "input")), /binds input 0, which webgpu.buffers lacks/);
      assert.throws(broken((m) => (m.dispatches[0].element_offsets = [0, 1, 2, 3, 4])), /element_offsets do not fit/);
      assert.throws(broken((m) => (m.dispatches[0].uniform_offset = 256)), /uniform_offset lies outside/);
      assert.throws(broken((m) => (m.webgpu.entries[0].grid = [0, 1, 1])), /not three positive whole numbers/);
      // an input placed in the arena is no buffer to bind, and must fit the arena
      const placed = (offset) => (m) => m.webgpu.buffers.push({ region: "input", index: 0, bytes: 16, arena_offset: offset });
      const inArena = structuredClone(good);
      placed(48)(inArena);
      assert.equal(checkWebGPUManifest(inArena).size, 1);
      assert.throws(broken(placed(56)), /input 0 is placed at 56 of the arena, not a whole word inside it/);
      assert.throws(broken(placed(6)), /input 0 is placed at 6 of the arena/);
      const boundAsBuffer = (m) => {
        placed(0)(m);
        m.dispatches[0].regions[0].region = "input";
      };
      assert.throws(broken(boundAsBuffer), /binds input 0, which webgpu.buffers lacks/);
    });

    test("registering a backend without its parts is refused", () => {
      assert.throws(() => tessel.registerBackend({ name: "metal" }), /a backend needs describe/);
    });

    after(() => {
      delete globalThis.navigator;
    });
  });
});
