// The upload page: sends an ONNX file to POST /api/compile, follows the job's server-sent events
// (/api/jobs/{id}/events) into a progress bar and log, then shows one result card per bundle and runs wasm
// bundles in this tab with web_runtime/tessel.js. The last run is exposed as window.tesselLastRun.

import * as tessel from "/runtime/tessel.js";
import { tuneOnThisDevice } from "/static/tune.js";

const query = new URLSearchParams(location.search);
const elements = Object.fromEntries(
  [
    "upload-form",
    "dropzone",
    "drop-title",
    "drop-detail",
    "file-input",
    "targets",
    "input-shapes",
    "records-input",
    "compile-button",
    "tune-button",
    "tune-trials",
    "zoo-links",
    "upload-error",
    "progress-card",
    "progress-bar",
    "progress-step",
    "progress-figure",
    "log",
    "job-error",
    "results",
    "result-template",
  ].map((id) => [id, document.getElementById(id)]),
);

// the model's files: one .onnx, a zip of it and its data files, or the .onnx with its data files (torch.onnx.export
// writes model.onnx and model.onnx.data), which the server stores as one zip
let chosenFiles = [];
let targetInfo = [];
let events = null;

// ---- small helpers -----------------------------------------------------------------------------------

function formatBytes(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(2)} MiB`;
}

function formatMs(ms) {
  return ms < 10 ? `${ms.toFixed(2)} ms` : `${ms.toFixed(1)} ms`;
}

function show(element, visible) {
  element.classList.toggle("hidden", !visible);
}

function showError(element, message) {
  element.textContent = message;
  show(element, Boolean(message));
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    const ops = body.ops ? `\nunsupported ops: ${body.ops.join(", ")}` : "";
    return `${body.error || `HTTP ${response.status}`}${ops}`;
  } catch {
    return `the server answered HTTP ${response.status}`;
  }
}

// A seeded generator (mulberry32) so a run can be repeated: ?seed=N on the page URL fixes the input.
function seededRandom(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let mixed = Math.imul(state ^ (state >>> 15), 1 | state);
    mixed = (mixed + Math.imul(mixed ^ (mixed >>> 7), 61 | mixed)) ^ mixed;
    return ((mixed ^ (mixed >>> 14)) >>> 0) / 4294967296;
  };
}

function standardNormal(random) {
  const radius = Math.sqrt(-2 * Math.log(1 - random()));
  return radius * Math.cos(2 * Math.PI * random());
}

// ---- the form ----------------------------------------------------------------------------------------

async function loadTargets() {
  try {
    const response = await fetch("/api/targets");
    if (!response.ok) throw new Error(await errorMessage(response));
    targetInfo = (await response.json()).targets;
  } catch (error) {
    elements.targets.innerHTML = "";
    showError(elements["upload-error"], `cannot list the compiler's targets: ${error.message}`);
    return;
  }
  const legend = document.createElement("legend");
  legend.textContent = "Targets";
  elements.targets.replaceChildren(legend);
  for (const target of targetInfo) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.name = "targets";
    box.value = target.name;
    box.checked = target.default;
    label.append(box, `${target.name}`);
    label.title = target.label;
    elements.targets.append(label);
  }
}

async function loadZooLinks() {
  try {
    const response = await fetch("/api/zoo");
    if (!response.ok) return;
    const { models } = await response.json();
    // The server gives `demo` only for a finished model the drawing demo can drive.
    const digits = models.find((model) => model.name === "digits" && model.demo);
    if (digits) {
      const link = document.createElement("a");
      link.href = digits.demo;
      link.textContent = "Try the digits drawing demo →";
      elements["zoo-links"].replaceChildren(link);
    }
  } catch {
    // The demo link is an extra; the page works without it.
  }
}

const isOnnx = (file) => /\.onnx$/i.test(file.name);

