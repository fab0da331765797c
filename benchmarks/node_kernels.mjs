// Per-kernel times of a threaded wasm bundle in Node, to see which loops threads speed up: loads the bundle through
// web_runtime/tessel.js twice, both times running model.threads.wasm (plain SIMD), one load with its workers stopped
// and one with `threads` threads, runs the model once, then calls each fused group's kernel from here with the run
// entry's arguments: `repeat` calls back to back on one load, then on the other (the workers stay awake between
// calls, as between one kernel and the next within a run). Prints per kernel the median milliseconds on each, their
// ratio, the pool jobs a call hands out, how many of them a worker joined (tessel_pool_jobs / tessel_pool_joins),
// and the time lost against a perfect split; the worst first.
// Usage: node benchmarks/node_kernels.mjs BUNDLE_DIR [threads=2] [repeat=30]

import { readFile } from "node:fs/promises";
import * as tessel from "../web_runtime/tessel.js";

const [bundle, threadsArgument = "2", repeatArgument = "30"] = process.argv.slice(2);
const threads = Number(threadsArgument);
const repeat = Number(repeatArgument);
const manifest = JSON.parse(await readFile(`${bundle}/manifest.json`, "utf8"));
if (!(manifest.variants || []).some((variant) => variant.features.join() === "threads")) {
  throw new Error(`${bundle} has no threads variant: compile it with wasm_variants=("threads",)`);
}

const options = { threads, relaxedSimd: false };
const models = [await tessel.load(bundle, options), await tessel.load(bundle, options)];
// the pool never waits for a worker that has not joined: without workers the threaded code runs on one thread
for (const worker of models[0].executor.workers) worker.terminate();
models[0].executor.workers = [];

const feeds = Object.fromEntries(
  manifest.inputs.map((spec) => [spec.name, new Float32Array(spec.shape.reduce((a, b) => a * b, 1)).fill(0.5)]),
);
for (const model of models) await model.run(feeds);

function kernel(executor, call) {
  const bases = { params: executor.paramsOffset, arena: executor.arenaOffset };
  executor.inputOffsets.forEach((offset, position) => (bases[`input_${position}`] = offset));
  executor.outputOffsets.forEach((offset, position) => (bases[`output_${position}`] = offset));
  const offsets = call.args.map(([buffer, offset]) => bases[buffer] + offset);
  const run = executor.instance.exports[call.kernel];
  return () => run(...offsets);
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
const rows = [];
let total = [0, 0];
for (const call of manifest.calls) {
  const runs = models.map((model) => kernel(model.executor, call));
  const exports = models[1].executor.instance.exports;
  const jobs = exports.tessel_pool_jobs();
  const joins = exports.tessel_pool_joins();
  // `repeat` calls of one side, then of the other, each after 10 untimed calls (more than the pool's DENSE_JOBS, so
  // the workers are awake), back to back as kernels run within a run
  const times = runs.map((run) => {
    for (let round = 0; round < 10; round++) run();
    return Array.from({ length: repeat }, () => {
      const started = performance.now();
      run();
      return performance.now() - started;
    });
  });
  const medians = times.map(median);
  total = total.map((sum, side) => sum + medians[side]);
  rows.push({
    group: call.group,
    kernel: call.kernel,
    one: medians[0],
    many: medians[1],
    jobs: (exports.tessel_pool_jobs() - jobs) / (repeat + 10),
    joins: (exports.tessel_pool_joins() - joins) / (repeat + 10),
  });
}
console.log(`${bundle}: kernels on 1 and ${threads} threads, median of ${repeat} calls each`);
console.log(`total ${total[0].toFixed(2)} ms / ${total[1].toFixed(2)} ms = ${(total[0] / total[1]).toFixed(2)}x`);
console.log("| group | 1 thread ms | threads ms | speed-up | jobs/call | joined/call | time lost ms |");
for (const row of rows.sort((a, b) => b.many - b.one / threads - (a.many - a.one / threads))) {
  console.log(
    `| ${row.group} | ${row.one.toFixed(3)} | ${row.many.toFixed(3)} | ${(row.one / row.many).toFixed(2)}x | ` +
      `${row.jobs.toFixed(1)} | ${row.joins.toFixed(1)} | ${(row.many - row.one / threads).toFixed(3)} |`,
  );
}
for (const model of models) model.dispose();
