// The Node 20 half of benchmarks/wasm.py: runs each model's Tessel bundle through web_runtime/tessel.js and the
// same .onnx file through onnxruntime-web (wasm execution provider, SIMD, one thread) in this one process,
// checks that both give the same outputs, times them interleaved (A B A B ..., or in blocks with pauses) and prints
// the times as JSON.
// Usage: node benchmarks/node_bench.mjs job.json  (wasm.py writes the job: models, inputs, repeat, warmup)

import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as ort from "onnxruntime-web";
import * as tessel from "../web_runtime/tessel.js";

const here = path.dirname(fileURLToPath(import.meta.url));

ort.env.wasm.numThreads = 1;
// Read the runtime's .wasm from node_modules: the benchmark machine has no network beyond the npm registry.
ort.env.wasm.wasmPaths = `${path.join(here, "node_modules", "onnxruntime-web", "dist")}/`;

async function floats(file) {
  const bytes = await readFile(file);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}

function disagreement(ours, theirs) {
  let worst = 0;
  for (let index = 0; index < ours.length; index++) {
    const error = Math.abs(ours[index] - theirs[index]);
    if (!(error <= 1e-5 + 1e-4 * Math.abs(theirs[index]))) worst = Math.max(worst, error || Infinity);
  }
  return worst;
}

async function timed(run) {
  const started = performance.now();
  await run();
  return performance.now() - started;
}

async function benchmark(job, spec) {
  const model = await tessel.load(spec.bundle);
  const session = await ort.InferenceSession.create(spec.onnx, {
    executionProviders: ["wasm"],
    graphOptimizationLevel: "all",
  });
  const tesselFeeds = {};
  const ortFeeds = {};
  for (const input of spec.inputs) {
    const data = await floats(input.file);
    tesselFeeds[input.name] = data;
    ortFeeds[input.name] = new ort.Tensor("float32", data, input.shape);
  }
  const ours = await model.run(tesselFeeds);
  const theirs = await session.run(ortFeeds);
  for (const [position, name] of spec.outputs.entries()) {
    const worst = disagreement(ours[name].data, theirs[name].data);
    if (worst > 0) throw new Error(`${spec.name}: output ${name} disagrees with onnxruntime-web (max error ${worst})`);
    await writeFile(`${spec.outputPrefix}${position}.bin`, ours[name].data);
  }
  const runTessel = () => model.run(tesselFeeds);
  const runOrt = () => session.run(ortFeeds);
  for (let round = 0; round < job.warmup; round++) {
    await runTessel();
    await runOrt();
  }
  // `block` runs of one side, then of the other, idle `pauseMs` after each block (1 and 0: A B A B ...).
  const block = job.block ?? 1;
  const pauseMs = job.pauseMs ?? 0;
  const tesselMs = [];
  const ortMs = [];
  while (ortMs.length < job.repeat) {
    const count = Math.min(block, job.repeat - ortMs.length);
    for (const [run, samples] of [
      [runTessel, tesselMs],
      [runOrt, ortMs],
    ]) {
      for (let index = 0; index < count; index++) samples.push(await timed(run));
      if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
  }
  model.dispose();
  await session.release();
  return { name: spec.name, tessel: tesselMs, onnxruntime_web: ortMs };
}

const job = JSON.parse(await readFile(process.argv[2], "utf8"));
const results = [];
for (const spec of job.models) results.push(await benchmark(job, spec));
const versions = { node: process.versions.node, v8: process.versions.v8, onnxruntime_web: ort.env.versions.web };
process.stdout.write(JSON.stringify({ versions, results }));