/** Why these files cannot be uploaded together, or "" when they can. */
function filesProblem(files) {
  if (files.length <= 1) return "";
  const models = files.filter(isOnnx);
  if (models.length !== 1) {
    return `drop one .onnx model with its data files (or a zip of them); these are ${models.length} .onnx files`;
  }
  return "";
}

function chooseFiles(fileList) {
  const files = Array.from(fileList || []);
  const problem = filesProblem(files);
  chosenFiles = problem ? [] : files;
  const model = chosenFiles.find(isOnnx) || chosenFiles[0];
  const data = chosenFiles.length - 1;
  elements["compile-button"].disabled = chosenFiles.length === 0;
  // tuning in this tab uploads the .onnx alone, so it takes a model without data files
  elements["tune-button"].disabled = chosenFiles.length !== 1;
  elements["drop-title"].textContent = model
    ? `${model.name}${data ? ` + ${data} data file${data > 1 ? "s" : ""}` : ""}`
    : "Drop an .onnx file here";
  const total = chosenFiles.reduce((sum, file) => sum + file.size, 0);
  elements["drop-detail"].textContent = model
    ? formatBytes(total)
    : "or click to choose one: with its .onnx.data files (choose or drop them together), or a zip of them";
  showError(elements["upload-error"], problem);
}

function wireDropzone() {
  const zone = elements.dropzone;
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("dragging");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("dragging"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("dragging");
    chooseFiles(event.dataTransfer.files);
  });
  elements["file-input"].addEventListener("change", () => chooseFiles(elements["file-input"].files));
}

async function submit(event, tunedRecords = null) {
  event?.preventDefault();
  if (chosenFiles.length === 0) return;
  const form = new FormData();
  for (const file of chosenFiles) form.append("file", file, file.name);
  const checked = [...elements.targets.querySelectorAll("input:checked")].map((box) => box.value);
  if (checked.length === 0) {
    showError(elements["upload-error"], "choose at least one target");
    return;
  }
  for (const name of checked) form.append("targets", name);
  const shapes = elements["input-shapes"].value.trim();
  if (shapes) form.append("input_shapes", shapes);
  const records = tunedRecords || elements["records-input"].files[0];
  if (records) form.append("records", records, tunedRecords ? "tuned-here.jsonl" : records.name);
  elements["compile-button"].disabled = true;
  showError(elements["upload-error"], "");
  try {
    const response = await fetch("/api/compile", { method: "POST", body: form });
    if (response.status !== 202) throw new Error(await errorMessage(response));
    follow((await response.json()).job);
  } catch (error) {
    showError(elements["upload-error"], error.message);
  } finally {
    elements["compile-button"].disabled = false;
  }
}

// ---- progress ----------------------------------------------------------------------------------------

function setProgress(fraction, step) {
  const percent = Math.round(fraction * 100);
  elements["progress-bar"].style.width = `${percent}%`;
  elements["progress-figure"].textContent = `${percent}%`;
  if (step) elements["progress-step"].textContent = step;
}

function follow(jobId) {
  if (events) events.close();
  elements.results.replaceChildren();
  elements.log.textContent = "";
  showError(elements["job-error"], "");
  setProgress(0, "queued");
  show(elements["progress-card"], true);
  events = new EventSource(`/api/jobs/${jobId}/events`);
  // The stream replays the job from its start on every (re)connection, so the log starts over with it.
  events.addEventListener("open", () => {
    elements.log.textContent = "";
  });
  events.addEventListener("log", (message) => {
    elements.log.textContent += `${JSON.parse(message.data).line}\n`;
    elements.log.scrollTop = elements.log.scrollHeight;
  });
  events.addEventListener("progress", (message) => {
    const { progress, step } = JSON.parse(message.data);
    setProgress(progress, step);
  });
  events.addEventListener("state", (message) => {
    const state = JSON.parse(message.data);
    if (state.state === "queued") {
      elements["progress-step"].textContent = state.position ? `queued: position ${state.position}` : "queued";
    } else if (state.state === "done") {
      events.close();
      setProgress(1, "done");
      showResults(state.result, jobId);
    } else if (state.state === "failed") {
      events.close();
      elements["progress-step"].textContent = "failed";
      const ops = state.error && state.error.ops ? `\nunsupported ops: ${state.error.ops.join(", ")}` : "";
      showError(elements["job-error"], `${(state.error && state.error.message) || "the compile failed"}${ops}`);
    }
  });
}

