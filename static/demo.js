// The digits demo (/demo/{bundle id}): a drawing pad whose ink is shrunk to the model's 8x8 input the way
// scikit-learn's digits were made (17 grey levels, 0..16 scaled to 0..1), run through the bundle with
// web_runtime/tessel.js on every stroke. The latest result is exposed as window.tesselDemo.

import * as tessel from "/runtime/tessel.js";

const SIZE = 8;
const LEVELS = 16;
const pad = document.getElementById("pad");
const preview = document.getElementById("preview");
const context = pad.getContext("2d", { willReadFrequently: true });
const previewContext = preview.getContext("2d");
const bars = document.getElementById("bars");
const query = new URLSearchParams(location.search);

let model = null;
let drawing = false;
let last = null;
let scheduled = false;
window.tesselDemo = { runs: 0, prediction: null };

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.classList.toggle("hidden", !message);
}

const BAR_ROW =
  '<span class="mono"></span><div class="track"><div class="fill"></div></div><span class="figure"></span>';

function buildBars() {
  for (let digit = 0; digit < 10; digit++) {
    const row = document.createElement("div");
    row.className = "bar-row";
    row.innerHTML = BAR_ROW;
    row.children[0].textContent = String(digit);
    // empty until the model has run: a div without a width would fill its whole track
    row.querySelector(".fill").style.width = "0%";
    bars.append(row);
  }
}

function showProbabilities(probabilities) {
  const best = probabilities.indexOf(Math.max(...probabilities));
  Array.from(bars.children).forEach((row, digit) => {
    const value = probabilities[digit] || 0;
    row.classList.toggle("best", probabilities.length > 0 && digit === best);
    row.querySelector(".fill").style.width = `${(100 * value).toFixed(1)}%`;
    row.children[2].textContent = probabilities.length ? `${(100 * value).toFixed(1)}%` : "";
  });
  document.getElementById("prediction").textContent = probabilities.length ? String(best) : "–";
  return probabilities.length ? best : null;
}

// ---- drawing -----------------------------------------------------------------------------------------

function strokeWidth() {
  return (pad.width / SIZE) * 0.85;
}

function point(event) {
  const box = pad.getBoundingClientRect();
  return {
    x: ((event.clientX - box.left) * pad.width) / box.width,
    y: ((event.clientY - box.top) * pad.height) / box.height,
  };
}

function line(from, to) {
  context.strokeStyle = "#1c2430";
  context.lineWidth = strokeWidth();
  context.lineCap = "round";
  context.lineJoin = "round";
  context.beginPath();
  context.moveTo(from.x, from.y);
  context.lineTo(to.x, to.y);
  context.stroke();
  schedulePrediction();
}

pad.addEventListener("pointerdown", (event) => {
  event.preventDefault();
  pad.setPointerCapture(event.pointerId);
  drawing = true;
  last = point(event);
  line(last, last);
});

pad.addEventListener("pointermove", (event) => {
  if (!drawing) return;
  const next = point(event);
  line(last, next);
  last = next;
});

for (const name of ["pointerup", "pointercancel"]) {
  pad.addEventListener(name, () => {
    drawing = false;
    last = null;
  });
}

document.getElementById("clear").addEventListener("click", () => {
  context.clearRect(0, 0, pad.width, pad.height);
  previewContext.clearRect(0, 0, SIZE, SIZE);
  showProbabilities([]);
  window.tesselDemo = { runs: window.tesselDemo.runs, prediction: null };
});

// ---- the model's view of the drawing -----------------------------------------------------------------

/** The drawing as the model's input: the ink coverage of each of the 8x8 cells, rounded to 17 levels. */
function drawingToInput() {
  const { data, width, height } = context.getImageData(0, 0, pad.width, pad.height);
  const input = new Float32Array(SIZE * SIZE);
  const cellWidth = width / SIZE;
  const cellHeight = height / SIZE;
  for (let row = 0; row < SIZE; row++) {
    for (let column = 0; column < SIZE; column++) {
      let ink = 0;
      let count = 0;
      for (let y = Math.floor(row * cellHeight); y < Math.floor((row + 1) * cellHeight); y++) {
        for (let x = Math.floor(column * cellWidth); x < Math.floor((column + 1) * cellWidth); x++) {
          ink += data[4 * (y * width + x) + 3];
          count++;
        }
      }
      input[row * SIZE + column] = Math.round((ink / count / 255) * LEVELS) / LEVELS;
    }
  }
  return input;
}

function showPreview(input) {
  const image = previewContext.createImageData(SIZE, SIZE);
  input.forEach((value, index) => {
    const shade = Math.round(255 * (1 - value));
    image.data.set([shade, shade, shade, 255], 4 * index);
  });
  previewContext.putImageData(image, 0, 0);
}

function asProbabilities(values) {
  const sum = values.reduce((total, value) => total + value, 0);
  if (values.every((value) => value >= 0 && value <= 1) && Math.abs(sum - 1) < 1e-3) return values;
  const largest = Math.max(...values);
  const exponentials = values.map((value) => Math.exp(value - largest));
  const total = exponentials.reduce((a, b) => a + b, 0);
  return exponentials.map((value) => value / total);
}

function schedulePrediction() {
  if (scheduled || !model) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    predict().catch((error) => showError(error.message));
  });
}

async function predict() {
  const input = drawingToInput();
  showPreview(input);
  const [spec] = model.inputs;
  const started = performance.now();
  const outputs = await model.run({ [spec.name]: { data: input, dims: spec.shape } });
  const latency = performance.now() - started;
  const probabilities = asProbabilities(Array.from(outputs[model.outputs[0].name].data));
  const prediction = showProbabilities(probabilities);
  document.getElementById("latency").textContent = `${latency.toFixed(2)} ms`;
  window.tesselDemo = {
    runs: window.tesselDemo.runs + 1,
    prediction,
    probabilities,
    input: Array.from(input),
    backend: model.backend,
    latencyMs: latency,
  };
}

async function start() {
  buildBars();
  const bundleId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop() || "");
  const started = performance.now();
  try {
    // ?set= names a bundle set (the same model for WebGPU and wasm), of which `auto` takes what this browser runs.
    const bundle = query.get("set") || `/bundles/${bundleId}/`;
    model = await tessel.load(bundle, { backend: query.get("backend") || "auto" });
  } catch (error) {
    document.getElementById("backend").textContent = "unavailable";
    showError(error.message);
    return;
  }
  const [input] = model.inputs;
  const [output] = model.outputs;
  const elements = (shape) => shape.reduce((product, size) => product * size, 1);
  if (input.dtype !== "float32" || elements(input.shape) !== SIZE * SIZE || elements(output.shape) !== 10) {
    showError(
      `this demo needs a digits model (float32 input of 8x8 pixels, 10 outputs); bundle ${bundleId} takes ` +
        `${input.dtype}[${input.shape.join(", ")}] and gives [${output.shape.join(", ")}]`,
    );
    model = null;
    return;
  }
  document.getElementById("backend").textContent = model.backend;
  document.getElementById("backend").title = model.backendReason;
  document.getElementById("load").textContent = `${(performance.now() - started).toFixed(0)} ms`;
  document.body.dataset.ready = "true";
}

start();
