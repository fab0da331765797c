// Tessel's JavaScript runtime: the last stage of the pipeline, outside Python. It loads a bundle that
// compiler/build.py exported (manifest.json, model.wasm, params.bin) in a browser or in Node 20 and runs
// it; results go back to the caller. No dependencies, no build step: an ES module served as is.
//
//   import * as tessel from "/runtime/tessel.js";
//   const model = await tessel.load("/bundles/<id>/", { backend: "auto", threads: 4, onProgress });
//   const outputs = await model.run({ input: new Float32Array(64) });  // {name: {data, dims, dtype}}

/** This runtime's version (the npm package tessel-runtime's); a bundle's manifest.runtime_version must be compatible. */
export const VERSION = "0.1.0";

const PAGE_BYTES = 65536;
const ALIGNMENT = 64;
const FORMAT_VERSION = 2;

// The typed array of each dtype's bytes in memory and on the device (float16 as its raw bits, bool as 0/1 bytes).
const TYPED_ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  float16: Uint16Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
};
// The typed array of each dtype's results: float16 comes back as a Float16Array where the engine has one (Chrome 135,
// Firefox 129, Safari 18.2; not Node 20), else as a Uint16Array of its bits, which float16BitsToFloat32 reads.
const Float16 = typeof Float16Array === "function" ? Float16Array : null;
const RESULT_ARRAYS = { ...TYPED_ARRAYS, float16: Float16 || Uint16Array };

const kindOf = (value) => (value == null ? String(value) : value.constructor?.name ?? typeof value);

// Rounds `value` right by `shift` bits to the nearest, ties to even, as IEEE 754 and numpy's float16 do.
function roundRight(value, shift) {
  const kept = value >>> shift;
  const rest = value & ((1 << shift) - 1);
  const halfway = 1 << (shift - 1);
  return kept + (rest > halfway || (rest === halfway && kept & 1) ? 1 : 0);
}

/** float32 values as the bits of the nearest float16 (ties to even): beyond float16's range ±Infinity, below it a
 * subnormal or ±0; NaN stays NaN (quiet, with the top bits of its payload). */
export function float32ToFloat16Bits(values) {
  if (!(values instanceof Float32Array)) {
    fail("input", "values", `float32ToFloat16Bits takes a Float32Array, got ${kindOf(values)}; convert it, e.g. Float32Array.from(values)`);
  }
  const words = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const bits = new Uint16Array(words.length);
  for (let position = 0; position < words.length; position++) {
    const word = words[position];
    const exponent = ((word >>> 23) & 0xff) - 112; // rebiased for float16: 127 -> 15
    const fraction = word & 0x7fffff;
    let half;
    if (exponent === 143) half = fraction ? 0x7e00 | (fraction >>> 13) : 0x7c00;
    else if (exponent >= 31) half = 0x7c00;
    // a carry out of the fraction moves to the next exponent, and from the largest finite value to Infinity
    else if (exponent > 0) half = roundRight((exponent << 23) | fraction, 13);
    else half = exponent < -10 ? 0 : roundRight(fraction | 0x800000, 14 - exponent);
    bits[position] = ((word >>> 16) & 0x8000) | half;
  }
  return bits;
}

/** float16 bits as float32 values, exactly (every float16 is a float32). */
export function float16BitsToFloat32(bits) {
  if (!(bits instanceof Uint16Array)) {
    fail("input", "bits", `float16BitsToFloat32 takes a Uint16Array of float16 bits, got ${kindOf(bits)} (a Float16Array converts with Float32Array.from)`);
  }
  const floats = new Float32Array(bits.length);
  const words = new Uint32Array(floats.buffer);
  for (let position = 0; position < bits.length; position++) {
    const half = bits[position];
    const sign = (half & 0x8000) << 16;
    const exponent = (half >>> 10) & 0x1f;
    const fraction = half & 0x3ff;
    if (exponent === 0x1f) words[position] = sign | 0x7f800000 | (fraction << 13);
    else if (exponent) words[position] = sign | ((exponent + 112) << 23) | (fraction << 13);
    else floats[position] = (sign ? -fraction : fraction) * 2 ** -24;
  }
  return floats;
}

// The smallest module that uses a SIMD128 instruction: (func (result v128) (v128.const i32x4 0 0 0 0)).
// Engines without SIMD reject it, which is the whole test.
const SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type section: () -> v128
  0x03, 0x02, 0x01, 0x00, // function section: one function of type 0
  0x0a, 0x16, 0x01, 0x14, 0x00, 0xfd, 0x0c, // code section: one body, no locals, v128.const
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  0x0b, // end
]);

/** True when this JavaScript engine runs WebAssembly SIMD128, which every Tessel wasm bundle uses. */
export function hasWasmSimd() {
  return typeof WebAssembly === "object" && WebAssembly.validate(SIMD_PROBE);
}

// The same function computing f32x4.relaxed_madd of three v128.const zeros: valid only where the engine has relaxed
// SIMD (Chrome 114+; Node 20 only with --experimental-wasm-relaxed-simd).
const RELAXED_SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type section: () -> v128
  0x03, 0x02, 0x01, 0x00, // function section: one function of type 0
  0x0a, 0x3d, 0x01, 0x3b, 0x00, // code section: one body, no locals
  ...[0, 1, 2].flatMap(() => [0xfd, 0x0c, ...new Array(16).fill(0)]), // three v128.const
  0xfd, 0x85, 0x02, // f32x4.relaxed_madd
  0x0b, // end
]);

/** True when this engine runs WebAssembly relaxed SIMD (fused multiply-add), which a bundle's relaxed variant uses. */
export function hasWasmRelaxedSimd() {
  return typeof WebAssembly === "object" && WebAssembly.validate(RELAXED_SIMD_PROBE);
}

function roundUp(value, multiple) {
  return Math.ceil(value / multiple) * multiple;
}

function elementCount(shape) {
  return shape.reduce((product, size) => product * size, 1);
}

function byteSize(spec) {
  return elementCount(spec.shape) * TYPED_ARRAYS[spec.dtype].BYTES_PER_ELEMENT;
}

function shapeText(shape) {
  return `[${shape.join(", ")}]`;
}

// ---- where the bundle's files come from --------------------------------------------------------------

// Node's built-in modules, imported only in Node: the name is not a literal and the comments tell webpack and Vite
// to leave it alone, so a bundler making a browser bundle neither resolves nor warns about them.
function nodeModule(name) {
  return import(/* webpackIgnore: true */ /* @vite-ignore */ name);
}

function isNode() {
  return typeof process === "object" && process.versions != null && process.versions.node != null;
}

// A load's steps as performance marks, for DevTools' timeline and phase-by-phase timing of a load: on wasm
// tessel:code-downloaded, tessel:code-compiled, tessel:params-in, tessel:workers-ready, tessel:params-checked; on
// WebGPU (tessel-webgpu.js, given this function) tessel:device-ready, tessel:code-in, tessel:pipelines-ready,
// tessel:params-in.
function mark(name) {
  if (typeof performance === "object" && performance && typeof performance.mark === "function") {
    performance.mark(`tessel:${name}`);
  }
}

function reportProgress(onProgress, phase, loaded, total) {
  if (onProgress) onProgress({ phase, loaded, total });
}

/** Files fetched over HTTP(S) (browsers, and Node given an http URL); wasm compiles while it downloads. */
class FetchSource {
  constructor(base) {
    this.base = base.endsWith("/") ? base : `${base}/`;
  }

  async response(name) {
    const url = new URL(name, this.base).href;
    let response;
    try {
      // manifest.json is always revalidated: its digests say whether the cached code and params are current
      response = await fetch(url, name === "manifest.json" ? { cache: "no-cache" } : {});
    } catch (error) {
      fail("file", name, `cannot fetch ${url}: ${error.message}; is the server running?`);
    }
    if (!response.ok) {
      fail("file", name, `fetching ${url} failed with HTTP ${response.status}; check the bundle URL`);
    }
    return response;
  }

  async text(name) {
    return (await this.response(name)).text();
  }

  // Streaming compilation overlaps download and compile; a second branch of the body gives the bytes for the
  // digest and seal checks, made before the module is instantiated.
  async wasm(name, onProgress) {
    const response = await this.response(name);
    const [forCompile, forBytes] = response.body.tee();
    const headers = { "Content-Type": "application/wasm" };
    const compiled = WebAssembly.compileStreaming(new Response(forCompile, { headers }));
    // Awaited below; until then a failed compile must not count as an unhandled rejection.
    compiled.catch(() => {});
    const total = Number(response.headers.get("Content-Length")) || 0;
    const onLoaded = (loaded) => reportProgress(onProgress, "code", loaded, total);
    return { bytes: await collect(readStream(forBytes), onLoaded), compiled };
  }

  async *chunks(name) {
    yield* readStream((await this.response(name)).body);
  }
}

async function* readStream(stream) {
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    yield value;
  }
}

// Reads `chunks` from now on and keeps what arrives until the consumer asks for it, so a download can start before
// the place it goes to is known (the params' offset in memory comes from the compiled module). A failed download
// surfaces where the chunks are read, never as an unhandled rejection.
function prefetched(chunks) {
  const arrived = [];
  let finished = null;
  let wake = () => {};
  (async () => {
    try {
      for await (const chunk of chunks) {
        arrived.push(chunk);
        wake();
      }
      finished = {};
    } catch (error) {
      finished = { error };
    }
    wake();
  })();
  return (async function* () {
    for (;;) {
      if (arrived.length) {
        yield arrived.shift();
      } else if (finished) {
        if (finished.error) throw finished.error;
        return;
      } else {
        await new Promise((resolve) => (wake = resolve));
      }
    }
  })();
}

async function collect(chunks, onLoaded) {
  const parts = [];
  let loaded = 0;
  for await (const chunk of chunks) {
    parts.push(chunk);
    loaded += chunk.byteLength;
    onLoaded(loaded);
  }
  return join(parts, loaded);
}

function join(parts, length) {
  const bytes = new Uint8Array(length);
  let offset = 0;
  for (const part of parts) {
    bytes.set(part, offset);
    offset += part.byteLength;
  }
  return bytes;
}

/** Files read from disk in Node, for a bundle given as a directory path or a file: URL. */
class DiskSource {
  constructor(directory) {
    this.directory = directory;
  }

  async path(name) {
    const { join } = await nodeModule("node:path");
    return join(this.directory, name);
  }

  async text(name) {
    const { readFile } = await nodeModule("node:fs/promises");
    const path = await this.path(name);
    try {
      return await readFile(path, "utf8");
    } catch (error) {
      fail("file", name, `cannot read ${path}: ${error.code || error.message}; is this a bundle directory?`);
    }
  }

  async wasm(name, onProgress) {
    const { stat } = await nodeModule("node:fs/promises");
    const path = await this.path(name);
    const total = await stat(path).then((info) => info.size, () => 0);
    const onLoaded = (loaded) => reportProgress(onProgress, "code", loaded, total);
    const bytes = await collect(this.chunks(name), onLoaded);
    const compiled = WebAssembly.compile(bytes);
    compiled.catch(() => {});
    return { bytes, compiled };
  }

  async *chunks(name) {
    const { open } = await nodeModule("node:fs/promises");
    const path = await this.path(name);
    let file;
    try {
      file = await open(path, "r");
    } catch (error) {
      fail("file", name, `cannot read ${path}: ${error.code || error.message}; is this a bundle directory?`);
    }
    try {
      for (;;) {
        const buffer = new Uint8Array(1 << 20);
        const { bytesRead } = await file.read(buffer, 0, buffer.byteLength, null);
        if (bytesRead === 0) return;
        yield buffer.subarray(0, bytesRead);
      }
    } finally {
      await file.close();
    }
  }
}

async function openSource(bundleUrl) {
  const text = bundleUrl instanceof URL ? bundleUrl.href : String(bundleUrl);
  if (isNode() && !/^https?:/i.test(text)) {
    if (text.startsWith("file:")) {
      const { fileURLToPath } = await nodeModule("node:url");
      return new DiskSource(fileURLToPath(text));
    }
    return new DiskSource(text);
  }
  const base = typeof location === "object" ? new URL(text, location.href).href : text;
  return new FetchSource(base);
}

// ---- checks shared by every backend ------------------------------------------------------------------

/**
 * The one error tessel.js throws for anything a caller or a bundle got wrong. `code` says which kind ("manifest",
 * "version", "file", "digest", "seal", "binding", "code", "memory", "backend", "options", "input", "run",
 * "disposed", "device", "generate"); `field` names the thing: a manifest field such as "outputs[0].shape", a file
 * name, an input name, an option. docs/web.md lists them.
 */
export class TesselError extends Error {
  constructor(code, field, message) {
    super(message.startsWith("tessel: ") ? message : `tessel: ${message}`);
    this.name = "TesselError";
    this.code = code;
    this.field = field;
  }
}

function fail(code, field, message) {
  throw new TesselError(code, field, message);
}

// SHA-256 in JavaScript, for pages without crypto.subtle (browsers give it only in secure contexts: https,
// localhost), so every digest below is checked everywhere. The constants are the fractional parts of the primes'
// square and cube roots (FIPS 180-4).
let roundConstants, initialHash;