// ---- results -----------------------------------------------------------------------------------------

function showResults(result, jobId) {
  // The job's browser bundles form a bundle set (docs/web.md): a card runs its own target from it, and
  // ?backend=auto lets tessel.js choose among them.
  const bundleSet = `/api/jobs/${jobId}/bundle-set.json`;
  const cards = Object.entries(result.bundles).map(([target, bundle]) => resultCard(target, bundle, bundleSet));
  elements.results.replaceChildren(...cards);
}

function resultCard(target, bundle, bundleSet) {
  const card = elements["result-template"].content.firstElementChild.cloneNode(true);
  const field = (name) => card.querySelector(`[data-field="${name}"]`);
  const files = Object.entries(bundle.files);
  field("target").textContent = target;
  field("groups").textContent = bundle.fused_groups;
  field("kernels").textContent = bundle.kernels;
  field("seconds").textContent = bundle.reused ? "cached" : `${bundle.compile_seconds.toFixed(2)} s`;
  field("total").textContent = formatBytes(files.reduce((sum, [, size]) => sum + size, 0));
  for (const [name, size] of files) {
    const row = document.createElement("tr");
    const link = document.createElement("a");
    link.href = `${bundle.url}${name}`;
    link.textContent = name;
    const nameCell = document.createElement("td");
    nameCell.append(link);
    const sizeCell = document.createElement("td");
    sizeCell.className = "number";
    sizeCell.textContent = formatBytes(size);
    row.append(nameCell, sizeCell);
    field("files").append(row);
  }
  field("zip").href = bundle.zip;
  field("bundle-id").textContent = bundle.id.slice(0, 12);
  const info = targetInfo.find((item) => item.name === target);
  show(field("run"), Boolean(info && info.runs_in_browser));
  card.dataset.target = target;
  new RunPanel(card, { ...bundle, target, bundleSet }, field);
  return card;
}

/** "Run in this browser": loads the bundle once, then runs it on seeded random input or a chosen image. */
class RunPanel {
  constructor(card, bundle, field) {
    this.card = card;
    this.bundle = bundle;
    this.field = field;
    this.model = null;
    field("run").addEventListener("click", () => this.run(this.randomFeeds()));
    field("image").addEventListener("change", async () => {
      const file = field("image").files[0];
      if (file) this.run(await this.imageFeeds(file));
    });
  }

  async ensureModel() {
    if (this.model) return this.model;
    const started = performance.now();
    this.model = await tessel.load(this.bundle.bundleSet, {
      backend: query.get("backend") || this.bundle.target,
      onProgress: ({ phase, loaded, total }) => {
        const percent = total ? Math.round((100 * loaded) / total) : 0;
        this.field("backend").textContent = `${phase} ${percent}%`;
      },
    });
    this.field("load-ms").textContent = formatMs(performance.now() - started);
    this.field("backend").textContent = this.model.backend;
    this.field("backend").title = this.model.backendReason;
    this.field("backend-reason").textContent = this.model.backendReason;
    const [input] = this.model.inputs;
    const imageLike = this.model.inputs.length === 1 && input.dtype === "float32" && isImageShape(input.shape);
    show(this.field("image-picker"), imageLike);
    const demoLike = isImageShape(input.shape) && input.shape[1] === 1 && input.shape[2] === 8 && input.shape[3] === 8;
    if (demoLike) {
      this.field("demo").href = this.bundle.demo;
      show(this.field("demo"), true);
    }
    return this.model;
  }

