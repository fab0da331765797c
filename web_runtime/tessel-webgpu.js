// Tessel's WebGPU executor: the browser's end of the webgpu target. tessel.js imports this module only when it
// chooses WebGPU, so wasm-only pages never download it. It runs a bundle (manifest.json, kernels.wgsl, params.bin)
// from its manifest alone, as compiler/runtime/webgpu.py does in Python: nothing here knows the compiler's IR.
//
// At load: one storage buffer per region of manifest.webgpu.buffers (params streamed straight into its mapped
// buffer; an input or output with an arena_offset lives in the arena there), one uniform buffer holding every
// dispatch's element offsets, a bind group layout and an asynchronously created pipeline per entry point, a bind
// group per dispatch. A run: the inputs written, one command encoder with every dispatch and the outputs' copies
// into one readback buffer, one map.

import { TesselError, checkSeal } from "./tessel.js";

// The spec's default limits (https://www.w3.org/TR/webgpu/#limit-default): a device gets these unless it asks for
// more, so a bundle needing more names them in requestDevice's requiredLimits.
const DEFAULT_LIMITS = {
  maxStorageBuffersPerShaderStage: 8,
  maxUniformBuffersPerShaderStage: 12,
  maxComputeInvocationsPerWorkgroup: 256,
  maxComputeWorkgroupSizeX: 256,
  maxComputeWorkgroupSizeY: 256,
  maxComputeWorkgroupSizeZ: 64,
  maxComputeWorkgroupsPerDimension: 65535,
  maxComputeWorkgroupStorageSize: 16384,
  maxStorageBufferBindingSize: 134217728,
  maxBufferSize: 268435456,
  maxBindGroups: 4,
  maxBindingsPerBindGroup: 1000,
};
const READBACK_ALIGNMENT = 256;
const BINDING_LINE = "// tessel_manifest_digest ";

const roundUp = (value, multiple) => Math.ceil(value / multiple) * multiple;
// A WebGPU buffer, a binding and a copy are whole 4-byte words and never empty.
const wordBytes = (bytes) => roundUp(Math.max(bytes, 4), 4);

function invalid(what, field = "webgpu") {
  throw new TesselError("manifest", field, `manifest.json is not a valid WebGPU manifest: ${what}; export the model again`);
}

/** The WebGPU parts of a manifest, checked before anything is sized from them: every dispatch names a known entry
 * point and known buffers, and its element offsets fit in the uniform. */