function sha256Js(input) {
  if (!roundConstants) {
    const primes = [];
    for (let candidate = 2; primes.length < 64; candidate++) {
      if (primes.every((prime) => candidate % prime)) primes.push(candidate);
    }
    const fraction = (value) => ((value - Math.floor(value)) * 2 ** 32) >>> 0;
    roundConstants = Uint32Array.from(primes, (prime) => fraction(Math.cbrt(prime)));
    initialHash = Uint32Array.from(primes.slice(0, 8), (prime) => fraction(Math.sqrt(prime)));
  }
  const length = input.byteLength;
  const padded = new Uint8Array(Math.ceil((length + 9) / 64) * 64);
  padded.set(input instanceof Uint8Array ? input : new Uint8Array(input.buffer || input, input.byteOffset || 0, length));
  padded[length] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(length / 2 ** 29));
  view.setUint32(padded.length - 4, (length * 8) >>> 0);
  const hash = Uint32Array.from(initialHash);
  const words = new Uint32Array(64);
  const rotate = (value, bits) => (value >>> bits) | (value << (32 - bits));
  for (let block = 0; block < padded.length; block += 64) {
    for (let t = 0; t < 64; t++) {
      if (t < 16) {
        words[t] = view.getUint32(block + 4 * t);
      } else {
        const [early, late] = [words[t - 15], words[t - 2]];
        const s0 = rotate(early, 7) ^ rotate(early, 18) ^ (early >>> 3);
        const s1 = rotate(late, 17) ^ rotate(late, 19) ^ (late >>> 10);
        words[t] = words[t - 16] + s0 + words[t - 7] + s1;
      }
    }
    let [a, b, c, d, e, f, g, h] = hash;
    for (let t = 0; t < 64; t++) {
      const t1 = h + (rotate(e, 6) ^ rotate(e, 11) ^ rotate(e, 25)) + ((e & f) ^ (~e & g)) + roundConstants[t] + words[t];
      const t2 = (rotate(a, 2) ^ rotate(a, 13) ^ rotate(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      [h, g, f, e, d, c, b, a] = [g, f, e, (d + t1) >>> 0, c, b, a, (t1 + t2) >>> 0];
    }
    [a, b, c, d, e, f, g, h].forEach((value, position) => (hash[position] += value));
  }
  const digest = new DataView(new ArrayBuffer(32));
  hash.forEach((value, position) => digest.setUint32(4 * position, value));
  return new Uint8Array(digest.buffer);
}

/** The SHA-256 of `bytes` (a typed array or ArrayBuffer, not shared): WebCrypto's where there is one. */
export async function sha256(bytes) {
  const subtle = globalThis.crypto && globalThis.crypto.subtle;
  return subtle ? new Uint8Array(await subtle.digest("SHA-256", bytes)) : sha256Js(bytes);
}

const hex = (bytes) => Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");

async function sha256Hex(bytes) {
  return hex(await sha256(bytes));
}

function isShared(memory) {
  return typeof SharedArrayBuffer === "function" && memory.buffer instanceof SharedArrayBuffer;
}

function corrupted(name) {
  fail("digest", name, `${name} does not match the manifest's sha256; the bundle is corrupted, export it again`);
}

// params.bin's one digest check, made as its bytes are copied into place (the wasm memory, WebGPU's mapped buffer),
// from the network or from the cache alike: with a chunked digest (compiler/bundle.py, chunked_digest) each
// chunk_bytes-long piece is hashed as soon as it is in, while the rest arrives, and the digest of the pieces' digests
// is compared at the end, so the check ends a piece after the last byte instead of a whole-file hash after it
// (Chromium hashes on the calling thread: ~25 ms for 14 MB, ~85 ms for 47 MB); without one (an older bundle) the
// whole file is hashed at the end.
function paramsHasher(manifest, total) {
  const name = manifest.params.file;
  const chunked = manifest.chunked_files && manifest.chunked_files.sha256[name];
  const size = chunked ? manifest.chunked_files.chunk_bytes : total;
  const pieces = [];
  let hashed = 0;
  // crypto.subtle refuses views of shared memory, and copies its input when called, so one plain buffer serves
  // every piece of a threaded variant's params
  let scratch = null;
  const hash = (view, end) => {
    const piece = view.subarray(hashed, end);
    let input = piece;
    if (isShared(view)) {
      scratch = scratch || new Uint8Array(Math.min(size, total));
      scratch.set(piece);
      input = scratch.subarray(0, piece.byteLength);
    }
    pieces.push(sha256(input));
    hashed = end;
  };
  return {
    /** Hash every whole piece of `view` (params.bin's bytes so far, in place) up to `loaded`. */
    arrived(view, loaded) {
      while (chunked && loaded - hashed >= size) hash(view, hashed + size);
    },
    /** The check, once every byte is in: rejects on a mismatch. */
    async finish(view) {
      if (hashed < total || !chunked) hash(view, total);
      const digests = await Promise.all(pieces);
      const joined = new Uint8Array(digests.length * 32);
      digests.forEach((digest, position) => joined.set(digest, position * 32));
      if (hex(chunked ? await sha256(joined) : digests[0]) !== (chunked || manifest.files[name])) corrupted(name);
    },
  };
}

/** Copies params.bin's `chunks` into `view`, refusing a wrong size, and resolves once every byte is in to {checked}:
 * the digest check, still under way (rejecting on a mismatch). */
async function copyParams(manifest, chunks, view, onProgress) {
  const { file: name, bytes: total } = manifest.params;
  const hasher = paramsHasher(manifest, total);
  let loaded = 0;
  reportProgress(onProgress, "params", 0, total);
  for await (const chunk of chunks) {
    if (loaded + chunk.byteLength > total) {
      fail("file", name, `params.bin is larger than the manifest's ${total} bytes; export the bundle again`);
    }
    view.set(chunk, loaded);
    loaded += chunk.byteLength;
    hasher.arrived(view, loaded);
    reportProgress(onProgress, "params", loaded, total);
  }
  if (loaded !== total) {
    fail("file", name, `params.bin has ${loaded} bytes, the manifest says ${total}; export the bundle again`);
  }
  const checked = hasher.finish(view);
  checked.catch(() => {}); // whoever awaits it sees a mismatch; until then it is no unhandled rejection
  return { checked };
}

/**
 * Settles the one digest check of a file read through `source` (`check` rejects with a TesselError on a mismatch):
 * a file that matches is stored in the cache, if it came from the network (source.checked); one from the cache that
 * does not is dropped there and read again by `again()`, from the network, whose check is then final. So a cache hit
 * is hashed once, by the same check as a download, and a damaged entry is replaced rather than used or refused.
 */
async function settle(source, name, check, again) {
  for (;;) {
    try {
      const result = await check;
      if (source.checked) await source.checked(name, true);
      return result;
    } catch (error) {
      const cached = error instanceof TesselError && error.code === "digest" && source.checked;
      if (!(cached && (await source.checked(name, false)))) throw error;
    }
    check = again();
  }
}

async function checkDigest(manifest, name, bytes) {
  if ((await sha256Hex(bytes)) !== manifest.files[name]) corrupted(name);
}

// The code file's own seal (compiler/bundle.py, seal_code): a wasm module ends with a custom section
// "tessel.sha256" holding the sha256 of everything before it; GPU source with a comment line.
const SEAL_NAME = "tessel.sha256";

export async function checkSeal(name, bytes, style) {
  const size = style === "wasm" ? 3 + SEAL_NAME.length + 32 : SEAL_NAME.length + 70;
  const body = bytes.subarray(0, Math.max(bytes.length - size, 0));
  const digest = await sha256(body);
  const seal =
    style === "wasm"
      ? [0, SEAL_NAME.length + 33, SEAL_NAME.length, ...new TextEncoder().encode(SEAL_NAME), ...digest]
      : new TextEncoder().encode(`\n// ${SEAL_NAME} ${hex(digest)}\n`);
  if (bytes.length <= size || seal.some((byte, position) => bytes[body.length + position] !== byte)) {
    fail("seal", name, `${name} is truncated or damaged (its own sha256 seal does not match); export the model again`);
  }
}

// The binding digest (compiler/bundle.py, binding_digest): the sha256 of the manifest fields the code was generated
// for, as Python's json.dumps(sort_keys=True, separators=(",", ":")) writes them, recomputed here from the manifest's
// text (numbers keep Python's spelling, which a JSON.parse would lose: 2.0) and compared with the one the code
// carries before anything runs, so an edited manifest, even rehashed, or another model's code is refused.
class Raw {
  constructor(text) {
    this.text = text;
  }
}

function pythonNumber(text) {
  if (!/[.eE]/.test(text)) return text === "-0" ? "0" : text;
  const value = Number(text);
  if (!Number.isFinite(value)) return value > 0 ? "Infinity" : "-Infinity";
  const sign = value < 0 || Object.is(value, -0) ? "-" : "";
  if (value === 0) return `${sign}0.0`;
  const [mantissa, exponent] = Math.abs(value).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const power = Number(exponent);
  if (power < -4 || power >= 16) {
    const fraction = digits.length > 1 ? `.${digits.slice(1)}` : "";
    return `${sign}${digits[0]}${fraction}e${power < 0 ? "-" : "+"}${String(Math.abs(power)).padStart(2, "0")}`;
  }
  if (power < 0) return `${sign}0.${"0".repeat(-power - 1)}${digits}`;
  const whole = digits.padEnd(power + 1, "0");
  return `${sign}${whole.slice(0, power + 1)}.${whole.slice(power + 1) || "0"}`;
}

// JSON text (already accepted by JSON.parse) as values whose numbers are Raw; objects are Maps (the last of a
// repeated key wins, as in Python).
function parseRaw(text) {
  const token = /\s*("(?:[^"\\]|\\.)*"|[-0-9][-+.0-9eE]*|true|false|null|[{}[\],:])/y;
  const next = () => token.exec(text)[1];
  const value = (first) => {
    if (first === "{" || first === "[") {
      const object = first === "{" ? new Map() : [];
      for (let item = next(); item !== "}" && item !== "]"; item = next()) {
        if (item === ",") continue;
        if (first === "[") object.push(value(item));
        else object.set(JSON.parse(item), (next(), value(next())));
      }
      return object;
    }
    if (first[0] === '"') return JSON.parse(first);
    return new Raw(/^[-0-9]/.test(first) ? pythonNumber(first) : first);
  };
  return value(next());
}