  randomFeeds() {
    return async (model) => {
      const seed = query.has("seed") ? Number(query.get("seed")) : Math.floor(Math.random() * 2 ** 31);
      const random = seededRandom(seed);
      const feeds = {};
      for (const spec of model.inputs) {
        const count = spec.shape.reduce((product, size) => product * size, 1);
        feeds[spec.name] = { data: randomArray(spec.dtype, count, random), dims: spec.shape };
      }
      return { feeds, description: `random input, seed ${seed}` };
    };
  }

  async imageFeeds(file) {
    const bitmap = await createImageBitmap(file);
    return async (model) => {
      const [spec] = model.inputs;
      const data = imageToTensor(bitmap, spec.shape);
      return { feeds: { [spec.name]: { data, dims: spec.shape } }, description: file.name };
    };
  }

  async run(makeFeeds) {
    const panel = this.field("panel");
    show(panel, true);
    panel.dataset.state = "running";
    showError(this.field("run-error"), "");
    try {
      const model = await this.ensureModel();
      const { feeds, description } = await makeFeeds(model);
      this.field("input-description").textContent = description;
      const outputs = await model.run(feeds);
      const latency = await timeRuns(model, feeds);
      this.field("latency").textContent = formatMs(latency);
      const views = Object.entries(outputs).map(([name, tensor]) => outputView(name, tensor));
      this.field("outputs").replaceChildren(...views);
      window.tesselLastRun = {
        bundle: this.bundle.id,
        backend: model.backend,
        backendReason: model.backendReason,
        variant: model.variant,
        latencyMs: latency,
        inputs: plainTensors(feeds),
        outputs: plainTensors(outputs),
      };
      panel.dataset.state = "done";
    } catch (error) {
      showError(this.field("run-error"), error.message);
      panel.dataset.state = "failed";
    }
  }
}

/** Tensors as JSON-friendly {name: {dims, data: numbers}}, for tests and the console. */
function plainTensors(tensors) {
  const entries = Object.entries(tensors).map(([name, tensor]) => [
    name,
    { dims: tensor.dims, data: numbers(tensor) },
  ]);
  return Object.fromEntries(entries);
}

function isImageShape(shape) {
  return shape.length === 4 && shape[0] === 1 && (shape[1] === 1 || shape[1] === 3);
}

// Small non-negative integers (valid token ids, indices and masks) for integer inputs; normal floats for float ones
// (a float16 input is given as float32, which tessel.js rounds to float16).
const RANDOM_INTEGERS = { int8: Int8Array, uint8: Uint8Array, int16: Int16Array, int32: Int32Array };

function randomArray(dtype, count, random) {
  if (dtype === "float32" || dtype === "float16" || dtype === "float64") {
    const Type = dtype === "float64" ? Float64Array : Float32Array;
    return Type.from({ length: count }, () => standardNormal(random));
  }
  if (dtype === "int64") return BigInt64Array.from({ length: count }, () => BigInt(Math.floor(random() * 10)));
  if (dtype === "bool") return Uint8Array.from({ length: count }, () => (random() < 0.5 ? 1 : 0));
  if (dtype in RANDOM_INTEGERS) return RANDOM_INTEGERS[dtype].from({ length: count }, () => Math.floor(random() * 10));
  throw new Error(`the page cannot make random input of dtype ${dtype}`);
}

/** A tensor's values as numbers: a float16 one given as its bits (no Float16Array in this browser) converted. */
function numbers(tensor) {
  if (tensor.dtype === "float16" && tensor.data instanceof Uint16Array) {
    return Array.from(tessel.float16BitsToFloat32(tensor.data));
  }
  return Array.from(tensor.data, Number);
}

// The usual ImageNet preprocessing for 3-channel models (pixels to 0..1, then per-channel mean and std);
// 1-channel models get grayscale in 0..1. The image is center-cropped to the input's aspect and resized.
const IMAGENET_MEAN = [0.485, 0.456, 0.406];
const IMAGENET_STD = [0.229, 0.224, 0.225];

