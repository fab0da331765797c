// The text generation demo (/generate): the character model of compiler/data/train_chars.py, compiled by the service
// for wasm (GET /api/text-model queues it on the first visit and says when its bundle is ready), loaded with
// web_runtime/tessel.js and run with model.generate, each character shown as it is chosen. The latest generation is
// exposed as window.tesselGenerate.

import * as tessel from "/runtime/tessel.js";

const POLL_MS = 400;
const $ = (id) => document.getElementById(id);

let model = null;
let vocabulary = [];
let index = new Map();
let context = 128;
let stopRequested = false;
window.tesselGenerate = { state: "loading", tokens: [], text: "", prompt: [] };

class Stopped extends Error {}

function showError(message) {
  $("error").textContent = message;
  $("error").classList.toggle("hidden", !message);
}

function setState(state, status) {
  window.tesselGenerate.state = state;
  document.body.dataset.state = state;
  $("status").textContent = status;
  const running = state === "generating";
  $("generate").disabled = !model || running;
  $("stop").disabled = !running;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A task of its own after the ones already queued: onToken waits for it, so that clicks (Stop) and drawing run
// between two characters whatever the runtime's yield between steps does (a scheduler.yield() continuation ran ahead
// of input events and timers in Chromium, so a click waited until the whole generate was done).
const channel = new MessageChannel();
const waiting = [];
channel.port1.onmessage = () => waiting.shift()();
function nextTask() {
  return new Promise((resolve) => {
    waiting.push(resolve);
    channel.port2.postMessage(null);
  });
}

/** The text model's description once its bundle is compiled, showing the compile's progress until then. */
async function compiledModel() {
  let following = "";
  for (;;) {
    // following a job: its failure is reported, not compiled again (a new visit tries again)
    const response = await fetch(`/api/text-model${following}`, { cache: "no-store" });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || `the server answered ${response.status}`);
    following = `?job=${body.job}`;
    if (body.state === "done") return body;
    if (body.state === "failed") throw new Error(`the text model failed to compile: ${body.error?.message}`);
    $("model-card").classList.remove("hidden");
    const figure = Math.round(100 * (body.progress || 0));
    $("progress-bar").style.width = `${figure}%`;
    $("progress-figure").textContent = `${figure}%`;
    $("progress-step").textContent = body.state === "queued" ? "waiting for a compile worker…" : body.step || "compiling…";
    setState("compiling", "the service is compiling the model…");
    await sleep(POLL_MS);
  }
}

/** Token ids of `text`: each character's index in the vocabulary; characters the model does not know are left out. */
function encode(text) {
  const ids = [];
  let unknown = 0;
  for (const character of text) {
    const id = index.get(character);
    if (id === undefined) unknown += 1;
    else ids.push(id);
  }
  return { ids, unknown };
}

/** The tokens a chunk of generation starts from, and how many it may add, when `remaining` are still to come: as much
 * of the text as fits with them in the model's context, but at least its last context / 2 characters (then fewer
 * new ones a chunk). A prompt that fits with every new character is one chunk, as Python's Module.generate runs it. */
function nextChunk(all, remaining, size = context) {
  const length = Math.min(all.length, Math.max(size / 2, size + 1 - remaining));
  return { window: all.slice(all.length - length), count: Math.min(remaining, size + 1 - length) };
}

function numberField(id, fallback) {
  const value = Number.parseFloat($(id).value);
  return Number.isFinite(value) ? value : fallback;
}

async function generate() {
  showError("");
  const { ids, unknown } = encode($("prompt").value);
  if (ids.length === 0) {
    showError("type a prompt the model can read: letters, digits, punctuation or spaces");
    return;
  }
  const wanted = Math.max(1, Math.min(2000, Math.round(numberField("max-tokens", 200))));
  const temperature = Math.max(0, numberField("temperature", 0.8));
  const topK = Math.round(numberField("top-k", 0));
  const topP = numberField("top-p", 1);
  const given = $("seed").value.trim();
  const seed = given === "" ? Math.floor(Math.random() * 2 ** 31) : Math.max(0, Math.round(Number(given)));
  const options = { temperature };
  if (temperature > 0) {
    if (topK > 0) options.topK = topK;
    if (topP > 0 && topP < 1) options.topP = topP;
  }

  const prompt = ids.map((id) => vocabulary[id]).join("");
  $("output-prompt").textContent = prompt;
  const shown = document.createTextNode("");
  $("output-text").replaceChildren(shown);
  $("count").textContent = "0";
  $("speed").textContent = "–";
  $("first").textContent = "–";
  $("seed-used").textContent = temperature > 0 ? String(seed) : "greedy";
  const result = { state: "generating", prompt: ids, tokens: [], text: "", seed, temperature, chunks: 0 };
  window.tesselGenerate = result;
  stopRequested = false;
  const left = unknown === 1 ? "1 character" : `${unknown} characters`;
  setState("generating", unknown ? `generating (left out ${left} the model does not know)…` : "generating…");

  const started = performance.now();
  let firstAt = null;
  const all = [...ids];
  const onToken = (token) => {
    if (stopRequested) throw new Stopped("stopped");
    const now = performance.now();
    if (firstAt === null) {
      firstAt = now;
      $("first").textContent = `${(now - started).toFixed(0)} ms`;
    }
    result.tokens.push(token);
    all.push(token);
    shown.appendData(vocabulary[token]);
    result.text += vocabulary[token];
    $("count").textContent = String(result.tokens.length);
    if (result.tokens.length > 1) {
      $("speed").textContent = `${(((result.tokens.length - 1) * 1000) / (now - firstAt)).toFixed(0)} chars/s`;
    }
    return nextTask();
  };
  try {
    while (result.tokens.length < wanted) {
      const { window: start, count } = nextChunk(all, wanted - result.tokens.length);
      // each chunk draws from its own seed, so a seed gives the same text however the chunks fall
      await model.generate(start, { ...options, maxNewTokens: count, seed: seed + result.chunks, onToken });
      result.chunks += 1;
    }
    setState("done", `${result.tokens.length} characters in ${((performance.now() - started) / 1000).toFixed(2)} s`);
  } catch (error) {
    if (!(error instanceof Stopped)) {
      showError(error.message);
      setState("failed", "generation failed");
      return;
    }
    setState("stopped", `stopped after ${result.tokens.length} characters`);
  }
}

async function start() {
  $("generate").addEventListener("click", () => generate());
  $("stop").addEventListener("click", () => {
    stopRequested = true;
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !$("generate").disabled) generate();
  });
  try {
    const about = await compiledModel();
    vocabulary = about.vocabulary;
    index = new Map(vocabulary.map((character, id) => [character, id]));
    context = about.context;
    const loading = performance.now();
    // symbolic sizes and the key-value cache run on wasm
    model = await tessel.load(about.bundle, { backend: "wasm" });
    $("model-card").classList.add("hidden");
    $("backend").textContent = model.backend;
    $("backend").title = model.backendReason;
    window.tesselGenerate.bundle = about.bundle;
    setState("ready", `ready (loaded in ${(performance.now() - loading).toFixed(0)} ms)`);
  } catch (error) {
    showError(error.message);
    setState("failed", "the model is unavailable");
  }
}

start();