function pythonString(text) {
  const short = { '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f" };
  return `"${text.replace(/[^ -~]|["\\]/g, (char) => short[char] || `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`)}"`;
}

function byCodePoint(left, right) {
  const [a, b] = [Array.from(left, (char) => char.codePointAt(0)), Array.from(right, (char) => char.codePointAt(0))];
  for (let position = 0; position < Math.min(a.length, b.length); position++) {
    if (a[position] !== b[position]) return a[position] - b[position];
  }
  return a.length - b.length;
}

function pythonJson(value) {
  if (value instanceof Raw) return value.text;
  if (typeof value === "string") return pythonString(value);
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(",")}]`;
  const keys = [...value.keys()].sort(byCodePoint);
  return `{${keys.map((key) => `${pythonString(key)}:${pythonJson(value.get(key))}`).join(",")}}`;
}

/** The binding digest of a manifest's text, as compiler/bundle.py's binding_digest computes it. */
export async function bindingDigest(text) {
  const bound = parseRaw(text);
  bound.delete("files");
  bound.delete("chunked_files");
  if (bound.get("memory") instanceof Map) bound.get("memory").delete("wasm_import");
  for (const variant of Array.isArray(bound.get("variants")) ? bound.get("variants") : []) {
    if (variant instanceof Map) variant.delete("wasm_import");
  }
  return sha256Hex(new TextEncoder().encode(pythonJson(bound)));
}

// The manifest's schema, as compiler/bundle.py's MANIFEST_SCHEMA: each checker throws one TesselError naming the
// field ("outputs[0].shape[1]") before anything is sized from it. The code's binding digest then vouches for every
// field the compiler fixed; what it leaves out (files, digests, memory limits) is checked here and against the files.
const MAX_BYTES = 2 ** 40;
const MAX_ITEMS = 2 ** 20;
const MAX_PAGES = 65536;
const INT32_MAX = 2 ** 31 - 1; // a size's value goes to the run entry as an int32
const DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"];
const CODE_FILES = { wasm: "model.wasm", llvm: "model.so", opencl: "kernels.cl", cuda: "kernels.cu", webgpu: "kernels.wgsl" };
const WASM_FEATURES = ["threads", "relaxed-simd"];
// a bundle's files are plain names beside manifest.json: no directories, no "..", nothing a URL or path resolves
const FILE_NAME = /^(?!\.\.?$)[\w.+-]{1,200}$/;

const isCount = (value, limit = MAX_BYTES) => Number.isSafeInteger(value) && value >= 0 && value <= limit;
const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

function invalid(where, wanted, value) {
  const shown = value === undefined ? "nothing" : isObject(value) ? "an object" : Array.isArray(value) ? "a list" : JSON.stringify(value).slice(0, 60);
  fail("manifest", where, `manifest.json is not a valid manifest: ${where} must be ${wanted}, got ${shown}; export the model again`);
}

const text = (where, value) => (typeof value === "string" && value.length <= 4096) || invalid(where, "a string", value);
const count = (limit = MAX_BYTES) => (where, value) => isCount(value, limit) || invalid(where, `a whole number in [0, ${limit}]`, value);
const oneOf = (...choices) => (where, value) => choices.includes(value) || invalid(where, `one of ${choices.join(", ")}`, value);
const optional = (schema) => (where, value) => value === null || checkSchema(schema, where, value);
const anything = () => true;
const listOf = (item) => (where, value) => {
  if (!Array.isArray(value) || value.length > MAX_ITEMS) invalid(where, "a list", value);
  value.forEach((element, position) => checkSchema(item, `${where}[${position}]`, element));
};
const dictOf = (item) => (where, value) => {
  if (!isObject(value)) invalid(where, "an object", value);
  for (const [key, element] of Object.entries(value)) checkSchema(item, `${where}.${key}`, element);
};

function checkSchema(schema, where, value) {
  if (typeof schema === "function") return schema(where, value);
  if (!isObject(value)) invalid(where, "an object", value);
  for (const [key, item] of Object.entries(schema)) {
    const name = key.replace(/\?$/, "");
    const field = where ? `${where}.${name}` : name;
    if (!Object.hasOwn(value, name)) {
      if (key.endsWith("?")) continue;
      fail("manifest", field, `manifest.json is not a valid manifest: ${field} is missing; export the model again`);
    }
    checkSchema(item, field, value[name]);
  }
}

const TENSOR = { name: text, shape: listOf(count()), dtype: oneOf(...DTYPES), "device_dtype?": oneOf("int32") };
// an input's or output's dim: a whole number or a size expression (checkSizes parses it against manifest.sizes)
const DIM = (where, value) =>
  typeof value === "string"
    ? /^[\w.*+-]{1,256}$/.test(value) || invalid(where, "a size expression", value)
    : count()(where, value);
const SIZED = { ...TENSOR, shape: listOf(DIM) };
const WASM_IMPORT = { initial_pages: count(MAX_PAGES), maximum_pages: optional(count(MAX_PAGES)), "shared?": oneOf(true, false) };
const DIGEST = (where, value) => /^[0-9a-f]{64}$/.test(value) || invalid(where, "a sha256 in hex", value);
const MANIFEST_SCHEMA = {
  format_version: oneOf(FORMAT_VERSION),
  content_hash: text,
  compiler_version: text,
  runtime_version: text,
  target: text,
  triple: text,
  code: text,
  entry: { name: text, arguments: listOf(text) },
  "sizes?": listOf({ name: text, min: count(INT32_MAX), max: count(INT32_MAX) }),
  inputs: listOf(SIZED),
  outputs: listOf({ ...SIZED, source: optional({ region: oneOf("input", "output", "params") }) }),
  kernels: listOf({ name: text, ops: listOf(text), groups: listOf(text), "config?": anything }),
  calls: listOf({ kernel: text, group: text, pattern: text, args: listOf(listOf(anything)) }),
  memory: { arena_bytes: count(), intermediate_bytes: count(), alignment: count(), "wasm_import?": WASM_IMPORT },
  "variants?": listOf({ code: text, features: listOf(oneOf(...WASM_FEATURES)), wasm_import: WASM_IMPORT, "stack_bytes?": count() }),
  params: { file: oneOf("params.bin"), bytes: count(), layout: listOf({ ...TENSOR, offset: count(), nbytes: count() }) },
  options: anything,
  files: dictOf(DIGEST),
  "chunked_files?": { chunk_bytes: count(), sha256: dictOf(DIGEST) },
  "dispatches?": listOf(anything),
  "webgpu?": anything,
};

const ITEM_BYTES = { float16: 2, bool: 1, int8: 1, uint8: 1, int16: 2, int32: 4, float32: 4, int64: 8, float64: 8 };

/** Bytes of a manifest tensor, refused above MAX_BYTES (so no size below overflows a safe integer). */
function tensorBytes(spec, where, dtype = spec.dtype) {
  let bytes = ITEM_BYTES[dtype];
  for (const size of spec.shape) {
    bytes *= size;
    if (bytes > MAX_BYTES) invalid(`${where}.shape`, `a shape of at most ${MAX_BYTES} bytes`, spec.shape);
  }
  return bytes;
}

// ---- symbolic sizes ------------------------------------------------------------------------------------
//
// A model compiled with symbolic sizes (compile_model(..., dims={"seq": (1, 256)}), tessel compile --dim seq=1..256)
// lists them in manifest.sizes ({name, min, max}, in the order of the run entry's last argument), and a dim of its
// inputs and outputs is a whole number or a size expression: terms joined by + or -, each a product of whole numbers
// and size names ("seq", "4*seq", "past+seq", "seq*seq-1"), as compiler/graph/sym.py's parse_size reads it. Every
// input and output lives in memory at its largest shape (each size at its max), with that shape's strides; a run
// binds the sizes from the inputs' dims (compiler/bundle.py, SymbolicSizes), writes each input into the first corner
// of its slot, passes the sizes' values and reads each output's box back out. A static bundle has no plan (null).

// A size expression as [coefficient, ...size positions] terms, equal products combined and zero terms dropped, as a
// Sym holds it; a constant is a number. `positions` maps each size's name to its place in manifest.sizes.
function parseSize(text, positions) {
  const terms = new Map();
  const term = /([+-]?)([^+-]+)/y;
  while (term.lastIndex < text.length) {
    const match = term.exec(text);
    if (!match) return null;
    let coefficient = match[1] === "-" ? -1 : 1;
    const names = [];
    for (const factor of match[2].split("*")) {
      if (/^\d+$/.test(factor)) coefficient *= Number(factor);
      else if (positions.has(factor)) names.push(positions.get(factor));
      else return null;
    }
    names.sort((left, right) => left - right);
    const key = names.join("*");
    const sum = (terms.has(key) ? terms.get(key)[0] : 0) + coefficient;
    if (!Number.isSafeInteger(sum)) return null;
    terms.set(key, [sum, ...names]);
  }
  const kept = [...terms.values()].filter(([coefficient]) => coefficient !== 0);
  if (kept.length === 0) return 0;
  if (kept.length === 1 && kept[0].length === 1) return kept[0][0];
  const [first] = kept;
  // the size this dim is alone ("seq", not "2*seq" nor "seq+1"): an input's dim that gives the size's value
  return { terms: kept, alone: kept.length === 1 && first.length === 2 && first[0] === 1 ? first[1] : -1 };
}

/** A dim's value at the run's sizes (`values`, in manifest.sizes order). */
function dimValue(dim, values) {
  if (typeof dim === "number") return dim;
  let sum = 0;
  for (const [coefficient, ...names] of dim.terms) sum += names.reduce((product, at) => product * values[at], coefficient);
  return sum;
}

// A dim's largest value over the sizes' ranges, by interval arithmetic term by term as Sym.bounds computes it (exact
// for the sums of products with positive coefficients that shapes are), so a slot has the size Python gives it.
function largestDim(dim, sizes) {
  if (typeof dim === "number") return dim;
  let high = 0;
  for (const [coefficient, ...names] of dim.terms) {
    let [low, up] = [coefficient, coefficient];
    for (const at of names) {
      const { min, max } = sizes[at];
      const products = [low * min, low * max, up * min, up * max];
      [low, up] = [Math.min(...products), Math.max(...products)];
    }
    high += up;
  }
  return Number.isSafeInteger(high) ? high : -1;
}

/** The plan of a symbolic manifest, after checking its sizes and every dim against them; null for a static one. */
function checkSizes(manifest) {
  const sizes = manifest.sizes || [];
  const alignment = manifest.size_alignment ?? 1;
  if (!Number.isSafeInteger(alignment) || alignment < 1 || alignment > 65536) {
    invalid("size_alignment", "a whole number from 1 to 65536", alignment);
  }
  const positions = new Map();
  sizes.forEach(({ name, min, max }, position) => {
    const where = `sizes[${position}]`;
    if (!/^[A-Za-z_][\w.]*$/.test(name)) invalid(`${where}.name`, "a name of letters, digits, _ and . (no digit first)", name);
    if (positions.has(name)) invalid(`${where}.name`, "a name no other size has", name);
    if (min > max) invalid(`${where}.max`, `at least its min (${min})`, max);
    positions.set(name, position);
  });
  const names = sizes.length ? `the sizes ${[...positions.keys()].join(", ")}` : "no sizes (the manifest has none)";
  const tensors = (key) =>
    manifest[key].map((spec, position) => {
      const dims = spec.shape.map((dim, axis) => {
        if (typeof dim === "number") return dim;
        const parsed = parseSize(dim, positions);
        if (parsed === null || largestDim(parsed, sizes) < 0) {
          invalid(`${key}[${position}].shape[${axis}]`, `a size expression over ${names}`, dim);
        }
        return parsed;
      });
      // a symbolic dim is laid out for its largest value rounded up to manifest.size_alignment (compiler/target.py)
      const largest = dims.map((dim) => (typeof dim === "number" ? dim : Math.ceil(largestDim(dim, sizes) / alignment) * alignment));
      return { dims, largest, bytes: tensorBytes({ ...spec, shape: largest }, `${key}[${position}]`) };
    });
  const plan = { sizes, inputs: tensors("inputs"), outputs: tensors("outputs") };
  sizes.forEach(({ name }, position) => {
    if (!plan.inputs.some((tensor) => tensor.dims.some((dim) => dim.alone === position))) {
      fail(
        "manifest",
        `sizes[${position}]`,
        `manifest.json: no input dimension is the size ${name} alone, so a run cannot tell its value; export the model again`,
      );
    }
  });
  return sizes.length ? plan : null;
}

// each checked manifest's plan of sizes (null: static)
const plans = new WeakMap();

function planOf(manifest) {
  if (!plans.has(manifest)) plans.set(manifest, checkSizes(manifest));
  return plans.get(manifest);
}

/** Each size's value (manifest.sizes order) in a run of inputs of `shapes`, as SymbolicSizes.bind finds them: an input
 * dim that is one size alone gives it, every other dim must then agree and every size lie in its range. */
function bindSizes(plan, inputs, shapes) {
  const values = [];
  const from = [];
  inputs.forEach(({ name }, position) => {
    const { dims } = plan.inputs[position];
    const shape = shapes[position];
    if (shape.length !== dims.length) {
      const takes = `rank ${dims.length} (${shapeText(inputs[position].shape)})`;
      fail("input", name, `input "${name}" has dims ${shapeText(shape)}, of rank ${shape.length}; the model takes ${takes}`);
    }
    dims.forEach((dim, axis) => {
      const at = dim.alone;
      if (!(at >= 0)) return;
      const size = plan.sizes[at].name;
      if (values[at] === undefined) {
        values[at] = shape[axis];
        from[at] = [name, `input "${name}" axis ${axis}`];
      } else if (values[at] !== shape[axis]) {
        fail(
          "input",
          name,
          `input "${name}" has ${shape[axis]} at axis ${axis}, which is the size ${size}, but ${from[at][1]} gives ` +
            `${size} = ${values[at]}; give inputs whose ${size} agrees`,
        );
      }
    });
  });
  plan.sizes.forEach(({ name, min, max }, at) => {
    if (values[at] < min || values[at] > max) {
      fail(
        "input",
        from[at][0],
        `${from[at][1]} gives the size ${name} = ${values[at]}, outside the range ${min}..${max} the model was ` +
          `compiled for; compile it with a range that holds it (tessel compile --dim ${name}=LOW..HIGH)`,
      );
    }
  });
  inputs.forEach(({ name, shape: dims }, position) => {
    const wanted = plan.inputs[position].dims.map((dim) => dimValue(dim, values));
    if (wanted.some((size, axis) => size !== shapes[position][axis])) {
      const at = plan.sizes.map((size, index) => `${size.name} = ${values[index]}`).join(", ");
      const takes = `${shapeText(wanted)} (${shapeText(dims)}) at ${at}`;
      fail("input", name, `input "${name}" has dims ${shapeText(shapes[position])}, the model takes ${takes}`);
    }
  });
  return values;
}

/** Calls visit(from, to, bytes) for each run of contiguous bytes of the box `shape` (in the first corner) between two
 * layouts of it, `fromLargest` and `toLargest` (each that shape's strides; a compact array is laid out at `shape`):
 * byte offsets from each layout's start. Trailing axes the box spans whole in both go as one run. */
function boxRuns(shape, fromLargest, toLargest, itemBytes, visit) {
  let axis = shape.length - 1;
  let run = itemBytes;
  while (axis >= 0 && shape[axis] === fromLargest[axis] && shape[axis] === toLargest[axis]) run *= shape[axis--];
  if (axis < 0) return visit(0, 0, run);
  // the bytes between two steps along each outer axis, in each layout
  const strides = (largest) => {
    const result = [];
    for (let at = axis - 1, stride = run * largest[axis]; at >= 0; stride *= largest[at--]) result[at] = stride;
    return result;
  };
  const [fromStrides, toStrides] = [strides(fromLargest), strides(toLargest)];
  run *= shape[axis];
  const rows = elementCount(shape.slice(0, axis));
  const index = new Array(axis).fill(0);
  for (let row = 0, from = 0, to = 0; row < rows && run > 0; row++) {
    visit(from, to, run);
    for (let at = axis - 1; at >= 0; at--) {
      from += fromStrides[at];
      to += toStrides[at];
      if (++index[at] < shape[at]) break;
      from -= fromStrides[at] * shape[at];
      to -= toStrides[at] * shape[at];
      index[at] = 0;
    }
  }
}

/** Copies the box `shape` between `compact` (bytes, row-major) and the first corner of the slot at `offset` laid out at
 * `largest` (that shape's strides): into the slot for an input (`inward`; the rest zeroed, so no run sees the last
 * one's leftovers), out of it for an output. */
function moveBox(buffer, offset, largest, shape, itemBytes, compact, inward) {
  const slot = new Uint8Array(buffer, offset, elementCount(largest) * itemBytes);
  if (inward) {
    if (shape.some((size, axis) => size !== largest[axis])) slot.fill(0);
    boxRuns(shape, shape, largest, itemBytes, (from, to, bytes) => slot.set(compact.subarray(from, from + bytes), to));
  } else {
    boxRuns(shape, largest, shape, itemBytes, (from, to, bytes) => compact.set(slot.subarray(from, from + bytes), to));
  }
}

const bytesOf = (array) => new Uint8Array(array.buffer, array.byteOffset, array.byteLength);

// each loaded manifest's binding digest, computed from its text
const bindings = new WeakMap();

/** Refuse code that does not carry the binding digest of `manifest` (the wasm module's getter gives its address). */
function checkBinding(manifest, name, getter, memory) {
  const address = typeof getter === "function" ? getter() : -1;
  if (!(Number.isSafeInteger(address) && address >= 0 && address + 64 <= memory.buffer.byteLength)) {
    fail("binding", name, `${name} is not a Tessel model module (no tessel_manifest_digest); export the model again`);
  }
  if (new TextDecoder().decode(copyOut(memory, address, 64)) !== bindings.get(manifest)) bindingMismatch(name);
}

function bindingMismatch(name) {
  fail(
    "binding",
    name,
    `${name} was not generated for this manifest.json (its binding digest differs: the manifest or the code was ` +
      "edited or swapped); export the model again",
  );
}

// A bundle runs on the runtime versions compatible with the one it was compiled for, as npm's ^ reads it: the same
// major version (the same minor while the major is 0), and not older than it.
function checkRuntimeVersion(wanted) {
  const parse = (text) => /^(\d+)\.(\d+)\.(\d+)$/.exec(text)?.slice(1).map(Number);
  const [bundle, here] = [parse(wanted), parse(VERSION)];
  if (!bundle) {
    fail(
      "version",
      "runtime_version",
      `the bundle names no runtime version (runtime_version ${JSON.stringify(wanted)}): it was compiled by a Tessel ` +
        `older than tessel-runtime 0.1.0; compile the model again`,
    );
  }
  const sameLine = bundle[0] === here[0] && (bundle[0] > 0 || bundle[1] === here[1]);
  const notOlder = bundle[1] < here[1] || (bundle[1] === here[1] && bundle[2] <= here[2]);
  if (!sameLine || !notOlder) {
    fail(
      "version",
      "runtime_version",
      `the bundle was compiled for tessel-runtime ${wanted} and this is ${VERSION}: install tessel-runtime@^${wanted}, ` +
        `or compile the model again with a Tessel whose runtime is ${VERSION}`,
    );
  }
}

function checkManifest(manifest) {
  if (!isObject(manifest)) fail("manifest", "", "manifest.json is not a JSON object; export the model again");
  if (manifest.format_version !== FORMAT_VERSION) {
    fail(
      "version",
      "format_version",
      `bundle format version ${JSON.stringify(manifest.format_version)}; this runtime reads version ` +
        `${FORMAT_VERSION}: compile the model again with a matching Tessel`,
    );
  }
  checkRuntimeVersion(manifest.runtime_version);
  checkSchema(MANIFEST_SCHEMA, "", manifest);
  const kind = manifest.target.split(" ")[0];
  if (CODE_FILES[kind] === undefined) invalid("target", `a target of kind ${Object.keys(CODE_FILES).join(", ")}`, manifest.target);
  if (manifest.code !== CODE_FILES[kind]) invalid("code", `"${CODE_FILES[kind]}" for target ${kind}`, manifest.code);
  for (const name of Object.keys(manifest.files)) {
    if (!FILE_NAME.test(name)) invalid(`files`, "plain file names beside manifest.json (no '/' or '..')", name);
  }
  const listed = (where, name) => Object.hasOwn(manifest.files, name) || invalid(where, "a file that manifest.files lists", name);
  listed("code", manifest.code);
  listed("params.file", manifest.params.file);
  for (const name of Object.keys(manifest.chunked_files ? manifest.chunked_files.sha256 : {})) listed("chunked_files.sha256", name);
  if (manifest.chunked_files && manifest.chunked_files.chunk_bytes === 0) invalid("chunked_files.chunk_bytes", "positive", 0);
  const params = manifest.params;
  // a symbolic manifest's inputs and outputs are sized at their largest shapes by checkSizes
  const plan = checkSizes(manifest);
  plans.set(manifest, plan);
  for (const [key, specs] of [["inputs", manifest.inputs], ["outputs", manifest.outputs], ["params.layout", params.layout]]) {
    if (!plan || key === "params.layout") specs.forEach((spec, position) => tensorBytes(spec, `${key}[${position}]`));
  }
  params.layout.forEach((entry, position) => {
    if (entry.nbytes !== tensorBytes(entry, "") || entry.offset + entry.nbytes > params.bytes) {
      invalid(`params.layout[${position}]`, `a tensor inside params.bin's ${params.bytes} bytes`, entry.name);
    }
  });
  const limits = (where, memory) => {
    if (memory && memory.maximum_pages !== null && memory.maximum_pages < memory.initial_pages) {
      invalid(`${where}.maximum_pages`, "at least initial_pages", memory.maximum_pages);
    }
  };
  limits("memory.wasm_import", manifest.memory.wasm_import);
  (manifest.variants || []).forEach((variant, position) => {
    const where = `variants[${position}]`;
    if (variant.code !== ["model", ...variant.features, "wasm"].join(".")) invalid(`${where}.code`, "the file of its features", variant.code);
    listed(`${where}.code`, variant.code);
    limits(`${where}.wasm_import`, variant.wasm_import);
  });
  const kernels = new Set(manifest.kernels.map((kernel) => kernel.name));
  manifest.calls.forEach((call, position) => kernels.has(call.kernel) || invalid(`calls[${position}].kernel`, "a kernel of kernels", call.kernel));
  manifest.outputs.forEach((spec, position) => {
    const source = spec.source;
    const where = `outputs[${position}].source`;
    if (source === null) return;
    if (source.region === "params") {
      if (spec.shape.some((dim) => typeof dim === "string")) {
        invalid(`outputs[${position}].shape`, "a fixed shape for a copied weight", spec.shape);
      }
      count()(`${where}.offset`, source.offset);
      if (source.offset + tensorBytes(spec, where, spec.device_dtype || spec.dtype) > params.bytes) {
        invalid(`${where}.offset`, `inside params.bin's ${params.bytes} bytes`, source.offset);
      }
      return;
    }
    const among = source.region === "input" ? manifest.inputs : manifest.outputs;
    count(among.length - 1)(`${where}.index`, source.index);
    const from = among[source.index];
    if (from.dtype !== spec.dtype || from.shape.length !== spec.shape.length || from.shape.some((size, axis) => size !== spec.shape[axis])) {
      invalid(where, `a ${source.region} of shape ${shapeText(spec.shape)} and dtype ${spec.dtype}`, source.index);
    }
  });
}

