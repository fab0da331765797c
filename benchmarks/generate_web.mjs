// The Node 20 half of benchmarks/generate_web.py: generate_loop.mjs's measurement on the job's thread count
// (onnxruntime-web fixes its count once per process, so the driver starts one process per model and count), with
// onnxruntime-web's wasm execution provider as the rival, its external data read into memory from the files the .onnx
// names. Prints JSON: per runtime and prompt the tokens, the prefill's ms, the time to the first token and the
// decode's ms; Node's resident memory after each runtime's load and warm-up; the versions.
// Usage: node --expose-gc benchmarks/generate_web.mjs job.json  (generate_web.py writes the job)

import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as ort from "onnxruntime-web";
import * as tessel from "../web_runtime/tessel.js";
import { measure } from "./generate_loop.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const job = JSON.parse(await readFile(process.argv[2], "utf8"));
ort.env.wasm.numThreads = job.threads;
// the runtime's .wasm from node_modules, as node_bench.mjs reads it
ort.env.wasm.wasmPaths = `${path.join(here, "node_modules", "onnxruntime-web", "dist")}/`;

/** Node's resident bytes once what is unreachable is collected (node --expose-gc). */
async function resident() {
  globalThis.gc?.();
  return process.memoryUsage().rss;
}

async function options() {
  const externalData = [];
  for (const { path: location, file } of job.model.externalData) externalData.push({ path: location, data: await readFile(file) });
  return { executionProviders: ["wasm"], graphOptimizationLevel: "all", externalData };
}

const report = await measure(tessel, job, [{ label: "onnxruntime_web", ort, options }], resident);
report.memory.peak = process.resourceUsage().maxRSS * 1024;
const versions = { node: process.versions.node, onnxruntime_web: ort.env.versions.web };
process.stdout.write(JSON.stringify({ versions, ...report }));