function imageToTensor(bitmap, shape) {
  const [, channels, height, width] = shape;
  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  const scale = Math.max(width / bitmap.width, height / bitmap.height);
  const cropWidth = width / scale;
  const cropHeight = height / scale;
  const left = (bitmap.width - cropWidth) / 2;
  const top = (bitmap.height - cropHeight) / 2;
  context.drawImage(bitmap, left, top, cropWidth, cropHeight, 0, 0, width, height);
  const pixels = context.getImageData(0, 0, width, height).data;
  const tensor = new Float32Array(channels * height * width);
  const plane = height * width;
  for (let index = 0; index < plane; index++) {
    const rgb = [0, 1, 2].map((channel) => pixels[4 * index + channel] / 255);
    if (channels === 1) {
      tensor[index] = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
      continue;
    }
    rgb.forEach((value, channel) => {
      tensor[channel * plane + index] = (value - IMAGENET_MEAN[channel]) / IMAGENET_STD[channel];
    });
  }
  return tensor;
}

/** The median of a few timed runs after the first, within about half a second. */
async function timeRuns(model, feeds) {
  const times = [];
  const deadline = performance.now() + 500;
  while (times.length < 3 || (times.length < 20 && performance.now() < deadline)) {
    const started = performance.now();
    await model.run(feeds);
    times.push(performance.now() - started);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)];
}

const BAR_ROW =
  '<span class="mono"></span><div class="track"><div class="fill"></div></div><span class="figure"></span>';

function outputView(name, tensor) {
  const section = document.createElement("div");
  const title = document.createElement("div");
  title.className = "label";
  title.textContent = `${name} `;
  const dims = document.createElement("span");
  dims.className = "muted mono";
  dims.textContent = `${tensor.dtype}[${tensor.dims.join(", ")}] · top values`;
  title.append(dims);
  const values = numbers(tensor);
  const top = values
    .map((value, index) => ({ value, index }))
    .sort((a, b) => b.value - a.value)
    .slice(0, 5);
  const largest = Math.max(...values.map(Math.abs), 1e-12);
  const bars = document.createElement("div");
  bars.className = "bars";
  for (const { value, index } of top) {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.innerHTML = BAR_ROW;
    row.children[0].textContent = `#${index}`;
    row.querySelector(".fill").style.width = `${(100 * Math.abs(value)) / largest}%`;
    row.children[2].textContent = value.toPrecision(4);
    bars.append(row);
  }
  section.append(title, bars);
  section.style.marginTop = "12px";
  return section;
}

wireDropzone();
// Tuning times wasm kernels in this tab, so the log is for wasm: the compile that follows uses it for wasm bundles.
async function tune() {
  if (chosenFiles.length !== 1) return;
  elements["tune-button"].disabled = elements["compile-button"].disabled = true;
  showError(elements["upload-error"], "");
  show(elements["progress-card"], true);
  elements.log.textContent = "";
  try {
    const trials = Number(elements["tune-trials"].value) || 32;
    const records = await tuneOnThisDevice(chosenFiles[0], trials, (status) => {
      const best = status.best_seconds ? `, best kernel ${formatMs(status.best_seconds * 1000)}` : "";
      const model = status.estimated_seconds ? `, model ~${formatMs(status.estimated_seconds * 1000)}` : "";
      setProgress(Math.min(1, status.measured / Math.max(1, status.trials)), `tuning on this device: ${status.measured} of ${status.trials} trials${best}${model}`);
    });
    await submit(null, records);
  } catch (error) {
    showError(elements["upload-error"], error.message);
  } finally {
    elements["compile-button"].disabled = chosenFiles.length === 0;
    elements["tune-button"].disabled = chosenFiles.length !== 1;
  }
}

elements["upload-form"].addEventListener("submit", submit);
elements["tune-button"].addEventListener("click", tune);
loadTargets();
loadZooLinks();