// The typed arrays an input of each dtype may be given as, the first the one its results come back as: float16 as
// a Float16Array, its bits (Uint16Array) or a Float32Array (rounded to the nearest float16); uint8 also as a
// Uint8ClampedArray (a canvas's pixels).
const INPUT_ARRAYS = Object.fromEntries(Object.entries(RESULT_ARRAYS).map(([dtype, Type]) => [dtype, [Type]]));
INPUT_ARRAYS.float16 = [...(Float16 ? [Float16] : []), Uint16Array, Float32Array];
INPUT_ARRAYS.uint8.push(Uint8ClampedArray);
// what a wrong one is told: the arrays it may be and how to make one
const INPUT_HINTS = {
  float16: [`${Float16 ? "a Float16Array, " : ""}a Uint16Array of float16 bits or a Float32Array (rounded to float16)`, "Float32Array.from(values)"],
  uint8: ["a Uint8Array or a Uint8ClampedArray", "Uint8Array.from(values)"],
  bool: ["a Uint8Array of 0 and 1", "Uint8Array.from(values, Number)"],
  int64: ["a BigInt64Array", "BigInt64Array.from(values, BigInt)"],
};
const inputHint = (dtype) => {
  const name = RESULT_ARRAYS[dtype].name;
  return INPUT_HINTS[dtype] || [`${/^[AEIOU]/.test(name) ? "an" : "a"} ${name}`, `${name}.from(values)`];
};

/** The feeds as one typed array per manifest input, in manifest order, after checking names, dtypes and sizes; for a
 * symbolic model (`plan`) {arrays, sizes}, the sizes' values bound from the inputs' dims. */
function checkFeeds(feeds, inputs, plan = null) {
  if (feeds === null || typeof feeds !== "object" || ArrayBuffer.isView(feeds)) {
    fail("input", null, "run takes an object of input name -> typed array or {data, dims}");
  }
  const names = inputs.map((spec) => spec.name);
  for (const name of Object.keys(feeds)) {
    if (!names.includes(name)) {
      fail("input", name, `unknown input "${name}"; the model's inputs are ${names.join(", ")}`);
    }
  }
  const shapes = [];
  const arrays = inputs.map((spec) => {
    if (!(spec.name in feeds)) {
      fail("input", spec.name, `missing input "${spec.name}"; the model's inputs are ${names.join(", ")}`);
    }
    const feed = feeds[spec.name];
    const given = ArrayBuffer.isView(feed) ? feed : feed && feed.data;
    const accepted = INPUT_ARRAYS[spec.dtype];
    const Given = accepted.find((Type) => given instanceof Type);
    if (!Given) {
      const got = kindOf(given ?? feed);
      fail(
        "input",
        spec.name,
        `input "${spec.name}" (dtype ${spec.dtype}) must be ${inputHint(spec.dtype)[0]}, got ${got}; ` +
          `convert it, e.g. ${inputHint(spec.dtype)[1]}`,
      );
    }
    if (plan) {
      shapes.push(givenShape(spec, feed, given));
    } else if (!ArrayBuffer.isView(feed) && feed.dims != null) {
      const dims = Array.from(feed.dims, Number);
      if (dims.length !== spec.shape.length || dims.some((size, axis) => size !== spec.shape[axis])) {
        fail(
          "input",
          spec.name,
          `input "${spec.name}" has dims ${shapeText(dims)}, the model takes ${shapeText(spec.shape)}; ` +
            "compile with another input shape to run other sizes",
        );
      }
    }
    const count = plan ? given.length : elementCount(spec.shape);
    if (given.length !== count) {
      fail(
        "input",
        spec.name,
        `input "${spec.name}" has ${given.length} elements, the model takes ${count} ` +
          `(shape ${shapeText(spec.shape)})`,
      );
    }
    if (spec.dtype === "bool") {
      const other = given.findIndex((value) => value > 1);
      if (other >= 0) fail("input", spec.name, `input "${spec.name}" (dtype bool) holds ${given[other]} at ${other}; a bool is 0 or 1`);
    }
    // what the executors copy in: the bytes of the dtype (float16's bits; a Float32Array is rounded to them)
    if (Given === Float32Array && spec.dtype === "float16") return float32ToFloat16Bits(given);
    const Stored = TYPED_ARRAYS[spec.dtype];
    return Given === Stored ? given : new Stored(given.buffer, given.byteOffset, given.length);
  });
  return plan ? { arrays, sizes: bindSizes(plan, inputs, shapes) } : arrays;
}

/** The dims of an input of a symbolic model: its {dims}, or its fixed shape; whole numbers that hold its elements. */
function givenShape(spec, feed, given) {
  const { name } = spec;
  const dims = ArrayBuffer.isView(feed) || feed.dims == null ? null : Array.from(feed.dims, Number);
  if (!dims && spec.shape.some((dim) => typeof dim === "string")) {
    const shape = shapeText(spec.shape);
    fail("input", name, `input "${name}" has the symbolic shape ${shape}: give it as {data, dims} so that the run knows its sizes`);
  }
  const shape = dims || spec.shape;
  if (!shape.every((size) => isCount(size, MAX_BYTES))) {
    fail("input", name, `input "${name}" has dims ${shapeText(shape)}; each must be a whole number`);
  }
  const count = elementCount(shape);
  if (given.length !== count) {
    fail("input", name, `input "${name}" has ${given.length} elements, its dims ${shapeText(shape)} hold ${count}`);
  }
  return shape;
}

// ---- backends ----------------------------------------------------------------------------------------
//
// A backend is {name, describe(manifest), probe(manifest), create(manifest, source, options)}:
//   describe -> null when the bundle carries code for this backend, else the reason it does not;
//   probe    -> (async) null when this machine can run it, else the reason it cannot;
//   create   -> (async) an executor {run(arrays) -> typed arrays in manifest output order, dispose()},
//               given inputs already checked. The model object around it owns validation and naming.

// The run entry returns the number (from 1) of the kernel call that found an index out of range, as
// compiler/runtime/__init__.py's check_status reads it.
function describeFailure(manifest, failed) {
  const call = (manifest.calls || [])[failed - 1];
  const kernel = call && (manifest.kernels || []).find((item) => item.name === call.kernel);
  const where = call ? `${kernel ? [...new Set(kernel.ops)].join("/") : call.kernel} (group '${call.group}')` : `kernel call ${failed}`;
  return (
    `an index is out of range in ${where}: each index must lie in [-n, n) for an axis of n elements ` +
    "(onnxruntime refuses it too); check the model's index inputs"
  );
}

/** A fresh `Type` over a copy of `array`'s bytes (float16's bits stay bits, where Type.from would convert values). */
function copyAs(Type, array) {
  return new Type(new Uint8Array(array.buffer, array.byteOffset, array.byteLength).slice().buffer);
}

// A copy of `length` bytes of linear memory from `start` in a fresh (never shared) ArrayBuffer.
function copyOut(memory, start, length) {
  const copy = new Uint8Array(length);
  copy.set(new Uint8Array(memory.buffer, start, length));
  return copy.buffer;
}

class WasmExecutor {
  // Linear memory from __heap_base: params (copied in once), the arena, then one 64-byte-aligned slot per
  // input and output (a symbolic model's at their largest shapes), then one stack per pool worker (threaded
  // variants), then a symbolic model's int32 sizes, the layout compiler/runtime/wasm.py uses, so
  // `run(inputs…, outputs…, params, arena[, sizes])` sees the same offsets in every runtime.
  constructor(manifest, instance, memory, workers = 0, stackBytes = 0) {
    this.manifest = manifest;
    this.memory = memory;
    this.instance = instance;
    this.entry = instance.exports[manifest.entry.name];
    // threaded variants built before their run entry woke the pool itself (tessel_pool_run) export this for the host
    // to call as a run starts; newer ones do not
    this.wakePool = instance.exports.tessel_pool_wake;
    this.workers = [];
    let end = roundUp(instance.exports.__heap_base.value, ALIGNMENT);
    const reserve = (size) => {
      const offset = end;
      end = roundUp(end + Math.max(size, 1), ALIGNMENT);
      return offset;
    };
    this.paramsOffset = reserve(manifest.params.bytes);
    this.paramsEpoch = 0; // how often params.bin was read again (a damaged cache entry) since the first copy
    this.arenaOffset = reserve(manifest.memory.arena_bytes);
    const plan = (this.plan = planOf(manifest));
    const slot = (tensors) => (spec, position) => reserve(plan ? plan[tensors][position].bytes : byteSize(spec));
    this.inputOffsets = manifest.inputs.map(slot("inputs"));
    this.outputOffsets = manifest.outputs.map(slot("outputs"));
    // a stack grows down from the end of its region
    this.stackTops = Array.from({ length: workers }, () => reserve(stackBytes) + stackBytes);
    if (plan) this.sizesOffset = reserve(4 * plan.sizes.length);
    const missing = end - memory.buffer.byteLength;
    if (missing > 0) {
      try {
        memory.grow(Math.ceil(missing / PAGE_BYTES));
      } catch (error) {
        fail("memory", "memory", `cannot grow wasm memory to ${end} bytes for this model: ${error.message}`);
      }
    }
  }