export function checkWebGPUManifest(manifest) {
  const webgpu = manifest.webgpu;
  if (!webgpu || typeof webgpu !== "object") invalid("it has no webgpu section");
  const isCount = (value) => Number.isSafeInteger(value) && value >= 0;
  if (!Array.isArray(webgpu.entries) || !Array.isArray(webgpu.buffers)) invalid("webgpu.entries and webgpu.buffers must be lists");
  if (!isCount(webgpu.uniform_bytes)) invalid("webgpu.uniform_bytes must be a whole number");
  const entries = new Map();
  for (const entry of webgpu.entries) {
    if (!entry || typeof entry.name !== "string" || !Array.isArray(entry.regions) || !Array.isArray(entry.grid)) {
      invalid("each of webgpu.entries needs a name, regions and a grid");
    }
    if (entry.grid.length !== 3 || !entry.grid.every((size) => isCount(size) && size > 0)) {
      invalid(`entry ${entry.name} has grid ${JSON.stringify(entry.grid)}, not three positive whole numbers`);
    }
    for (const region of entry.regions) {
      if (!isCount(region.binding) || !["read", "read_write"].includes(region.access)) {
        invalid(`entry ${entry.name} has a region without a binding number or with access ${region.access}`);
      }
    }
    entries.set(entry.name, entry);
  }
  const buffers = new Set();
  const arena = webgpu.buffers.find((buffer) => buffer && buffer.region === "arena" && buffer.index === 0);
  for (const buffer of webgpu.buffers) {
    if (!buffer || typeof buffer.region !== "string" || !isCount(buffer.index) || !isCount(buffer.bytes)) {
      invalid("each of webgpu.buffers needs a region, an index and a size in bytes");
    }
    if (buffer.arena_offset === undefined) {
      buffers.add(`${buffer.region}:${buffer.index}`);
    } else if (!isCount(buffer.arena_offset) || buffer.arena_offset % 4 || !arena || buffer.arena_offset + buffer.bytes > arena.bytes) {
      invalid(`${buffer.region} ${buffer.index} is placed at ${buffer.arena_offset} of the arena, not a whole word inside it`);
    }
  }
  if (!Array.isArray(manifest.dispatches)) invalid("dispatches must be a list");
  manifest.dispatches.forEach((dispatch, position) => {
    const entry = entries.get(dispatch && dispatch.entry);
    if (!entry) invalid(`dispatch ${position} names entry point ${dispatch && dispatch.entry}, which webgpu.entries lacks`);
    if (!Array.isArray(dispatch.regions) || dispatch.regions.length !== entry.regions.length) {
      invalid(`dispatch ${position} binds ${dispatch.regions && dispatch.regions.length} regions, entry ${entry.name} has ${entry.regions.length}`);
    }
    for (const region of dispatch.regions) {
      if (!buffers.has(`${region.region}:${region.index}`)) {
        invalid(`dispatch ${position} binds ${region.region} ${region.index}, which webgpu.buffers lacks`);
      }
    }
    if (entry.offsets_binding != null) {
      const words = dispatch.element_offsets;
      if (!Array.isArray(words) || !words.every(Number.isSafeInteger) || 4 * words.length > entry.offsets_bytes) {
        invalid(`dispatch ${position}'s element_offsets do not fit entry ${entry.name}'s ${entry.offsets_bytes} bytes`);
      }
      if (!isCount(dispatch.uniform_offset) || dispatch.uniform_offset + entry.offsets_bytes > webgpu.uniform_bytes) {
        invalid(`dispatch ${position}'s uniform_offset lies outside webgpu.uniform_bytes`);
      }
    }
  });
  return entries;
}

