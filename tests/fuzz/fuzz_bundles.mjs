// The damaged bundles of tests/fuzz/test_fuzz_bundles.py, loaded and run by web_runtime/tessel.js in one Node process.
// argv[2] is a JSON file: {cases: [directory...], inputs: {name: {file, shape, dtype}}, expected: {name: {file, ...}}}
// (the undamaged bundle's input and Python's result for it). One JSON line per case on stdout: {"start": dir}, then
// {"done": dir, "outcome": "ok" | "error: TesselError <code> <field>" | "wrong: ..." | "crash: ..."}, so the parent
// knows which case was running if the process dies.

import { readFile } from "node:fs/promises";

import * as tessel from "../../web_runtime/tessel.js";

const RTOL = 1e-4;
const ATOL = 1e-5;
const CASE_SECONDS = 20;

const { cases, inputs, expected } = JSON.parse(await readFile(process.argv[2], "utf8"));

async function readArray({ file }) {
  const bytes = await readFile(file);
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

const feeds = {};
for (const [name, spec] of Object.entries(inputs)) feeds[name] = { data: await readArray(spec), dims: spec.shape };
const wanted = {};
for (const [name, spec] of Object.entries(expected)) wanted[name] = await readArray(spec);

function compare(outputs) {
  for (const [name, values] of Object.entries(wanted)) {
    const found = outputs[name] && outputs[name].data;
    if (!found || found.length !== values.length) return `wrong: output ${name} has ${found && found.length} values`;
    for (let index = 0; index < values.length; index++) {
      if (!(Math.abs(found[index] - values[index]) <= ATOL + RTOL * Math.abs(values[index]))) {
        return `wrong: output ${name}[${index}] is ${found[index]}, Python gave ${values[index]}`;
      }
    }
  }
  return "ok";
}

async function outcomeOf(directory, threads) {
  let model;
  try {
    model = await tessel.load(directory, { threads });
    return compare(await model.run(feeds));
  } catch (error) {
    if (error instanceof tessel.TesselError) return `error: TesselError ${error.code} ${error.field}`;
    return `crash: ${error && error.stack ? error.stack : String(error)}`.slice(0, 1500);
  } finally {
    if (model) model.dispose();
  }
}

let timer;
for (const [number, directory] of cases.entries()) {
  console.log(JSON.stringify({ start: directory }));
  const hang = new Promise((resolve) => {
    timer = setTimeout(() => resolve(`crash: no answer within ${CASE_SECONDS} s (a hang)`), CASE_SECONDS * 1000);
  });
  // every other case on two threads, so the threaded variant's path (workers over shared memory) is fuzzed too
  const outcome = await Promise.race([outcomeOf(directory, number % 2 ? 2 : 1), hang]);
  clearTimeout(timer);
  console.log(JSON.stringify({ done: directory, outcome }));
}