  async loadParams(source, chunks, onProgress) {
    const { manifest } = this;
    const name = manifest.params.file;
    const view = new Uint8Array(this.memory.buffer, this.paramsOffset, manifest.params.bytes);
    const { checked } = await copyParams(manifest, chunks, view, onProgress);
    mark("params-in");
    // A cached params.bin that fails is read again into place from the network; a run made on it runs again.
    const again = async () => {
      const copy = await copyParams(manifest, source.chunks(name), view);
      this.paramsEpoch += 1;
      return copy.checked;
    };
    // The digest (crypto.subtle copies its input when called; Node hashes on its thread pool, Chromium on the calling
    // thread) is not awaited here: every run's result waits for it, and a mismatch rejects that run and every later
    // one, so no result ever comes from unchecked params.
    this.paramsChecked = settle(source, name, checked, again).then(() => mark("params-checked"));
    this.paramsChecked.catch(() => {});
  }

  /** Start one pool worker per reserved stack and wait until each has instantiated the module. A page that may not
   * start workers (a Content-Security-Policy without blob: workers) runs on the calling thread alone, with a warning:
   * the pool never waits for a worker that has not joined, so the threaded code is right on one thread too. */
  async startWorkers(module) {
    const starting = this.stackTops.map((stackTop) => startPoolWorker({ module, memory: this.memory, stackTop }));
    const started = await Promise.allSettled(starting);
    this.workers = started.filter((item) => item.status === "fulfilled").map((item) => item.value);
    const failure = started.find((item) => item.status === "rejected");
    if (failure) {
      for (const worker of this.workers) worker.terminate();
      this.workers = [];
      this.variant.threads = 1;
      console.warn(`tessel: running on 1 thread: a wasm thread-pool worker did not start (${failure.reason.message})`);
    }
  }

  /** A run's outputs, returned only once params.bin has been checked against the manifest's digest; `sizes`: a
   * symbolic model's values (bindSizes). */
  run(arrays, sizes) {
    return this.afterParams(() => (this.plan ? this.runSized(arrays, sizes) : this.runNow(arrays)));
  }

  /** One step of generate (Model.generate): the logits of the last of `ids`, with `past` tokens cached (stepNow). */
  step(request) {
    return this.afterParams(() => this.stepNow(request));
  }

  /** What `work` (a run) gives, once params.bin has been checked; done again if params.bin was read again meanwhile. */
  async afterParams(work) {
    const epoch = this.paramsEpoch;
    let results, failure;
    try {
      results = work();
    } catch (error) {
      failure = error;
    }
    await this.paramsChecked; // damaged params explain a failed run first
    if (epoch !== this.paramsEpoch) return this.afterParams(work); // params.bin was read again meanwhile
    if (failure) throw failure;
    return results;
  }

  runNow(arrays) {
    const { inputs, outputs } = this.manifest;
    this.cache = null;
    arrays.forEach((array, position) => {
      new Uint8Array(this.memory.buffer, this.inputOffsets[position], byteSize(inputs[position])).set(
        new Uint8Array(array.buffer, array.byteOffset, array.byteLength),
      );
    });
    if (this.workers.length > 0 && this.wakePool) this.wakePool();
    const failed = this.entry(...this.inputOffsets, ...this.outputOffsets, this.paramsOffset, this.arenaOffset);
    if (failed) fail("run", this.manifest.calls[failed - 1]?.group ?? null, describeFailure(this.manifest, failed));
    const results = outputs.map((spec, position) => {
      const Type = RESULT_ARRAYS[spec.dtype];
      return new Type(copyOut(this.memory, this.outputOffsets[position], byteSize(spec)));
    });
    // Outputs no kernel writes (an input or a weight passed straight through) are copied here, as in build.py.
    outputs.forEach((spec, position) => {
      const from = spec.source;
      if (!from) return;
      const Type = RESULT_ARRAYS[spec.dtype];
      if (from.region === "params") results[position] = new Type(copyOut(this.memory, this.paramsOffset + from.offset, byteSize(spec)));
      else results[position] = copyAs(Type, (from.region === "input" ? arrays : results)[from.index]);
    });
    return results;
  }

  /** A symbolic model's run: each input into the first corner of its largest-shape slot, the sizes' values as the
   * entry's last argument, each output's box read back as a compact array. */
  runSized(arrays, sizes) {
    const { plan, manifest } = this;
    const { buffer } = this.memory;
    this.writeInputs(arrays, sizes);
    this.enter(sizes);
    const { outputOffsets, paramsOffset } = this;
    const results = manifest.outputs.map((spec, position) => {
      const { dims, largest } = plan.outputs[position];
      const shape = dims.map((dim) => dimValue(dim, sizes));
      const Type = RESULT_ARRAYS[spec.dtype];
      if (shape.some((size, axis) => !(size >= 0 && size <= largest[axis]))) {
        const where = `${shapeText(shape)} at these sizes, outside its slot ${shapeText(largest)}`;
        fail("run", spec.name, `output "${spec.name}" is ${where}; export the model again`);
      }
      const result = new Uint8Array(elementCount(shape) * Type.BYTES_PER_ELEMENT);
      if (!spec.source) moveBox(buffer, outputOffsets[position], largest, shape, Type.BYTES_PER_ELEMENT, result, false);
      return new Type(result.buffer);
    });
    // Outputs no kernel writes, as in runNow (a weight's shape is fixed: checkManifest).
    manifest.outputs.forEach((spec, position) => {
      const from = spec.source;
      if (!from) return;
      const Type = RESULT_ARRAYS[spec.dtype];
      if (from.region === "params") results[position] = new Type(copyOut(this.memory, paramsOffset + from.offset, byteSize(spec)));
      else results[position] = copyAs(Type, (from.region === "input" ? arrays : results)[from.index]);
    });
    return results;
  }

  /** A symbolic model's inputs, compact arrays in manifest order, each into the first corner of its slot; an input
   * left out (a hole or undefined) keeps what its slot holds. */
  writeInputs(arrays, sizes) {
    const { plan } = this;
    const { buffer } = this.memory;
    arrays.forEach((array, position) => {
      if (!array) return;
      const { dims, largest } = plan.inputs[position];
      const shape = dims.map((dim) => dimValue(dim, sizes));
      moveBox(buffer, this.inputOffsets[position], largest, shape, array.BYTES_PER_ELEMENT, bytesOf(array), true);
    });
  }

  /** A symbolic model's run on what its slots hold, the sizes' values written for the entry: outputs stay in place. */
  enter(sizes) {
    const { manifest, inputOffsets, outputOffsets, paramsOffset, arenaOffset, sizesOffset } = this;
    this.cache = null; // a run overwrites the outputs that a generate's next step reads its cache from
    new Int32Array(this.memory.buffer, sizesOffset, sizes.length).set(sizes);
    if (this.workers.length > 0 && this.wakePool) this.wakePool();
    const failed = this.entry(...inputOffsets, ...outputOffsets, paramsOffset, arenaOffset, sizesOffset);
    if (failed) fail("run", manifest.calls[failed - 1]?.group ?? null, describeFailure(manifest, failed));
  }

  /** A step of generate with the cache kept in wasm memory. `ids`: the token ids of this step (the prompt, then one),
   * after `past` cached ones; `sizes`: their values (bindSizes); `generation`: whose cache the last step left. Before
   * the run, each present output's rows that its past input's slot lacks (the last step's new ones: present = past
   * followed by the step's rows, so the rows before them are there already) are copied into that slot inside the
   * memory (copyWithin: no byte of the cache goes through JavaScript); the token ids, the mask and the positions are
   * written into theirs; only the logits of the last position are read out. */
  stepNow({ generation, ids, past, sizes }) {
    const { plan, manifest, cache } = this;
    const layout = cacheLayout(manifest);
    const { buffer } = this.memory;
    const total = past + ids.length;
    const arrays = [];
    if (past > 0) {
      if (!(cache && cache.generation === generation && cache.rows >= past)) {
        fail(
          "generate",
          null,
          "the cache of this generate was overwritten: the model ran (run, or another generate) between two of its " +
            "steps; await generate before running the model again",
        );
      }
      const memory = new Uint8Array(buffer);
      for (const [input, output] of layout.pairs) {
        // rows cache.cached..past of each head: a box of [1, heads, rows, depth] whose first row is cache.cached's
        const [, heads, , depth] = manifest.inputs[input].shape;
        const itemBytes = ITEM_BYTES[manifest.inputs[input].dtype];
        const from = this.outputOffsets[output] + cache.cached * depth * itemBytes;
        const to = this.inputOffsets[input] + cache.cached * depth * itemBytes;
        const rows = [1, heads, past - cache.cached, depth];
        boxRuns(rows, plan.outputs[output].largest, plan.inputs[input].largest, itemBytes, (source, target, bytes) =>
          memory.copyWithin(to + target, from + source, from + source + bytes),
        );
      }
    } else {
      // the first step: an empty cache (its slots zeroed, as a run's inputs are)
      for (const [input] of layout.pairs) arrays[input] = new TYPED_ARRAYS[manifest.inputs[input].dtype](0);
    }
    const dtypes = manifest.inputs.map((spec) => spec.dtype);
    arrays[layout.ids] = typedValues(dtypes[layout.ids], ids.length, (at) => ids[at]);
    if (layout.mask >= 0) arrays[layout.mask] = typedValues(dtypes[layout.mask], total, () => 1);
    if (layout.positions >= 0) {
      arrays[layout.positions] = typedValues(dtypes[layout.positions], ids.length, (at) => past + at);
    }
    this.writeInputs(arrays, sizes);
    this.enter(sizes);
    this.cache = { generation, rows: total, cached: past }; // rows: the present outputs', cached: the past slots'
    // the last row of the logits [1, seq, vocabulary], in its slot at [1, largest seq, vocabulary]
    const { dtype } = manifest.outputs[layout.logits];
    const { dims, largest } = plan.outputs[layout.logits];
    const rows = dimValue(dims[1], sizes);
    if (!(rows >= 1 && rows <= largest[1])) {
      fail("run", "logits", `the logits have ${rows} rows at these sizes; export the model again`);
    }
    const rowBytes = layout.vocabulary * ITEM_BYTES[dtype];
    const row = copyOut(this.memory, this.outputOffsets[layout.logits] + (rows - 1) * rowBytes, rowBytes);
    return dtype === "float16" ? float16BitsToFloat32(new Uint16Array(row)) : new RESULT_ARRAYS[dtype](row);
  }

  dispose() {
    for (const worker of this.workers) worker.terminate();
    this.workers = [];
    this.memory = null;
    this.entry = null;
  }
}

// ---- threads: a pool of workers over one shared memory ------------------------------------------------
//
// A threaded variant (manifest.variants, features ["threads"]) links compiler/codegen/wasm_thread_pool.c: the
// module's parallel loops call its tessel_parallel, and each worker runs its tessel_worker, which never returns.
// The calling thread (the page's main thread or Node's) takes part in every job and never blocks: it only spins
// until the workers that joined a job have left it (docs/web.md, "Threads and relaxed SIMD").

// A worker's whole life, run in a Web Worker or a Node worker thread: instantiate the module over the shared memory,
// move its stack to its own region, say it is ready, then serve the pool until it is terminated.
function poolWorker(data, ready) {
  const instance = new WebAssembly.Instance(data.module, { env: { memory: data.memory } });
  instance.exports.__stack_pointer.value = data.stackTop;
  ready();
  instance.exports.tessel_worker();
}

const BROWSER_WORKER_SOURCE = `onmessage = (event) => (${poolWorker})(event.data, () => postMessage("ready"));`;
// a dynamic import, not require: the worker's source is CommonJS or an ES module depending on Node's flags (a program
// run with --input-type=module passes that on to its workers)
const NODE_WORKER_SOURCE =
  `import("node:worker_threads").then(({ parentPort }) =>\n` +
  `  parentPort.once("message", (data) => (${poolWorker})(data, () => parentPort.postMessage("ready"))));`;

let browserWorkerUrl;

/** A started pool worker: resolves, once it has instantiated the module, to an object with terminate(). */
async function startPoolWorker(data) {
  let worker;
  if (isNode()) {
    const { Worker } = await nodeModule("node:worker_threads");
    worker = new Worker(NODE_WORKER_SOURCE, { eval: true });
    // a worker serving the pool forever must not keep Node alive once the caller is done
    worker.unref();
  } else {
    browserWorkerUrl ??= URL.createObjectURL(new Blob([BROWSER_WORKER_SOURCE], { type: "text/javascript" }));
    worker = new Worker(browserWorkerUrl);
  }
  const ready = new Promise((resolve, reject) => {
    const onMessage = (message) => (message === "ready" || message.data === "ready" ? resolve() : null);
    const onError = (error) => reject(error instanceof Error ? error : new Error(error.message || String(error)));
    if (isNode()) {
      worker.once("message", onMessage);
      worker.once("error", onError);
    } else {
      worker.onmessage = onMessage;
      worker.onerror = onError;
    }
  });
  worker.postMessage(data);
  try {
    await ready;
  } catch (error) {
    worker.terminate();
    throw error;
  }
  return worker;
}

function availableCores() {
  if (typeof navigator === "object" && navigator && navigator.hardwareConcurrency) return navigator.hardwareConcurrency;
  return 1;
}

async function nodeCores() {
  const os = await nodeModule("node:os");
  return os.availableParallelism ? os.availableParallelism() : os.cpus().length;
}

// The threads a load may use: the caller's {threads}, else the cores, at most MAX_DEFAULT_THREADS; and why threads
// cannot be used here, when they cannot.
const MAX_DEFAULT_THREADS = 4;

async function threadsHere(requested) {
  if (requested !== undefined && !(Number.isSafeInteger(requested) && requested >= 1)) {
    fail("options", "threads", `threads must be a whole number of at least 1, got ${requested}`);
  }
  const cores = isNode() ? await nodeCores() : availableCores();
  const threads = requested ?? Math.min(cores, MAX_DEFAULT_THREADS);
  if (threads === 1) return { threads, reason: null };
  // a browser hides SharedArrayBuffer from a page that is not cross-origin isolated, so that is asked first
  if (!isNode() && globalThis.crossOriginIsolated !== true) {
    return {
      threads: 1,
      reason:
        "the page is not cross-origin isolated: serve it with the headers Cross-Origin-Opener-Policy: same-origin " +
        "and Cross-Origin-Embedder-Policy: require-corp",
    };
  }
  if (typeof SharedArrayBuffer !== "function") {
    return { threads: 1, reason: "this engine has no SharedArrayBuffer" };
  }
  if (!isNode() && typeof Worker !== "function") return { threads: 1, reason: "this page cannot start workers" };
  return { threads, reason: null };
}