function adapterName(adapter) {
  const info = adapter.info || {};
  return [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "unnamed adapter";
}

/** The limits above the spec's defaults that the bundle needs, for requestDevice (the rest come by default). */
export function requiredLimits(manifest) {
  const needed = {};
  for (const [limit, value] of Object.entries((manifest.webgpu && manifest.webgpu.limits) || {})) {
    if (limit in DEFAULT_LIMITS && value > DEFAULT_LIMITS[limit]) needed[limit] = value;
  }
  return needed;
}

class DeviceLost extends TesselError {}

/** Runs one WebGPU bundle on one device; made by createExecutor, remade on a new device by reload(). */
class WebGPUExecutor {
  constructor(manifest, source, typedArrays, options) {
    this.manifest = manifest;
    this.source = source;
    this.typedArrays = typedArrays;
    this.options = options;
    this.entries = checkWebGPUManifest(manifest);
    this.queueTail = Promise.resolve();
  }

  async load() {
    const { manifest } = this;
    const gpu = navigator.gpu;
    const adapter = await gpu.requestAdapter();
    if (!adapter) throw new TesselError("device", "adapter", 'WebGPU gave no adapter on this machine; load the bundle with {backend: "wasm"}');
    this.adapter = adapterName(adapter);
    let device;
    try {
      device = await adapter.requestDevice({
        requiredLimits: requiredLimits(manifest),
        requiredFeatures: manifest.webgpu.features || [],
      });
    } catch (error) {
      throw new TesselError("device", "device", `the WebGPU adapter (${this.adapter}) refused a device for this bundle: ${error.message}`);
    }
    this.device = device;
    this.options.mark("device-ready");
    this.lostInfo = null;
    // A lost device (driver reset, tab backgrounded on some systems, device.destroy()) must fail a pending or later
    // run at once: a map that never resolves would hang the page.
    this.lost = device.lost.then((info) => {
      if (this.device !== device) return new DeviceLost("device", "device", "superseded");
      this.lostInfo = info;
      return new DeviceLost(
        "device",
        "device",
        `tessel: the WebGPU device was lost (${info.reason || "unknown"}: ${info.message || "no message"}); ` +
          "call model.reload() to make the device again, or load the bundle again",
      );
    });
    const { settle, checkDigest } = this.options;
    const read = async () => {
      const code = await this.source.text(manifest.code);
      const bytes = new TextEncoder().encode(code);
      await checkDigest(manifest, manifest.code, bytes);
      return { code, bytes };
    };
    const { code, bytes } = await settle(this.source, manifest.code, read(), read);
    await checkSeal(manifest.code, bytes, "text");
    // the first line names the binding digest of the manifest the code was generated for (compiler/backends.py)
    if (this.options.binding && code.slice(0, code.indexOf("\n")) !== BINDING_LINE + this.options.binding) {
      throw new TesselError(
        "binding",
        manifest.code,
        `${manifest.code} was not generated for this manifest.json (its binding digest differs: the manifest or the ` +
          "code was edited or swapped); export the model again",
      );
    }
    this.options.mark("code-in");
    // Pipelines compile while params.bin downloads: the page keeps running meanwhile.
    const pipelines = this.createPipelines(code);
    const buffers = this.createBuffers();
    await Promise.all([pipelines, buffers]);
    this.createBindGroups();
  }

  async createPipelines(code) {
    const { device } = this;
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code });
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((message) => message.type === "error");
    const scopeError = await device.popErrorScope();
    if (errors.length || scopeError) {
      const first = errors.length ? `line ${errors[0].lineNum}: ${errors[0].message}` : scopeError.message;
      throw new TesselError("code", this.manifest.code, `this browser's WebGPU refused ${this.manifest.code} (${first}); export the bundle again`);
    }
    this.layouts = new Map();
    const created = [...this.entries.values()].map(async (entry) => {
      const layout = device.createBindGroupLayout({
        entries: [
          ...entry.regions.map((region) => ({
            binding: region.binding,
            visibility: GPUShaderStage.COMPUTE,
            buffer: { type: region.access === "read" ? "read-only-storage" : "storage" },
          })),
          ...(entry.offsets_binding == null
            ? []
            : [{ binding: entry.offsets_binding, visibility: GPUShaderStage.COMPUTE, buffer: { type: "uniform" } }]),
          ...(entry.status_binding == null
            ? []
            : [{ binding: entry.status_binding, visibility: GPUShaderStage.COMPUTE, buffer: { type: "storage" } }]),
        ],
      });
      this.layouts.set(entry.name, layout);
      const pipeline = await device.createComputePipelineAsync({
        layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
        compute: { module, entryPoint: entry.name },
      });
      return [entry.name, pipeline];
    });
    try {
      this.pipelines = new Map(await Promise.all(created));
      this.options.mark("pipelines-ready");
    } catch (error) {
      throw new TesselError("code", this.manifest.code, `this browser's WebGPU cannot make a pipeline for ${this.manifest.code}: ${error.message}`);
    }
  }

  async createBuffers() {
    const { device, manifest } = this;
    const storage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    this.buffers = new Map();
    this.sizes = new Map();
    // an input or output the bundle placed in the arena: its byte offset there (compiler/backends.py)
    this.inArena = new Map();
    let params = null;
    for (const { region, index, bytes, arena_offset: arenaOffset } of manifest.webgpu.buffers) {
      if (arenaOffset !== undefined) {
        this.inArena.set(`${region}:${index}`, arenaOffset);
        continue;
      }
      const isParams = region === "params" && index === 0;
      const buffer = device.createBuffer({ size: wordBytes(bytes), usage: storage, mappedAtCreation: isParams });
      if (isParams) params = buffer;
      this.buffers.set(`${region}:${index}`, buffer);
      this.sizes.set(`${region}:${index}`, wordBytes(bytes));
    }
    const uniform = new ArrayBuffer(wordBytes(manifest.webgpu.uniform_bytes));
    for (const dispatch of manifest.dispatches) {
      if (this.entries.get(dispatch.entry).offsets_binding == null) continue;
      // the element offsets, then the call number (from 1) that a failed index check records in the status word
      const words = [...dispatch.element_offsets, dispatch.call + 1];
      new Int32Array(uniform, dispatch.uniform_offset, words.length).set(words);
    }
    this.status = device.createBuffer({ size: 4, usage: storage });
    this.uniform = device.createBuffer({ size: uniform.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    device.queue.writeBuffer(this.uniform, 0, uniform);
    // Outputs land in one readback buffer at 256-byte aligned offsets, so a run maps once.
    let total = 0;
    this.readbackOffsets = manifest.outputs.map((spec) => {
      const offset = total;
      total += roundUp(wordBytes(this.byteSize(spec)), READBACK_ALIGNMENT);
      return offset;
    });
    this.statusOffset = total;
    this.readback = device.createBuffer({ size: total + 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    if (params) await this.streamParams(params);
  }

  // params.bin goes from the network or the cache straight into the mapped buffer, hashed piece by piece as it
  // arrives (tessel.js's copyParams): no second copy of the weights in JS memory, and one hash of a cached file.
  async streamParams(buffer) {
    const { manifest, source, options } = this;
    const name = manifest.params.file;
    const view = new Uint8Array(buffer.getMappedRange(), 0, manifest.params.bytes);
    const read = async () => {
      const { checked } = await options.copyParams(manifest, source.chunks(name), view, options.onProgress);
      options.mark("params-in");
      return checked;
    };
    try {
      await options.settle(source, name, read(), read);
    } finally {
      buffer.unmap();
    }
  }

  createBindGroups() {
    const { device } = this;
    this.steps = this.manifest.dispatches.map((dispatch) => {
      const entry = this.entries.get(dispatch.entry);
      const items = entry.regions.map((region, position) => {
        const key = `${dispatch.regions[position].region}:${dispatch.regions[position].index}`;
        return { binding: region.binding, resource: { buffer: this.buffers.get(key), offset: 0, size: this.sizes.get(key) } };
      });
      if (entry.offsets_binding != null) {
        const resource = { buffer: this.uniform, offset: dispatch.uniform_offset, size: entry.offsets_bytes };
        items.push({ binding: entry.offsets_binding, resource });
      }
      if (entry.status_binding != null) {
        items.push({ binding: entry.status_binding, resource: { buffer: this.status, offset: 0, size: 4 } });
      }
      const group = device.createBindGroup({ layout: this.layouts.get(entry.name), entries: items });
      return { pipeline: this.pipelines.get(entry.name), group, grid: entry.grid };
    });
  }

  // [buffer, byte offset] of an input or output: its own buffer, or the arena where the bundle placed it
  place(key) {
    return this.inArena.has(key) ? [this.buffers.get("arena:0"), this.inArena.get(key)] : [this.buffers.get(key), 0];
  }

  // bytes on the device: an int64 input or output is stored as int32 where the manifest says device_dtype
  byteSize(spec) {
    const dtype = spec.device_dtype || spec.dtype;
    return spec.shape.reduce((product, size) => product * size, 1) * this.typedArrays[dtype].BYTES_PER_ELEMENT;
  }

  // an int64 input (BigInt64Array) as the int32 array the device holds, refused by name when a value does not fit
  toDevice(array, spec) {
    if (!spec.device_dtype) return array;
    const narrow = new this.typedArrays[spec.device_dtype](array.length);
    array.forEach((value, position) => {
      if (value < -2147483648n || value > 2147483647n) {
        throw new TesselError("input", spec.name, `input '${spec.name}' holds int64 values outside int32's range, which webgpu stores it in`);
      }
      narrow[position] = Number(value);
    });
    return narrow;
  }

  /** Runs are queued one after another: they share the device buffers and the one readback buffer. */
  run(arrays) {
    const result = this.queueTail.then(() => this.runNow(arrays));
    this.queueTail = result.catch(() => {});
    return result;
  }

  async runNow(arrays) {
    if (!this.device) throw new TesselError("disposed", null, "this model was disposed; load the bundle again");
    if (this.lostInfo) throw await this.lost;
    const { device, manifest } = this;
    arrays.forEach((given, position) => {
      const array = this.toDevice(given, manifest.inputs[position]);
      if (!array.byteLength) return;
      const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
      // writeBuffer takes whole words; an odd-sized input (bool, int8) is padded.
      const data = bytes.byteLength % 4 ? copyPadded(bytes) : bytes;
      device.queue.writeBuffer(...this.place(`input:${position}`), data);
    });
    device.queue.writeBuffer(this.status, 0, new Uint32Array(1));
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const { pipeline, group, grid } of this.steps) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(grid[0], grid[1], grid[2]);
    }
    pass.end();
    manifest.outputs.forEach((spec, position) => {
      const from = spec.source;
      const size = wordBytes(this.byteSize(spec));
      if (!from) {
        encoder.copyBufferToBuffer(...this.place(`output:${position}`), this.readback, this.readbackOffsets[position], size);
      } else if (from.region === "params") {
        encoder.copyBufferToBuffer(this.buffers.get("params:0"), from.offset, this.readback, this.readbackOffsets[position], size);
      }
    });
    encoder.copyBufferToBuffer(this.status, 0, this.readback, this.statusOffset, 4);
    device.queue.submit([encoder.finish()]);
    const mapped = this.readback.mapAsync(GPUMapMode.READ);
    const outcome = await Promise.race([mapped.then(() => null), this.lost]);
    if (outcome instanceof Error) {
      mapped.catch(() => {});
      throw outcome;
    }
    let failed = 0;
    let results;
    try {
      const data = this.readback.getMappedRange();
      failed = new Uint32Array(data, this.statusOffset, 1)[0];
      results = manifest.outputs.map((spec, position) => {
        const start = this.readbackOffsets[position];
        const stored = new this.typedArrays[spec.device_dtype || spec.dtype](data.slice(start, start + this.byteSize(spec)));
        return spec.device_dtype ? this.typedArrays[spec.dtype].from(stored, (value) => BigInt(value)) : stored;
      });
    } finally {
      this.readback.unmap();
    }
    // the number (from 1) of a call whose index check failed, as compiler/runtime/webgpu.py reads it
    if (failed) throw new TesselError("run", manifest.calls[failed - 1]?.group ?? null, this.options.describeFailure(manifest, failed));
    // Outputs that are an input or another output passed straight through, as in compiler/build.py.
    manifest.outputs.forEach((spec, position) => {
      const from = spec.source;
      if (from && from.region !== "params") {
        results[position] = this.options.copyAs(this.typedArrays[spec.dtype], (from.region === "input" ? arrays : results)[from.index]);
      }
    });
    return results;
  }

  /** A new device, buffers and pipelines after a loss; params.bin and the code are fetched again. */
  async reload() {
    this.release();
    await this.load();
  }

  release() {
    const device = this.device;
    this.device = null;
    if (device) device.destroy();
  }

  dispose() {
    this.release();
  }
}

function copyPadded(bytes) {
  const padded = new Uint8Array(roundUp(bytes.byteLength, 4));
  padded.set(bytes);
  return padded;
}

/** The executor tessel.js's webgpu backend creates: {run(arrays), reload(), dispose(), adapter}. */
export async function createExecutor(manifest, source, typedArrays, options = {}) {
  const executor = new WebGPUExecutor(manifest, source, typedArrays, options);
  await executor.load();
  return executor;
}
