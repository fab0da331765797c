// Type declarations of tessel-runtime (tessel.js): the whole public API. Checked with tsc against an example by
// tests/web/test_package.py.

/** This runtime's version; a bundle's manifest.runtime_version must be compatible with it (same major, and the same
 * minor while the major is 0, and no newer than this). */
export const VERSION: string;

/** The element types a bundle's inputs and outputs may have. */
export type Dtype = "float32" | "float16" | "float64" | "int8" | "uint8" | "int16" | "int32" | "int64" | "bool";

/** Float16Array where the TypeScript lib declares it (es2025, esnext), else Uint16Array. */
type Float16Data = typeof globalThis extends { Float16Array: { prototype: infer Array } } ? Array : Uint16Array;

/** The typed array each dtype's results come back as: float16 as a Float16Array where the engine has one (Chrome 135,
 * Firefox 129, Safari 18.2), else as a Uint16Array of its bits (Node 20), which float16BitsToFloat32 reads; bool as
 * 0/1 bytes. */
export interface TypedArrayOf {
  float32: Float32Array;
  float16: Float16Data | Uint16Array;
  float64: Float64Array;
  int8: Int8Array;
  uint8: Uint8Array;
  int16: Int16Array;
  int32: Int32Array;
  int64: BigInt64Array;
  bool: Uint8Array;
}

export type TensorData = TypedArrayOf[Dtype];

/** The typed arrays an input of each dtype may be given as: its TypedArrayOf, and for float16 also its bits
 * (Uint16Array) or a Float32Array, rounded to the nearest float16 as float32ToFloat16Bits does; for uint8 also a
 * Uint8ClampedArray (a canvas's pixels). A bool holds 0 or 1. */
export interface InputArrayOf extends Omit<TypedArrayOf, "float16" | "uint8"> {
  float16: Float16Data | Uint16Array | Float32Array;
  uint8: Uint8Array | Uint8ClampedArray;
}

export type InputData = InputArrayOf[Dtype];

/** A dim of an input's or output's shape: a whole number, or for a model compiled with symbolic sizes a size
 * expression over them ("seq", "4*seq", "past+seq", "seq*seq-1"). */
export type Dim = number | string;

/** A symbolic size of a model (compiled with `dims` / `tessel compile --dim seq=1..256`): a run takes any value in
 * min..max, read from the inputs' dims. */
export interface SizeSpec {
  name: string;
  min: number;
  max: number;
}

/** A model input or output as the manifest describes it. */
export interface TensorSpec {
  name: string;
  shape: Dim[];
  dtype: Dtype;
}

/** A result of `run`: fresh arrays, which later runs do not overwrite; `dims` is the run's shape (a symbolic
 * output's at the run's sizes). */
export interface Tensor<D extends Dtype = Dtype> {
  data: TypedArrayOf[D];
  dims: number[];
  dtype: D;
}

/** An input: a typed array its dtype takes, or with dims, which must equal the model's shape when given. An input
 * whose shape names a symbolic size needs its dims: they give the sizes' values for the run. */
export type TensorInput = InputData | { data: InputData; dims?: readonly number[] };

export type Feeds = Record<string, TensorInput>;

/** What `onProgress` is called with while a bundle loads: bytes of the file of each phase so far. */
export interface LoadProgress {
  phase: "manifest" | "code" | "params" | "ready";
  loaded: number;
  total: number;
}

export type BackendName = "auto" | "wasm" | "webgpu";

export interface LoadOptions {
  /** "auto" (the default) tries webgpu, then wasm, and takes the first that can run here. */
  backend?: BackendName | (string & {});
  /** wasm threads for a bundle with a threaded variant: default the cores, at most 4; one (with a console warning)
   * on a page that is not cross-origin isolated. */
  threads?: number;
  /** false keeps to plain SIMD128 where the engine has relaxed SIMD. */
  relaxedSimd?: boolean;
  onProgress?: (progress: LoadProgress) => void;
  /** The cache of bundle files (Cache API, else IndexedDB; none in Node), keyed by the manifest's digests:
   * "default" uses and fills it, "reload" fetches every file again and refills it, "none" neither reads nor writes. */
  cache?: "default" | "reload" | "none";
  /** true runs the model in a dedicated module worker (browsers), with the same API: outputs come back transferred,
   * inputs are copied, errors are TesselErrors, dispose() terminates the worker. A string or URL names the tessel.js
   * the worker starts, for an app bundled into one file (where import.meta.url is the bundle, not tessel.js). */
  worker?: boolean | string | URL;
}

/** The same model compiled for several backends: each URL is a bundle directory, relative to the set's own URL
 * when the set is loaded from a .json file. */
export interface BundleSet {
  bundles: Partial<Record<"wasm" | "webgpu", string>> & Record<string, string | undefined>;
}