let warnedAboutThreads = false;

/** The code file to run, its memory and features: the bundle's variant with the most features this engine has. */
async function chooseVariant(manifest, options) {
  const { threads, reason } = await threadsHere(options.threads);
  const threaded = (manifest.variants || []).some((variant) => variant.features.includes("threads"));
  if (reason && threaded && !warnedAboutThreads) {
    warnedAboutThreads = true;
    console.warn(`tessel: running on 1 thread: ${reason}`);
  }
  const available = new Set();
  if (threads > 1) available.add("threads");
  if (options.relaxedSimd !== false && hasWasmRelaxedSimd()) available.add("relaxed-simd");
  const usable = (manifest.variants || []).filter((variant) => variant.features.every((name) => available.has(name)));
  usable.sort((left, right) => right.features.length - left.features.length);
  const chosen = usable[0] || { code: manifest.code, features: [], wasm_import: manifest.memory.wasm_import };
  return { ...chosen, threads: chosen.features.includes("threads") ? threads : 1 };
}

const wasmBackend = {
  name: "wasm",
  describe(manifest) {
    return manifest.code && manifest.code.endsWith(".wasm") ? null : `the bundle's code is ${manifest.code}, not wasm`;
  },
  async probe() {
    if (typeof WebAssembly !== "object") return "this JavaScript engine has no WebAssembly";
    if (!hasWasmSimd()) {
      return (
        "this browser does not support WebAssembly SIMD (128-bit), which Tessel's wasm code needs; " +
        "use a current Chrome, Edge, Firefox or Safari (16.4+)"
      );
    }
    return null;
  },
  async create(manifest, source, options) {
    const variant = await chooseVariant(manifest, options);
    const limits = variant.wasm_import;
    if (!limits) fail("manifest", "memory.wasm_import", "the bundle's manifest has no memory.wasm_import; compile it again");
    let memory;
    try {
      memory = new WebAssembly.Memory({
        initial: limits.initial_pages,
        ...(limits.maximum_pages === null ? {} : { maximum: limits.maximum_pages }),
        ...(limits.shared ? { shared: true } : {}),
      });
    } catch (error) {
      fail("memory", "wasm_import", `cannot make the ${limits.initial_pages} pages of wasm memory the bundle asks for: ${error.message}`);
    }
    // The params download beside the code's; they are copied in once the module says where they go.
    const params = prefetched(source.chunks(manifest.params.file));
    // The digest and the code's own seal are checked before the compile's outcome is looked at, so a damaged
    // download says so rather than giving the engine's CompileError; nothing is instantiated before them.
    const read = async () => {
      const code = await source.wasm(variant.code, options.onProgress);
      mark("code-downloaded");
      await checkDigest(manifest, variant.code, code.bytes);
      return code;
    };
    const { bytes, compiled } = await settle(source, variant.code, read(), read);
    await checkSeal(variant.code, bytes, "wasm");
    let instance, module;
    try {
      module = await compiled;
      instance = await WebAssembly.instantiate(module, { env: { memory } });
    } catch (error) {
      if (error instanceof WebAssembly.LinkError) {
        fail("code", variant.code, `a Tessel wasm module imports only env.memory; this one does not link: ${error.message}`);
      }
      if (error instanceof WebAssembly.CompileError) {
        fail("code", variant.code, `${variant.code} is not a valid wasm module (${error.message}); export the bundle again`);
      }
      throw error;
    }
    mark("code-compiled");
    checkBinding(manifest, variant.code, instance.exports.tessel_manifest_digest, memory);
    const entry = instance.exports[manifest.entry && manifest.entry.name];
    const expected = manifest.inputs.length + manifest.outputs.length + 2 + (planOf(manifest) ? 1 : 0);
    if (typeof entry !== "function" || entry.length !== expected) {
      fail("code", variant.code, `${variant.code} has no entry taking the manifest's ${expected} arguments; export it again`);
    }
    const executor = new WasmExecutor(manifest, instance, memory, variant.threads - 1, variant.stack_bytes || 0);
    executor.variant = { code: variant.code, features: variant.features, threads: variant.threads };
    // the workers instantiate the module while the params are copied in and checked
    const workers = variant.threads > 1 ? executor.startWorkers(module) : null;
    try {
      await executor.loadParams(source, params, options.onProgress);
    } catch (error) {
      await workers;
      executor.dispose();
      throw error;
    }
    await workers;
    mark("workers-ready");
    return executor;
  },
};

// WebGPU: a bundle carries WGSL when its manifest has a `dispatches` list and a `webgpu` section (its entry points,
// buffers, and the adapter limits and features it needs). The executor lives in tessel-webgpu.js, imported only when
// this backend is chosen, so wasm-only pages never download it.
function webgpuShortfall(adapter, manifest) {
  for (const [limit, needed] of Object.entries(manifest.webgpu.limits || {})) {
    const has = adapter.limits[limit];
    if (has !== undefined && !(has >= needed)) return `the WebGPU adapter's ${limit} is ${has}, the bundle needs ${needed}`;
  }
  for (const feature of manifest.webgpu.features || []) {
    if (!adapter.features.has(feature)) return `the WebGPU adapter lacks ${feature}, which the bundle's code uses`;
  }
  return null;
}

const webgpuBackend = {
  name: "webgpu",
  describe(manifest) {
    if (planOf(manifest)) return "the bundle has symbolic sizes, which run on wasm so far";
    if (Array.isArray(manifest.dispatches) && manifest.webgpu) return null;
    return "the bundle has no WebGPU code (its manifest lists no dispatches)";
  },
  async probe(manifest) {
    const gpu = typeof navigator === "object" && navigator ? navigator.gpu : undefined;
    if (!gpu) return "this browser has no WebGPU (navigator.gpu is missing; it needs a secure context: https or localhost)";
    const adapter = await gpu.requestAdapter();
    if (!adapter) return "WebGPU gave no adapter on this machine";
    return webgpuShortfall(adapter, manifest);
  },
  async create(manifest, source, options) {
    const { createExecutor } = await import("./tessel-webgpu.js");
    const helpers = { describeFailure, mark, copyAs, copyParams, settle, checkDigest };
    return createExecutor(manifest, source, RESULT_ARRAYS, { ...options, ...helpers, binding: bindings.get(manifest) });
  },
};

const backends = new Map([
  ["webgpu", webgpuBackend],
  ["wasm", wasmBackend],
]);

/**
 * Add a backend or complete one: the fields given replace those of the backend with the same name (so
 * registerBackend({name: "webgpu", create}) gives the WebGPU slot its executor). `auto` tries backends in
 * the order they were first registered: WebGPU, then wasm.
 */
export function registerBackend(backend) {
  const merged = { ...backends.get(backend.name), ...backend };
  for (const key of ["name", "describe", "probe", "create"]) {
    if (typeof merged[key] !== (key === "name" ? "string" : "function")) {
      fail("backend", key, `a backend needs ${key}; see docs/web.md`);
    }
  }
  backends.set(backend.name, merged);
}

async function unusableReason(backend, manifest) {
  return (
    backend.describe(manifest) ||
    (await backend.probe(manifest)) ||
    (backend.create ? null : `this tessel.js has no ${backend.name} executor yet`)
  );
}

/**
 * The backend to use, the bundle it runs and why: `candidates(name)` gives the {manifest, source} of the bundle a
 * backend would run (one bundle for every backend, or a bundle set's bundle for it), or null when there is none.
 */
async function chooseBackend(candidates, requested) {
  const reasonFor = async (backend) => {
    const candidate = await candidates(backend.name);
    if (!candidate) return { reason: `the bundle set has no ${backend.name} bundle` };
    return { candidate, reason: await unusableReason(backend, candidate.manifest) };
  };
  if (requested === "auto") {
    const reasons = [];
    for (const backend of backends.values()) {
      const { candidate, reason } = await reasonFor(backend);
      if (!reason) {
        const passed = reasons.length ? `, passing over ${reasons.join("; ")}` : "";
        return { backend, ...candidate, reason: `auto chose ${backend.name}: the first that can run here${passed}` };
      }
      reasons.push(`${backend.name} (${reason})`);
    }
    fail("backend", "backend", `no backend can run this bundle here (${reasons.join("; ")})`);
  }
  const backend = backends.get(requested);
  if (!backend) {
    fail("options", "backend", `unknown backend "${requested}"; choose auto, ${[...backends.keys()].join(", ")}`);
  }
  const { candidate, reason } = await reasonFor(backend);
  if (reason) {
    const others = [];
    for (const other of backends.values()) {
      const found = other === backend ? null : await candidates(other.name);
      if (found && !other.describe(found.manifest)) others.push(other.name);
    }
    const hint = others.length ? `; load it with {backend: "${others[0]}"} or "auto"` : "";
    fail("backend", "backend", `cannot use the ${requested} backend: ${reason}${hint}`);
  }
  return { backend, ...candidate, reason: `asked for ${backend.name}` };
}

// ---- the cache: code and params kept by their digests ------------------------------------------------------------
//
// A fetched bundle's files (all but manifest.json, which is always revalidated) are kept in the Cache API, or in
// IndexedDB where there is no Cache API (a page over plain http that is not localhost), keyed by the sha256 the
// manifest gives, so a second load downloads nothing and a changed bundle (other digests) is a miss. An entry is
// checked against its digest before it is used; one that does not match is dropped and the file fetched again.
// Where there is neither (Node), or where storing fails (quota, private mode), nothing is cached and nothing is said.
const CACHE_NAME = "tessel-runtime";
// each file's write still under way, by digest: a lookup of the same digest and clearCache() wait for it
const storing = new Map();
const cacheKey = (digest) => `https://tessel-runtime.invalid/sha256/${digest}`;

