// "Tune on this device": the service (server/tuning.py) searches the model's wasm schedules and this page times
// every candidate kernel in this browser's own WebAssembly engine, posting back its time and its outputs (which the
// service checks against the fallback kernel's). The result is the tuning log, which the upload page compiles with.

const ALIGN = 64;
const PAGE_BYTES = 65536;
const MIN_REPEAT_MS = 10;

function decode(text) {
  return Uint8Array.from(atob(text), (char) => char.charCodeAt(0));
}

function encode(bytes) {
  let text = "";
  for (let start = 0; start < bytes.length; start += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(start, start + 0x8000));
  }
  return btoa(text);
}

function roundUp(value, multiple) {
  return Math.ceil(value / multiple) * multiple;
}

// One candidate: instantiate it over a fresh memory, place its arrays above __heap_base, call it once for its
// outputs, then (when timed) the minimum over repeats of the mean time of one call.
async function runCandidate(candidate) {
  const limits = { initial: candidate.memory.initial_pages };
  if (candidate.memory.maximum_pages != null) limits.maximum = candidate.memory.maximum_pages;
  const memory = new WebAssembly.Memory(limits);
  const { instance } = await WebAssembly.instantiate(decode(candidate.wasm), { env: { memory } });
  const arrays = candidate.arrays.map(decode);
  const offsets = [];
  let end = roundUp(instance.exports.__heap_base.value, ALIGN);
  for (const array of arrays) {
    offsets.push(end);
    end = roundUp(end + Math.max(array.length, 1), ALIGN);
  }
  if (end > memory.buffer.byteLength) memory.grow(Math.ceil((end - memory.buffer.byteLength) / PAGE_BYTES));
  arrays.forEach((array, position) => new Uint8Array(memory.buffer, offsets[position], array.length).set(array));
  const kernel = instance.exports[candidate.name];
  const call = () => kernel(...offsets);
  call();
  const first = arrays.length - candidate.outputs;
  const outputs = arrays
    .slice(first)
    .map((array, position) => encode(new Uint8Array(memory.buffer, offsets[first + position], array.length).slice()));
  if (!candidate.timed) return { outputs };
  let number = candidate.number_of_calls;
  if (!number) {
    const started = performance.now();
    call();
    number = Math.max(1, Math.ceil(MIN_REPEAT_MS / Math.max(performance.now() - started, 0.001)));
  }
  let best = Infinity;
  for (let repeat = 0; repeat < candidate.repeat; repeat += 1) {
    const started = performance.now();
    for (let index = 0; index < number; index += 1) call();
    best = Math.min(best, (performance.now() - started) / number);
  }
  return { outputs, seconds: best / 1000 };
}

async function failure(response) {
  try {
    return (await response.json()).error || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// Tune `file` for `trials` measurements; `onProgress(status)` after each. Resolves to the log as a Blob.
export async function tuneOnThisDevice(file, trials, onProgress) {
  const form = new FormData();
  form.append("file", file, file.name);
  form.append("trials", String(trials));
  const started = await fetch("/api/tune", { method: "POST", body: form });
  if (started.status !== 202) throw new Error(await failure(started));
  const { session } = await started.json();
  window.tesselTuning = { session, status: null };
  for (;;) {
    const response = await fetch(`/api/tune/${session}/next`);
    if (!response.ok) throw new Error(await failure(response));
    const next = await response.json();
    window.tesselTuning.status = next;
    onProgress(next);
    if (next.candidate) {
      let answer;
      try {
        answer = await runCandidate(next.candidate);
      } catch (error) {
        answer = { error: `${error.name}: ${error.message}` };
      }
      const posted = await fetch(`/api/tune/${session}/answer`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ number: next.candidate.number, ...answer }),
      });
      if (!posted.ok) throw new Error(await failure(posted));
    } else if (next.state === "failed") {
      throw new Error(`tuning failed: ${next.error}`);
    } else if (next.state === "done") {
      const records = await fetch(`/api/tune/${session}/records`);
      return new Blob([await records.arrayBuffer()], { type: "application/x-ndjson" });
    }
  }
}
