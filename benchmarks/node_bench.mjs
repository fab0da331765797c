// The Node 20 half of benchmarks/wasm.py: runs each model's Tessel bundle through web_runtime/tessel.js (once per
// entry of the job's `tesselOptions`, e.g. {threads: 1} and {threads: 2}) and the same .onnx file through
// onnxruntime-web (wasm execution provider, SIMD, `ortThreads` threads: onnxruntime-web fixes its thread count once
// per process) in this one process, checks that all give the same outputs, times them interleaved (A B C A B C ...,
// or in blocks with pauses) and prints the times as JSON.
// Usage: node benchmarks/node_bench.mjs job.json  (wasm.py writes the job: models, inputs, repeat, warmup)

import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as ort from "onnxruntime-web";
import * as tessel from "../web_runtime/tessel.js";

const here = path.dirname(fileURLToPath(import.meta.url));

const job = JSON.parse(await readFile(process.argv[2], "utf8"));
ort.env.wasm.numThreads = job.ortThreads ?? 1;
// Read the runtime's .wasm from node_modules: the benchmark machine has no network beyond the npm registry.
ort.env.wasm.wasmPaths = `${path.join(here, "node_modules", "onnxruntime-web", "dist")}/`;

// The input dtypes the benchmarks feed: images and features as float32, token ids and masks as int64.
const TYPED_ARRAYS = { float32: Float32Array, int32: Int32Array, int64: BigInt64Array };

async function tensorData(file, dtype) {
  const Type = TYPED_ARRAYS[dtype];
  // copied into an ArrayBuffer of its own: a BigInt64Array needs an 8-byte aligned start, which a Buffer may lack
  const bytes = new Uint8Array(await readFile(file));
  return new Type(bytes.buffer, 0, bytes.byteLength / Type.BYTES_PER_ELEMENT);
}

// The absolute tolerance scales with the output's range (`rangeTolerance` of it), as common.check_close's does:
// Winograd convs round differently from a direct sum (inception_block: 1.2e-5 on outputs up to 12).
function disagreement(ours, theirs, rangeTolerance) {
  let scale = 1;
  for (const value of theirs) scale = Math.max(scale, Math.abs(value));
  let worst = 0;
  for (let index = 0; index < ours.length; index++) {
    const error = Math.abs(ours[index] - theirs[index]);
    if (!(error <= rangeTolerance * scale + 1e-4 * Math.abs(theirs[index]))) worst = Math.max(worst, error || Infinity);
  }
  return worst;
}

async function timed(run) {
  const started = performance.now();
  await run();
  return performance.now() - started;
}

async function benchmark(job, spec) {
  const models = [];
  for (const options of job.tesselOptions ?? [{}]) models.push(await tessel.load(spec.bundle, options));
  const session = await ort.InferenceSession.create(spec.onnx, {
    executionProviders: ["wasm"],
    graphOptimizationLevel: "all",
  });
  const tesselFeeds = {};
  const ortFeeds = {};
  for (const input of spec.inputs) {
    const dtype = input.dtype ?? "float32";
    const data = await tensorData(input.file, dtype);
    tesselFeeds[input.name] = data;
    ortFeeds[input.name] = new ort.Tensor(dtype, data, input.shape);
  }
  const theirs = await session.run(ortFeeds);
  for (const [index, model] of models.entries()) {
    const ours = await model.run(tesselFeeds);
    for (const [position, name] of spec.outputs.entries()) {
      const worst = disagreement(ours[name].data, theirs[name].data, job.rangeTolerance ?? 1e-5);
      if (worst > 0) {
        throw new Error(`${spec.name} (${model.variant.code}): output ${name} disagrees with onnxruntime-web (${worst})`);
      }
      if (index === 0) await writeFile(`${spec.outputPrefix}${position}.bin`, ours[name].data);
    }
  }
  const sides = [...models.map((model) => () => model.run(tesselFeeds)), () => session.run(ortFeeds)];
  for (let round = 0; round < job.warmup; round++) for (const run of sides) await run();
  // `block` runs of one side, then of the other, idle `pauseMs` after each block (1 and 0: A B A B ...), each block
  // after `settle.runs` untimed runs lasting `settle.ms` at least, when given (common.settle_runs).
  const block = job.block ?? 1;
  const pauseMs = job.pauseMs ?? 0;
  const settle = job.settle ?? { runs: 0, ms: 0 };
  const times = sides.map(() => []);
  while (times[0].length < job.repeat) {
    const count = Math.min(block, job.repeat - times[0].length);
    for (const [side, run] of sides.entries()) {
      const settleStart = performance.now();
      for (let index = 0; index < settle.runs || performance.now() - settleStart < settle.ms; index++) await run();
      for (let index = 0; index < count; index++) times[side].push(await timed(run));
      if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
  }
  const variants = models.map((model) => model.variant);
  for (const model of models) model.dispose();
  await session.release();
  const ortMs = times.pop();
  return { name: spec.name, tessel: times[0], tessel_runs: times, variants, onnxruntime_web: ortMs };
}

const results = [];
for (const spec of job.models) results.push(await benchmark(job, spec));
const versions = { node: process.versions.node, v8: process.versions.v8, onnxruntime_web: ort.env.versions.web };
process.stdout.write(JSON.stringify({ versions, results }));