/** The wasm code a model runs: the plain model.wasm or a variant, on how many threads. */
export interface WasmVariant {
  code: string;
  features: Array<"threads" | "relaxed-simd">;
  threads: number;
}

/** The parts of manifest.json a caller may read (compiler/bundle.py's MANIFEST_SCHEMA has all of it). */
export interface Manifest {
  format_version: number;
  runtime_version: string;
  content_hash: string;
  compiler_version: string;
  target: string;
  code: string;
  /** A symbolic model's sizes, in the order of the run entry's last argument; absent for a static model. */
  sizes?: SizeSpec[];
  /** A symbolic dim is laid out for its largest value rounded up to a multiple of this. */
  size_alignment?: number;
  inputs: Array<TensorSpec & { device_dtype?: "int32" }>;
  outputs: Array<TensorSpec & { device_dtype?: "int32"; source: null | { region: "input" | "output" | "params"; index?: number; offset?: number } }>;
  params: { file: "params.bin"; bytes: number; layout: Array<TensorSpec & { shape: number[]; offset: number; nbytes: number }> };
  memory: { arena_bytes: number; intermediate_bytes: number; alignment: number; wasm_import?: WasmImport };
  variants?: Array<{ code: string; features: Array<"threads" | "relaxed-simd">; wasm_import: WasmImport; stack_bytes?: number }>;
  files: Record<string, string>;
  chunked_files?: { chunk_bytes: number; sha256: Record<string, string> };
  [key: string]: unknown;
}

export interface WasmImport {
  initial_pages: number;
  maximum_pages: number | null;
  shared?: boolean;
}

/** Token ids, as a prompt for `generate`: numbers or bigints (or [1, n]: one such row). */
export type TokenIds =
  | readonly (number | bigint)[]
  | Int8Array
  | Uint8Array
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | BigInt64Array
  | BigUint64Array;

/** The options of `Model.generate`, as compiler/generate.py's (in camelCase). A wrong one rejects with a TesselError
 * (code "options", field the option's name), as does an option of another name. */
export interface GenerateOptions {
  /** The most tokens to generate (a whole number >= 0); required. */
  maxNewTokens: number;
  /** 0 (the default) picks the most likely token (greedy); above 0, tokens are drawn from softmax(logits / temperature). */
  temperature?: number;
  /** Draw among the topK most likely tokens only (a whole number >= 1). */
  topK?: number | null;
  /** Then among the fewest most likely tokens whose probabilities reach topP, in (0, 1]. */
  topP?: number | null;
  /** End the run after this token (it is the last one returned). */
  stopToken?: number | null;
  /** Seeds the draws (SplitMix64; a whole number >= 0): the same seed draws the same tokens every call. Random when left out. */
  seed?: number | null;
  /** Called with each token as it is chosen; a promise it returns is awaited before the next step. */
  onToken?: ((token: number) => unknown) | null;
}

/** A loaded bundle; make one with load(). */
export class Model {
  private constructor();
  readonly manifest: Manifest;
  /** The backend that runs the model: "wasm" or "webgpu". */
  readonly backend: string;
  /** Why: "asked for wasm", "auto chose wasm: the first that can run here, passing over webgpu (...)". */
  readonly backendReason: string;
  /** wasm: the code file, its features and threads; null on other backends. */
  readonly variant: WasmVariant | null;
  /** Each input's and output's name, shape and dtype; a symbolic dim is its size expression ("seq"). */
  readonly inputs: TensorSpec[];
  readonly outputs: TensorSpec[];
  /** The symbolic sizes the shapes name, with their ranges; [] for a static model. */
  readonly sizes: SizeSpec[];
  readonly inputNames: string[];
  readonly outputNames: string[];
  /** Run once. Rejects with a TesselError (code "input") naming a wrong, missing or unknown input, or for a symbolic
   * model an input whose dims put a size outside its range, have the wrong rank or disagree on a size. */
  run(feeds: Feeds): Promise<Record<string, Tensor>>;
  /**
   * The token ids a decoder exported with its KV cache (input_ids, past_key_values.* inputs, present.* and logits
   * outputs) and compiled with symbolic sizes generates after `prompt`: the prompt in one run, then one token a run,
   * the cache kept in wasm memory, yielding to the event loop between runs. Rejects with a TesselError: code
   * "generate" for a model that cannot generate (field: what it lacks), "options" for a wrong option, "input" for a
   * wrong prompt or when the prompt and the tokens outgrow the sizes the model was compiled for (the message names the
   * size), "backend" on WebGPU (wasm only), "disposed". A `run` or another `generate` between two of its steps
   * overwrites its cache: it then rejects with code "generate".
   */
  generate(prompt: TokenIds | readonly [TokenIds], options: GenerateOptions): Promise<number[]>;
  /** Make the backend's device state again, e.g. after a lost WebGPU device. */
  reload(): Promise<void>;
  /** Release the model's memory, workers and device; it cannot run afterwards. */
  dispose(): void;
}