function idbRequest(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

async function idb(mode, use) {
  const opening = indexedDB.open(CACHE_NAME, 1);
  opening.onupgradeneeded = () => opening.result.createObjectStore("files");
  const db = await idbRequest(opening);
  try {
    return await idbRequest(use(db.transaction("files", mode).objectStore("files")));
  } finally {
    db.close();
  }
}

function fileCache() {
  if (typeof caches === "object" && caches) {
    const open = () => caches.open(CACHE_NAME);
    return {
      get: async (digest) => {
        const response = await (await open()).match(cacheKey(digest));
        return response ? new Uint8Array(await response.arrayBuffer()) : null;
      },
      put: async (digest, bytes) => (await open()).put(cacheKey(digest), new Response(bytes)),
      delete: async (digest) => (await open()).delete(cacheKey(digest)),
    };
  }
  if (typeof indexedDB === "object" && indexedDB) {
    return {
      get: (digest) => idb("readonly", (store) => store.get(digest)).then((bytes) => bytes || null),
      put: (digest, bytes) => idb("readwrite", (store) => store.put(bytes, digest)),
      delete: (digest) => idb("readwrite", (store) => store.delete(digest)),
    };
  }
  return null;
}

/** Empty the cache of bundle files (the Cache API's and IndexedDB's); in Node, where there is none, nothing to do. */
export async function clearCache() {
  await Promise.all(storing.values());
  try {
    if (typeof caches === "object" && caches) await caches.delete(CACHE_NAME);
    if (typeof indexedDB === "object" && indexedDB) await idbRequest(indexedDB.deleteDatabase(CACHE_NAME));
  } catch (error) {
    fail("file", "cache", `cannot clear the cache of bundle files: ${error.message}`);
  }
}

const quietly = (promise) => promise.catch(() => null);

/**
 * A FetchSource's files through the cache: mode "default" reads and fills it, "reload" only fills it. It hashes
 * nothing: the backend's own digest check of each file it reads (settle) tells it, through checked(), whether the
 * bytes matched, so a hit is hashed once, as the backend uses it, and a download once, before it is stored.
 */
class CachedSource {
  constructor(inner, manifest, store, mode) {
    Object.assign(this, { inner, manifest, store, mode });
    // each file's last read: its bytes when they came from the network (stored once they match), null from the cache
    this.read = new Map();
    // files whose cached bytes did not match: read from the network from then on
    this.dropped = new Set();
  }

  async hit(name) {
    const digest = this.manifest.files[name];
    if (this.mode !== "default" || !digest || this.dropped.has(name)) return null;
    await storing.get(digest);
    const bytes = await quietly(this.store.get(digest));
    // an entry of the wrong size (a write cut short) is passed over unhashed, as a damaged one is after its check
    const size = name === this.manifest.params.file ? this.manifest.params.bytes : null;
    if (!bytes || (size !== null && bytes.byteLength !== size)) return null;
    this.read.set(name, null);
    return bytes;
  }

  fetched(name, bytes) {
    this.read.set(name, bytes);
  }

  /** The backend's digest check of the bytes of `name` it read last: bytes from the network that matched are
   * stored (after the load, off its critical path); cached bytes that did not are dropped, and true says to read
   * `name` again, from the network. */
  async checked(name, matched) {
    const bytes = this.read.get(name);
    this.read.delete(name);
    const digest = this.manifest.files[name];
    if (matched && bytes) {
      const write = quietly(this.store.put(digest, bytes));
      storing.set(digest, write);
      write.then(() => storing.get(digest) === write && storing.delete(digest));
    }
    if (matched || bytes !== null) return false;
    this.dropped.add(name);
    await quietly(this.store.delete(digest));
    return true;
  }

  async text(name) {
    const cached = await this.hit(name);
    if (cached) return new TextDecoder().decode(cached);
    const text = await this.inner.text(name);
    this.fetched(name, new TextEncoder().encode(text));
    return text;
  }

  async wasm(name, onProgress) {
    const bytes = await this.hit(name);
    if (!bytes) {
      const fetched = await this.inner.wasm(name, onProgress);
      this.fetched(name, fetched.bytes);
      return fetched;
    }
    reportProgress(onProgress, "code", bytes.byteLength, bytes.byteLength);
    const compiled = WebAssembly.compile(bytes);
    compiled.catch(() => {});
    return { bytes, compiled };
  }

  async *chunks(name) {
    const cached = await this.hit(name);
    if (cached) {
      for (let offset = 0; offset < cached.byteLength; offset += 1 << 20) yield cached.subarray(offset, offset + (1 << 20));
      return;
    }
    const parts = [];
    let length = 0;
    for await (const chunk of this.inner.chunks(name)) {
      parts.push(chunk);
      length += chunk.byteLength;
      yield chunk;
    }
    this.fetched(name, join(parts, length));
  }
}

const CACHE_MODES = ["default", "reload", "none"];

function cachedSource(source, manifest, mode) {
  const store = mode !== "none" && source instanceof FetchSource ? fileCache() : null;
  return store ? new CachedSource(source, manifest, store, mode) : source;
}

// ---- generating text -----------------------------------------------------------------------------------
//
// model.generate(prompt, options) runs a decoder exported with its KV cache as compiler/generate.py does (issue 40
// §2): the prompt in one run with an empty cache (past = 0), then one token a run, each run's present.* outputs the
// next run's past_key_values.* inputs. The cache never leaves wasm memory: before a step, each present output's rows
// the last step added are copied into its past input's slot inside the memory (WasmExecutor.stepNow), the step writes
// only the token ids, the mask and the positions, and reads only the last position's logits. Model.generate chooses the
// tokens (here or on the page of a worker-mode model, whose executor forwards each step), the executor runs the steps.

const PAST_PREFIX = "past_key_values.";
const PRESENT_PREFIX = "present.";
const GENERATE_OPTIONS = ["maxNewTokens", "temperature", "topK", "topP", "stopToken", "seed", "onToken"];
const LOGITS_DTYPES = ["float32", "float16", "float64"];

// each manifest's cache layout (cacheLayout), once found
const layouts = new WeakMap();

/** Which inputs and outputs generate feeds, as positions in manifest order: {ids, mask, positions (-1: none), pairs
 * ([past input, present output]), logits, vocabulary}. A model that lacks one is a TesselError (code "generate")
 * saying what, in compiler/generate.py's cache_layout's words; so is one this runtime cannot step (fixed shapes, a
 * cache not [1, heads, past, depth], a present output unlike its past input). */
function cacheLayout(manifest) {
  if (!layouts.has(manifest)) layouts.set(manifest, findCacheLayout(manifest));
  return layouts.get(manifest);
}

function findCacheLayout(manifest) {
  const inputs = manifest.inputs.map((spec) => spec.name);
  const outputs = manifest.outputs.map((spec) => spec.name);
  const ids = inputs.indexOf("input_ids");
  if (ids < 0) {
    fail(
      "generate",
      "input_ids",
      `generate needs a model that takes input_ids; this one takes ${inputs.join(", ")}. Export the decoder with its ` +
        "cache (past_key_values.* inputs, present.* outputs), as optimum or torch.onnx.export write it",
    );
  }
  const logits = outputs.indexOf("logits");
  if (logits < 0) fail("generate", "logits", `generate needs a model with a logits output; this one gives ${outputs.join(", ")}`);
  const pairs = [];
  inputs.forEach((name, input) => {
    if (!name.startsWith(PAST_PREFIX)) return;
    const present = PRESENT_PREFIX + name.slice(PAST_PREFIX.length);
    const output = outputs.indexOf(present);
    if (output < 0) fail("generate", name, `input "${name}" has no output "${present}" to take the next step's cache from`);
    pairs.push([input, output]);
  });
  if (pairs.length === 0) {
    fail(
      "generate",
      "past_key_values",
      "generate needs a decoder exported with its cache (past_key_values.* inputs, present.* outputs); this model " +
        "recomputes the whole prompt each step: export it with use_cache=True",
    );
  }
  const known = new Set(["input_ids", "attention_mask", "position_ids", ...pairs.map(([input]) => inputs[input])]);
  const unknown = inputs.filter((name) => !known.has(name)).sort(byCodePoint);
  if (unknown.length) fail("generate", unknown[0], `generate does not know what to feed the inputs ${unknown.join(", ")}`);
  if (!planOf(manifest)) {
    fail(
      "generate",
      "sizes",
      "generate needs a model compiled with symbolic sizes, its cache's from 0 (dims={\"past\": (0, 2047), \"seq\": " +
        "(1, 2048), \"total\": \"past+seq\"}, docs/symbolic.md); this one's shapes are fixed, so its cache cannot grow",
    );
  }
  for (const [input, output] of pairs) {
    const [past, present] = [manifest.inputs[input], manifest.outputs[output]];
    const [batch, heads, , depth] = past.shape;
    if (past.shape.length !== 4 || batch !== 1 || typeof heads !== "number" || typeof depth !== "number") {
      const shape = shapeText(past.shape);
      fail("generate", past.name, `the cache input "${past.name}" has shape ${shape}; generate takes [1, heads, past, depth]`);
    }
    const [, presentHeads, , presentDepth] = present.shape;
    const like = present.shape.length === 4 && presentHeads === heads && presentDepth === depth && present.dtype === past.dtype;
    if (!like || present.source) {
      fail(
        "generate",
        present.name,
        `the output "${present.name}" (${present.dtype} ${shapeText(present.shape)}) is not the next step's ` +
          `"${past.name}" (${past.dtype} ${shapeText(past.shape)}) with the step's rows: generate copies one into the other`,
      );
    }
  }
  const { shape, dtype, source } = manifest.outputs[logits];
  if (shape.length !== 3 || shape[0] !== 1 || typeof shape[2] !== "number" || !LOGITS_DTYPES.includes(dtype) || source) {
    const gives = `${dtype} ${shapeText(shape)}`;
    fail("generate", "logits", `generate takes logits of shape [1, seq, vocabulary] (floats); this model gives ${gives}`);
  }
  const mask = inputs.indexOf("attention_mask");
  const positions = inputs.indexOf("position_ids");
  for (const position of [ids, mask, positions]) {
    const spec = manifest.inputs[position];
    const numbers = position === mask || /^u?int/.test(spec?.dtype);
    if (spec && (spec.shape.length !== 2 || spec.shape[0] !== 1 || !numbers)) {
      const takes = `${spec.dtype} ${shapeText(spec.shape)}`;
      fail("generate", spec.name, `generate feeds "${spec.name}" as [1, n] integers; this model takes ${takes}`);
    }
  }
  return { ids, mask, positions, pairs, logits, vocabulary: shape[2] };
}

/** Each input's dims in a step of `seq` token ids after `past` cached ones, in manifest order (for bindSizes). */
function stepShapes(manifest, layout, seq, past) {
  const shapes = [];
  shapes[layout.ids] = [1, seq];
  if (layout.mask >= 0) shapes[layout.mask] = [1, past + seq];
  if (layout.positions >= 0) shapes[layout.positions] = [1, seq];
  for (const [input] of layout.pairs) {
    const [, heads, , depth] = manifest.inputs[input].shape;
    shapes[input] = [1, heads, past, depth];
  }
  return shapes;
}

/** A typed array of `dtype`, as the executors store it (float16 as its bits), holding valueAt(0), ..., valueAt(length - 1). */
function typedValues(dtype, length, valueAt) {
  if (dtype === "float16") return float32ToFloat16Bits(Float32Array.from({ length }, (_, at) => valueAt(at)));
  const Type = TYPED_ARRAYS[dtype];
  const big = Type === BigInt64Array || Type === BigUint64Array;
  return Type.from({ length }, (_, at) => (big ? BigInt(valueAt(at)) : valueAt(at)));
}

// how a value is named in an error: a number or string as written, anything else by its kind
function shown(value) {
  if (typeof value === "string") return JSON.stringify(value);
  return typeof value === "object" || typeof value === "function" ? kindOf(value) : String(value);
}

/** generate's options after compiler/generate.py's check_options (with the same words, in camelCase) and the checks of
 * what it leaves to Python (an unknown option, the seed, stopToken, onToken): a TesselError (code "options") naming
 * the option. */
function checkGenerateOptions(options) {
  if (options === null || typeof options !== "object") {
    fail("options", "maxNewTokens", `generate takes the options {${GENERATE_OPTIONS.join(", ")}}, got ${shown(options)}`);
  }
  for (const key of Object.keys(options)) {
    if (!GENERATE_OPTIONS.includes(key)) fail("options", key, `unknown option "${key}"; generate takes ${GENERATE_OPTIONS.join(", ")}`);
  }
  const given = (value) => value !== undefined && value !== null;
  const { maxNewTokens, temperature = 0, topK, topP, stopToken, seed, onToken } = options;
  if (maxNewTokens === undefined) {
    fail("options", "maxNewTokens", "generate needs maxNewTokens, the most tokens to generate (a whole number >= 0)");
  }
  if (!Number.isSafeInteger(maxNewTokens) || maxNewTokens < 0) {
    fail("options", "maxNewTokens", `maxNewTokens must be a whole number >= 0, got ${shown(maxNewTokens)}`);
  }
  if (typeof temperature !== "number" || !(temperature >= 0)) {
    fail("options", "temperature", `temperature must be >= 0 (0: greedy), got ${shown(temperature)}`);
  }
  if (given(topK) && (!Number.isSafeInteger(topK) || topK < 1)) {
    fail("options", "topK", `topK must be a whole number >= 1, got ${shown(topK)}`);
  }
  if (given(topP) && (typeof topP !== "number" || !(topP > 0 && topP <= 1))) {
    fail("options", "topP", `topP must lie in (0, 1], got ${shown(topP)}`);
  }
  if (given(stopToken) && !Number.isSafeInteger(stopToken)) {
    fail("options", "stopToken", `stopToken must be a token id (a whole number), got ${shown(stopToken)}`);
  }
  if (given(seed) && (!Number.isSafeInteger(seed) || seed < 0)) {
    fail("options", "seed", `seed must be a whole number >= 0, got ${shown(seed)}`);
  }
  if (given(onToken) && typeof onToken !== "function") {
    fail("options", "onToken", `onToken must be a function, called with each token as it is chosen; got ${shown(onToken)}`);
  }
  const or = (value) => (given(value) ? value : undefined);
  return { maxNewTokens, temperature, topK: or(topK), topP: or(topP), stopToken: or(stopToken), seed: or(seed), onToken: or(onToken) };
}

/** The prompt's token ids as numbers: an array or typed array of whole numbers (or [1, n]: one such row). */
function promptIds(prompt) {
  const row = Array.isArray(prompt) && prompt.length === 1 && (Array.isArray(prompt[0]) || ArrayBuffer.isView(prompt[0]));
  const given = row ? prompt[0] : prompt;
  const listed = Array.isArray(given) || (ArrayBuffer.isView(given) && !(given instanceof DataView));
  const ids = listed ? Array.from(given, (value) => (typeof value === "bigint" ? Number(value) : value)) : [];
  const bad = ids.findIndex((value) => !Number.isSafeInteger(value));
  if (!listed || ids.length === 0 || bad >= 0) {
    const got = !listed ? shown(prompt) : ids.length === 0 ? "an empty one" : `one holding ${shown(given[bad])} at ${bad}`;
    fail("input", "prompt", `the prompt must be a non-empty array of token ids (whole numbers), got ${got}`);
  }
  return ids;
}

/** SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014): a function giving
 * numbers in [0, 1) of 53 random bits, the same ones for the same seed (a random seed where none is given). */
function randomNumbers(seed) {
  let state = BigInt(seed ?? Math.floor(Math.random() * 2 ** 53));
  return () => {
    state = BigInt.asUintN(64, state + 0x9e3779b97f4a7c15n);
    let mixed = BigInt.asUintN(64, (state ^ (state >> 30n)) * 0xbf58476d1ce4e5b9n);
    mixed = BigInt.asUintN(64, (mixed ^ (mixed >> 27n)) * 0x94d049bb133111ebn);
    return Number((mixed ^ (mixed >> 31n)) >> 11n) / 2 ** 53;
  };
}

/** The next token from one position's logits, as compiler/generate.py's choose_token: the most likely (the first of
 * equals) at temperature 0; else drawn by `random` from the softmax of logits / temperature over the topK most likely
 * tokens (those equal to the k-th kept too), then over the fewest, most likely first, whose probabilities reach topP. */
function chooseToken(logits, temperature, topK, topP, random) {
  const count = logits.length;
  if (temperature === 0) {
    let best = 0;
    for (let token = 1; token < count; token++) if (logits[token] > logits[best]) best = token;
    return best;
  }
  const scaled = Float64Array.from(logits, (value) => value / temperature);
  if (topK !== undefined && topK < count) {
    const threshold = Float64Array.from(scaled).sort()[count - topK];
    for (let token = 0; token < count; token++) if (!(scaled[token] >= threshold)) scaled[token] = -Infinity;
  }
  const largest = scaled.reduce((high, value) => Math.max(high, value), -Infinity);
  let probabilities = scaled.map((value) => Math.exp(value - largest));
  const normalize = (values) => {
    const sum = values.reduce((total, value) => total + value, 0);
    return values.map((value) => value / sum);
  };
  probabilities = normalize(probabilities);
  if (topP !== undefined && topP < 1) {
    const order = [];
    for (let token = 0; token < count; token++) if (probabilities[token] > 0) order.push(token);
    order.sort((left, right) => probabilities[right] - probabilities[left] || left - right);
    const kept = new Float64Array(count);
    let cumulative = 0;
    for (const token of order) {
      kept[token] = probabilities[token];
      cumulative += probabilities[token];
      if (cumulative >= topP) break;
    }
    probabilities = normalize(kept);
  }
  const drawn = random();
  let cumulative = 0;
  let last = 0;
  for (let token = 0; token < count; token++) {
    if (!(probabilities[token] > 0)) continue;
    cumulative += probabilities[token];
    last = token;
    if (drawn < cumulative) return token;
  }
  return last; // a sum rounded below the draw
}

/** Resolves in a later task, so that a page draws and handles its events between two steps of generate: a
 * MessageChannel message in a page (scheduler.yield()'s continuation ran ahead of clicks and frames in Chromium, so a
 * Stop button waited for the whole generation), setImmediate in Node. */
function nextTask() {
  if (typeof setImmediate === "function") return new Promise((resolve) => setImmediate(resolve));
  if (typeof MessageChannel === "function") {
    const { port1, port2 } = new MessageChannel();
    return new Promise((resolve) => {
      port1.onmessage = () => {
        port1.close();
        resolve();
      };
      port2.postMessage(null);
    });
  }
  return new Promise((resolve) => setTimeout(resolve, 0));
}

// numbers each generate, so that a step can tell that the cache it continues is its own
let generations = 0;

// ---- the model -----------------------------------------------------------------------------------------

function describeSpec(spec) {
  return { name: spec.name, shape: [...spec.shape], dtype: spec.dtype };
}

/** A loaded bundle; create it with load(). */
export class Model {
  constructor(manifest, backend, executor, backendReason = "") {
    this.manifest = manifest;
    this.backend = backend;
    // why this backend runs the model: "asked for wasm", "auto chose wasm: ..., passing over webgpu (...)"
    this.backendReason = executor.adapter ? `${backendReason} (adapter: ${executor.adapter})` : backendReason;
    this.executor = executor;
    // what the backend runs: for wasm {code, features, threads}, e.g. model.threads.wasm on 4 threads
    this.variant = executor.variant || null;
    this.inputs = manifest.inputs.map(describeSpec);
    this.outputs = manifest.outputs.map(describeSpec);
    // a symbolic model's sizes (manifest.sizes): the inputs' and outputs' shapes name them; [] for a static model
    this.sizes = (manifest.sizes || []).map(({ name, min, max }) => ({ name, min, max }));
  }

  get inputNames() {
    return this.inputs.map((spec) => spec.name);
  }

  get outputNames() {
    return this.outputs.map((spec) => spec.name);
  }

  /** Run once: feeds map each input name to a typed array or {data, dims}; returns {name: {data, dims, dtype}}. */
  async run(feeds) {
    if (!this.executor) fail("disposed", null, "this model was disposed; load the bundle again");
    const plan = planOf(this.manifest);
    if (plan) {
      const { arrays, sizes } = checkFeeds(feeds, this.manifest.inputs, plan);
      const results = await this.executor.run(arrays, sizes);
      return Object.fromEntries(
        this.outputs.map(({ name, dtype }, position) => {
          const dims = plan.outputs[position].dims.map((dim) => dimValue(dim, sizes));
          return [name, { data: results[position], dims, dtype }];
        }),
      );
    }
    const arrays = checkFeeds(feeds, this.manifest.inputs);
    const results = await this.executor.run(arrays);
    return Object.fromEntries(
      this.outputs.map((spec, position) => [
        spec.name,
        { data: results[position], dims: [...spec.shape], dtype: spec.dtype },
      ]),
    );
  }

  /**
   * The token ids (numbers) a decoder exported with its KV cache generates after `prompt` (token ids), at most
   * options.maxNewTokens, as compiler/generate.py's generate: the prompt in one run, then one token a run, the cache
   * kept in wasm memory. options: temperature (0, the default: greedy), topK, topP, stopToken (ends the run after it),
   * seed (the same draws every call), onToken(token) (awaited as each token is chosen). The loop yields to the event
   * loop between steps.
   */
  async generate(prompt, options) {
    if (!this.executor) fail("disposed", null, "this model was disposed; load the bundle again");
    if (typeof this.executor.step !== "function") {
      const why =
        this.backend === "webgpu"
          ? "a decoder's cache needs symbolic sizes, which run on wasm only, and WebGPU runs fixed shapes"
          : `the ${this.backend} backend's executor has no step()`;
      fail("backend", this.backend, `generate runs on the wasm backend: ${why}; load the model with backend: "wasm"`);
    }
    const { manifest } = this;
    const layout = cacheLayout(manifest);
    const { maxNewTokens, temperature, topK, topP, stopToken, seed, onToken } = checkGenerateOptions(options);
    const ids = promptIds(prompt);
    const plan = planOf(manifest);
    const random = temperature > 0 ? randomNumbers(seed) : null;
    const generation = (generations += 1);
    const tokens = [];
    let [stepIds, past] = [ids, 0];
    while (tokens.length < maxNewTokens) {
      if (!this.executor) fail("disposed", null, "this model was disposed during generate; load the bundle again");
      let sizes;
      try {
        sizes = bindSizes(plan, manifest.inputs, stepShapes(manifest, layout, stepIds.length, past));
      } catch (error) {
        if (past === 0 || !(error instanceof TesselError)) throw error;
        const why = error.message.replace(/^tessel: /, "");
        const cached = `caching ${past} tokens (the prompt's ${ids.length} and ${past - ids.length} generated)`;
        const message = `generate stopped after ${tokens.length} new tokens: ${cached} is past the model's range: ${why}`;
        throw new TesselError(error.code, error.field, message);
      }
      const logits = await this.executor.step({ generation, ids: stepIds, past, sizes });
      const token = chooseToken(logits, temperature, topK, topP, random);
      tokens.push(token);
      if (onToken) await onToken(token);
      if (token === stopToken) break;
      [stepIds, past] = [[token], past + stepIds.length];
      if (tokens.length < maxNewTokens) await nextTask();
    }
    return tokens;
  }

  /** Make the backend's device state again, e.g. after a lost WebGPU device (run rejects saying so). */
  async reload() {
    if (!this.executor) fail("disposed", null, "this model was disposed; load the bundle again");
    if (this.executor.reload) await this.executor.reload();
  }

  /** Release the backend's memory; the model cannot run afterwards. */
  dispose() {
    if (this.executor) this.executor.dispose();
    this.executor = null;
  }
}

// A bundle set's URLs are relative to its file, which is a URL in a browser and may be a path in Node.
function resolveAgainst(relative, file) {
  const scheme = /^[a-z][a-z0-9+.-]*:/i;
  if (scheme.test(file)) return new URL(relative, file).href;
  if (scheme.test(relative) || relative.startsWith("/")) return relative;
  return file.slice(0, file.lastIndexOf("/") + 1) + relative;
}

async function readManifest(source, onProgress) {
  reportProgress(onProgress, "manifest", 0, 1);
  const text = await source.text("manifest.json");
  let manifest;
  try {
    manifest = JSON.parse(text);
  } catch (error) {
    fail("manifest", "manifest.json", `manifest.json is not JSON (${error.message}); export the model again`);
  }
  checkManifest(manifest);
  bindings.set(manifest, await bindingDigest(text));
  reportProgress(onProgress, "manifest", 1, 1);
  return manifest;
}

/**
 * What load() was given, as a function from a backend's name to the {manifest, source} of the bundle it would run.
 * A bundle set is {bundles: {webgpu: url, wasm: url}} or the URL of a .json file holding it (its URLs relative to
 * the file): the same model compiled for several backends, so that the one chosen runs its own bundle. Manifests
 * are read when a backend is considered, so a page that takes WebGPU never fetches the wasm bundle's.
 */
async function bundleCandidates(bundle, onProgress) {
  let set = bundle && typeof bundle === "object" && !(bundle instanceof URL) ? bundle : null;
  let file = typeof location === "object" ? location.href : undefined;
  const text = bundle instanceof URL ? bundle.href : String(bundle);
  if (!set && /\.json$/i.test(text)) {
    file = file ? new URL(text, file).href : text;
    const name = file.slice(file.lastIndexOf("/") + 1);
    const source = await openSource(resolveAgainst("./", file));
    try {
      set = JSON.parse(await source.text(name));
    } catch (error) {
      if (error instanceof SyntaxError) fail("manifest", name, `the bundle set ${name} is not JSON (${error.message})`);
      throw error;
    }
  }
  if (!set) {
    const source = await openSource(bundle);
    const manifest = await readManifest(source, onProgress);
    return async () => ({ manifest, source });
  }
  if (!set.bundles || typeof set.bundles !== "object") {
    fail("manifest", "bundles", 'a bundle set is {bundles: {webgpu: "<url>", wasm: "<url>"}}; see docs/web.md');
  }
  const loaded = new Map();
  return (name) => {
    const url = set.bundles[name];
    if (typeof url !== "string") return null;
    if (!loaded.has(name)) {
      loaded.set(
        name,
        (async () => {
          const source = await openSource(file ? resolveAgainst(url, file) : url);
          return { manifest: await readManifest(source, onProgress), source };
        })(),
      );
    }
    return loaded.get(name);
  };
}

/**
 * Load a bundle directory: an http(s) or relative URL in a browser, a path or file: URL in Node; or a bundle set
 * (the URL of its .json, or the object itself), of which the chosen backend's bundle is loaded.
 * options.backend: "auto" (default), "wasm" or "webgpu"; options.onProgress({phase, loaded, total}) is called
 * as the manifest, code and params arrive (phase "manifest", "code", "params", then "ready").
 * model.backend names the backend chosen and model.backendReason says why.
 * options.threads: wasm threads for a bundle with a threaded variant (default: the cores, at most 4; one, with a
 * console.warn, in a page that is not cross-origin isolated); options.relaxedSimd: false keeps to plain SIMD.
 * options.cache: "default" (read and fill the cache of code and params), "reload" (fill it only) or "none".
 * options.worker: true runs the model in a dedicated worker (a browser's), with the same API; or the URL of the
 * tessel.js the worker starts, where import.meta.url is not it (an app bundled into one file).
 */
export async function load(bundleUrl, options = {}) {
  const { backend = "auto", onProgress, threads, relaxedSimd, cache = "default", worker } = options;
  if (!CACHE_MODES.includes(cache)) fail("options", "cache", `cache must be one of ${CACHE_MODES.join(", ")}, got ${JSON.stringify(cache)}`);
  if (worker) return loadInWorker(bundleUrl, options);
  const candidates = await bundleCandidates(bundleUrl, onProgress);
  const { backend: chosen, manifest, source, reason } = await chooseBackend(candidates, backend);
  const files = cachedSource(source, manifest, cache);
  const executor = await chosen.create(manifest, files, { onProgress, threads, relaxedSimd });
  reportProgress(onProgress, "ready", 1, 1);
  return new Model(manifest, chosen.name, executor, reason);
}

// ---- worker mode: the model in a dedicated worker ------------------------------------------------------------------
//
// load(url, {worker: true}) starts this module as a module worker named WORKER_NAME, which loads the bundle itself
// (its cache, threads and checks as on the page) and runs it; the page keeps a Model whose executor posts the checked
// inputs (copied: the caller keeps them) and gets the outputs back transferred, not copied. generate chooses its tokens
// on the page and posts each step (its ids, past and sizes), which gets the last logits row back: the cache stays in
// the worker's wasm memory. Errors come back as TesselError with their code and field. dispose() terminates the worker.
const WORKER_NAME = "tessel-runtime";

function serveInWorker() {
  let model = null;
  globalThis.onmessage = async ({ data }) => {
    const { id, op } = data;
    try {
      if (op === "load") {
        const onProgress = data.progress ? (progress) => postMessage({ id, progress }) : undefined;
        model = await load(data.bundle, { ...data.options, onProgress });
        const { manifest, backend, backendReason, variant } = model;
        const steps = typeof model.executor.step === "function";
        postMessage({ id, result: { manifest, backend, backendReason, variant, steps } });
      } else if (op === "run") {
        const results = await model.executor.run(data.arrays, data.sizes);
        postMessage({ id, result: results }, [...new Set(results.map((array) => array.buffer))]);
      } else if (op === "step") {
        const logits = await model.executor.step(data.request);
        postMessage({ id, result: logits }, [logits.buffer]);
      } else {
        postMessage({ id, result: await model.reload() });
      }
    } catch (error) {
      const { code, field, message } = error;
      postMessage({ id, error: { code, field, message, tessel: error instanceof TesselError } });
    }
  };
}

async function loadInWorker(bundle, options) {
  if (isNode() || typeof Worker !== "function") {
    fail("options", "worker", "worker mode needs Web Workers (a browser); in Node, load the model in a worker_threads worker");
  }
  const script = new URL(options.worker === true ? import.meta.url : String(options.worker), location.href).href;
  // the worker's URLs are relative to the script, so the page's are made absolute here
  const absolute = (url) => (url instanceof URL || typeof url === "string" ? new URL(url, location.href).href : url);
  const set = bundle && typeof bundle === "object" && !(bundle instanceof URL) && bundle.bundles;
  const target = set ? { bundles: Object.fromEntries(Object.entries(set).map(([name, url]) => [name, absolute(url)])) } : absolute(bundle);
  const worker = new Worker(script, { type: "module", name: WORKER_NAME });
  const pending = new Map();
  let next = 0;
  let broken = null;
  const settleAll = (error) => {
    broken = error;
    for (const { reject } of pending.values()) reject(error);
    pending.clear();
  };
  worker.onmessage = ({ data }) => {
    const waiting = pending.get(data.id);
    if (!waiting) return;
    if (data.progress) return reportProgress(options.onProgress, data.progress.phase, data.progress.loaded, data.progress.total);
    pending.delete(data.id);
    const { error } = data;
    if (!error) waiting.resolve(data.result);
    else waiting.reject(error.tessel ? new TesselError(error.code, error.field, error.message) : new Error(error.message));
  };
  worker.onerror = (event) => {
    event.preventDefault();
    settleAll(new TesselError("backend", "worker", `the model's worker failed: ${event.message || `${script} did not start as a module worker`}`));
  };
  const call = (op, message) =>
    broken
      ? Promise.reject(broken)
      : new Promise((resolve, reject) => {
          const id = next++;
          pending.set(id, { resolve, reject });
          worker.postMessage({ id, op, ...message });
        });
  const { onProgress, worker: _, ...rest } = options;
  let info;
  try {
    info = await call("load", { bundle: target, options: rest, progress: Boolean(onProgress) });
  } catch (error) {
    worker.terminate();
    throw error;
  }
  const executor = {
    variant: info.variant,
    run: (arrays, sizes) => call("run", { arrays, sizes }),
    // generate's steps: the tokens are chosen on the page, the cache stays in the worker's wasm memory
    ...(info.steps ? { step: (request) => call("step", { request }) } : {}),
    reload: () => call("reload", {}),
    dispose() {
      worker.terminate();
      settleAll(new TesselError("disposed", null, "this model was disposed; load the bundle again"));
    },
  };
  return new Model(info.manifest, info.backend, executor, info.backendReason);
}

if (typeof WorkerGlobalScope === "function" && globalThis instanceof WorkerGlobalScope && globalThis.name === WORKER_NAME) {
  serveInWorker();
}
