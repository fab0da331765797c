"""Native runtime: a shared library from link.py, loaded with ctypes, kernels called on numpy
arrays. Each library carries its own thread pool (codegen/thread_pool.c) and its thread count."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from compiler.bundle import BINDING_SYMBOL, BundleError
from compiler.errors import TargetError
from compiler.runtime import ArgSpec, check_args, check_status

NUM_THREADS_ENV = "TESSEL_NUM_THREADS"


def default_num_threads() -> int:
    """TESSEL_NUM_THREADS if set, else the cores this process may run on (its CPU affinity, which is what a
    container or taskset leaves it; os.cpu_count where there is no affinity)."""
    text = os.environ.get(NUM_THREADS_ENV, "")
    try:
        count = int(text) if text else 0
    except ValueError as error:
        raise TargetError(f"{NUM_THREADS_ENV}={text!r} is not a whole number of threads") from error
    if count > 0:
        return count
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


# Loads a library in a child process and prints the text its BINDING_SYMBOL function returns: a truncated or
# foreign file can kill the process that maps it (SIGBUS, SIGSEGV) or hang in its constructors.
_PROBE = """
import ctypes, sys
getter = getattr(ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL), sys.argv[2])
getter.restype = ctypes.c_char_p
sys.stdout.write(getter()[:128].decode("ascii", "replace"))
"""
PROBE_SECONDS = 60


def _probe(path: Path) -> str:
    """The binding text of the library at `path`, read in a child process; BundleError if that process fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE, str(path), BINDING_SYMBOL],
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise BundleError(f"model.so did not finish loading in {PROBE_SECONDS} s; export the model again") from None
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise BundleError(f"model.so is not a loadable library (loading it raised {name}); export the model again")
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise BundleError(f"model.so is not a Tessel model library ({reason}); export the model again")
    return done.stdout


class NativeLibrary:
    """One loaded shared library; the file is removed once mapped, the bytes are kept by the caller. With
    `binding`, the library is first loaded in a child process and must carry that binding digest (bundle.py)
    before this process maps it."""

    def __init__(self, library: bytes, num_threads: int | None = None, binding: str | None = None):
        with tempfile.TemporaryDirectory(prefix="tessel-native-") as folder:
            path = Path(folder, "kernel.so")
            path.write_bytes(library)
            if binding is not None and _probe(path) != binding:
                raise BundleError(
                    "model.so was not generated for this manifest.json (its binding digest differs: the manifest "
                    "or the code was edited or swapped); export the model again"
                )
            self.handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        self.num_threads = default_num_threads() if num_threads is None else num_threads

    @property
    def num_threads(self) -> int:
        return ctypes.c_int32.in_dll(self.handle, "tessel_num_threads").value

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        ctypes.c_int32.in_dll(self.handle, "tessel_num_threads").value = int(count)

    @property
    def pool_jobs(self) -> int:
        """Parallel loops this library has handed to its thread pool (one kept serial or run at one thread never
        counts)."""
        return ctypes.c_uint64.in_dll(self.handle, "tessel_pool_jobs").value

    def function(self, name: str, specs: list[ArgSpec]):
        entry = getattr(self.handle, name)
        entry.restype = None
        entry.argtypes = [ctypes.c_void_p] * len(specs)

        def call(*arrays):
            check_args(name, specs, arrays)
            entry(*(array.ctypes.data for array in arrays))

        return call


def _address(array: np.ndarray) -> int:
    """The address of an array's first byte (array.ctypes.data without building a ctypes view object)."""
    return array.__array_interface__["data"][0]


def aligned_buffer(nbytes: int, alignment: int = 64) -> np.ndarray:
    """A zeroed uint8 array of `nbytes` whose first byte sits on an `alignment` boundary."""
    raw = np.zeros(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes]


class NativeModel:
    """A whole model in one library: its params are copied once into an aligned buffer, its arena
    is allocated once, and every call runs the exported entry `run(inputs..., outputs..., params,
    arena)` on arrays that the caller has already checked; `calls` names each kernel call of the entry for
    the error raised when one of them finds an index out of range."""

    def __init__(
        self,
        library: bytes,
        params: bytes,
        arena_bytes: int,
        outputs: list[ArgSpec],
        entry: str = "run",
        num_threads: int | None = None,
        calls: list[str] | None = None,
        binding: str | None = None,
    ):
        self.library = NativeLibrary(library, num_threads, binding)
        self.params = aligned_buffer(len(params))
        self.params[:] = np.frombuffer(params, np.uint8)
        self.arena = aligned_buffer(arena_bytes)
        self.outputs = outputs
        self.entry = getattr(self.library.handle, entry)
        self.entry.restype = ctypes.c_int32
        self.calls = calls or []
        self.state = (self.params.ctypes.data, self.arena.ctypes.data)
        # the per-call cost is Python's: each output's (shape, dtype) and the entry's argument types are made once,
        # so a call allocates its outputs, reads each array's address and calls (c_void_p converts a plain int)
        self.output_types = [(tuple(spec.shape), np.dtype(spec.dtype)) for spec in outputs]
        self.arity: int | None = None

    # run() writes into outputs it is given (a generate loop's, compiler/generate.py InPlaceStepper)
    writes_into_outputs = True

    @property
    def num_threads(self) -> int:
        return self.library.num_threads

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        self.library.num_threads = count

    def run(
        self, inputs: list[np.ndarray], sizes: np.ndarray | None = None, outputs: list[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """`sizes`: the int32 values of a symbolic model's sizes, the entry's last argument; `outputs`: arrays of the
        outputs' shapes and dtypes to write into (a generate loop's, kept from step to step), else new ones."""
        if outputs is None:
            outputs = [np.empty(shape, dtype) for shape, dtype in self.output_types]
        extra = [] if sizes is None else [_address(sizes)]
        arity = len(inputs) + len(outputs) + 2 + len(extra)
        if self.arity != arity:
            self.entry.argtypes = [ctypes.c_void_p] * arity
            self.arity = arity
        status = self.entry(
            *[_address(array) for array in inputs], *[_address(array) for array in outputs], *self.state, *extra
        )
        if status:
            check_status(status, self.calls)
        return outputs

    def replay(self, inputs: list[np.ndarray], sizes: np.ndarray | None = None) -> NativeReplay:
        return NativeReplay(self, inputs, sizes)


class NativeReplay:
    """Kernel calls against a NativeModel's params and arena, the caller's inputs and fresh outputs (Module.replay)."""

    def __init__(self, runtime: NativeModel, inputs: list[np.ndarray], sizes: np.ndarray | None = None):
        self.runtime = runtime
        self.results = [np.empty(spec.shape, spec.dtype) for spec in runtime.outputs]
        self.bases = {"params": runtime.params.ctypes.data, "arena": runtime.arena.ctypes.data}
        self.sizes = sizes  # held while the kernels read it
        if sizes is not None:
            self.bases["sizes"] = sizes.ctypes.data
        self.bases.update({f"input_{position}": array.ctypes.data for position, array in enumerate(inputs)})
        self.bases.update({f"output_{position}": array.ctypes.data for position, array in enumerate(self.results)})

    def kernel(self, name: str, args: list) -> Callable[[], None]:
        function = getattr(self.runtime.library.handle, name)
        function.restype = None
        pointers = [ctypes.c_void_p(self.bases[buffer] + offset) for buffer, offset in args]
        return lambda: function(*pointers)

    def outputs(self) -> list[np.ndarray]:
        return self.results