/**
 * Load a bundle directory (an http(s) or relative URL in a browser; also a path or file: URL in Node), or a bundle
 * set (its .json URL, or the object). Rejects with a TesselError naming what is wrong.
 */
export function load(bundle: string | URL | BundleSet, options?: LoadOptions): Promise<Model>;

export type TesselErrorCode =
  | "manifest"
  | "version"
  | "file"
  | "digest"
  | "seal"
  | "binding"
  | "code"
  | "memory"
  | "backend"
  | "options"
  | "input"
  | "run"
  | "disposed"
  | "device"
  | "generate";

/** The one error tessel.js throws for what a caller or a bundle got wrong. */
export class TesselError extends Error {
  constructor(code: TesselErrorCode, field: string | null, message: string);
  readonly name: "TesselError";
  /** Which kind of problem. */
  readonly code: TesselErrorCode;
  /** The manifest field ("outputs[0].shape"), file ("model.wasm"), input or option it is about, when there is one. */
  readonly field: string | null;
}

/** Reads a bundle's files for a backend's create(), unchecked: the backend checks each against manifest.files. */
export interface BundleSource {
  text(name: string): Promise<string>;
  chunks(name: string): AsyncIterable<Uint8Array>;
  /** Present on a source that reads through the cache (a browser's `cache` option): tell it whether the bytes of
   * `name` it gave last matched the manifest's digest. Bytes it downloaded that matched are then stored; cached bytes
   * that did not are dropped, and it resolves to true: read `name` again (it comes from the network), whose check is
   * final. A backend that never calls it gets no caching and no second read. */
  checked?(name: string, matched: boolean): Promise<boolean>;
}

/** What a backend's create() gives: runs already-checked inputs, in manifest order; for a symbolic model also the
 * sizes' values, in manifest.sizes order (inputs and results are then compact arrays of the run's shapes). */
export interface Executor {
  run(inputs: TensorData[], sizes?: number[]): Promise<TensorData[]>;
  /** One step of `Model.generate` (the wasm executor's): the logits of the last of `ids` after `past` cached tokens,
   * the sizes' values bound; the cache stays in the executor between the steps of one `generation`. */
  step?(request: { generation: number; ids: number[]; past: number; sizes: number[] }): Promise<Float32Array | Float64Array>;
  dispose(): void;
  reload?(): Promise<void>;
  variant?: WasmVariant;
  adapter?: string;
}

export interface Backend {
  name: string;
  /** null when the bundle carries code for this backend, else why not. */
  describe(manifest: Manifest): string | null;
  /** null when this machine can run it, else why not. */
  probe(manifest: Manifest): Promise<string | null>;
  create(
    manifest: Manifest,
    source: BundleSource,
    options: { onProgress?: (progress: LoadProgress) => void; threads?: number; relaxedSimd?: boolean },
  ): Promise<Executor>;
}

/** Add a backend, or replace some fields of the one with the same name. */
export function registerBackend(backend: Partial<Backend> & { name: string }): void;

/** Empty the cache of bundle files that load keeps (the Cache API's, and IndexedDB's); resolves at once in Node. */
export function clearCache(): Promise<void>;

/** True when this engine runs WebAssembly SIMD128, which every Tessel wasm bundle uses. */
export function hasWasmSimd(): boolean;

/** True when this engine runs WebAssembly relaxed SIMD, which a bundle's relaxed variant uses. */
export function hasWasmRelaxedSimd(): boolean;

/** float32 values as the bits of the nearest float16 (round to nearest, ties to even, as numpy's astype(float16)):
 * beyond float16's range ±Infinity, below it a subnormal or ±0, NaN a NaN. Rejects anything but a Float32Array with
 * a TesselError (code "input", field "values"). */
export function float32ToFloat16Bits(values: Float32Array): Uint16Array;

/** float16 bits (a Uint16Array, as float16 results come back where there is no Float16Array) as float32 values,
 * exactly. Rejects anything but a Uint16Array with a TesselError (code "input", field "bits"). */
export function float16BitsToFloat32(bits: Uint16Array): Float32Array;

/** SHA-256 of the bytes: WebCrypto's where there is one, else tessel.js's own. */
export function sha256(bytes: ArrayBuffer | ArrayBufferView): Promise<Uint8Array>;

/** The digest of a manifest's text that the compiler embeds in the code generated for it (compiler/bundle.py). */
export function bindingDigest(manifestText: string): Promise<string>;

/** Rejects with a TesselError (code "seal") unless the code file's own sha256 seal matches its bytes. */
export function checkSeal(name: string, bytes: Uint8Array, style: "wasm" | "text"): Promise<void>;
