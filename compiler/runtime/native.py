"""Native runtime: a shared library from link.py, loaded with ctypes, kernels called on numpy
arrays. libgomp is loaded first with RTLD_GLOBAL so the library's GOMP_parallel calls resolve."""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import numpy as np

from compiler.errors import TargetError
from compiler.runtime import ArgSpec, check_args

NUM_THREADS_ENV = "TESSEL_NUM_THREADS"
# How long libgomp's idle workers spin (rounds of a load and a pause) before they sleep, unless the user set
# OMP_WAIT_POLICY or GOMP_SPINCOUNT. A run is a chain of parallel loops, one per kernel, and a sleeping worker costs
# ~50 us to wake on this machine (mlp at 2 threads: 0.155 ms passive, 0.030 ms spinning): the spin must bridge the
# gap from one loop to the next. 1000 rounds does (300 do not: mobilenet_v2 8.6 ms against 4.4 ms), and is short
# enough not to slow what runs next: in benchmarks/cpu.py onnxruntime's interleaved mobilenet_v2 took 4.8-5.2 ms
# both with this spin and with passive libgomp.
SPIN_ROUNDS = 1000
WAIT_POLICY_ENVS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_gomp: ctypes.CDLL | None = None


def _load_gomp() -> None:
    """Load libgomp once, with SPIN_ROUNDS as its spin count unless the environment says otherwise. libgomp reads
    its environment when it is loaded, so a libgomp that something else in the process loaded first keeps its own
    wait policy."""
    global _gomp
    if _gomp is not None:
        return
    chosen = any(name in os.environ for name in WAIT_POLICY_ENVS)
    if not chosen:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_ROUNDS)
    try:
        _gomp = ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise TargetError(
            "native kernels with parallel loops need GCC's OpenMP runtime libgomp.so.1 "
            "(Debian: apt-get install libgomp1)"
        ) from error
    finally:
        if not chosen:
            del os.environ["GOMP_SPINCOUNT"]


def default_num_threads() -> int:
    """TESSEL_NUM_THREADS if set, else 0: libgomp's own default (OMP_NUM_THREADS or every core)."""
    text = os.environ.get(NUM_THREADS_ENV, "")
    try:
        return max(0, int(text)) if text else 0
    except ValueError as error:
        raise TargetError(f"{NUM_THREADS_ENV}={text!r} is not a whole number of threads") from error


class NativeLibrary:
    """One loaded shared library; the file is removed once mapped, the bytes are kept by the caller."""

    def __init__(self, library: bytes, num_threads: int | None = None):
        _load_gomp()
        with tempfile.TemporaryDirectory(prefix="tessel-native-") as folder:
            path = Path(folder, "kernel.so")
            path.write_bytes(library)
            self.handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        self.num_threads = default_num_threads() if num_threads is None else num_threads

    @property
    def num_threads(self) -> int:
        return ctypes.c_int32.in_dll(self.handle, "tessel_num_threads").value

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        ctypes.c_int32.in_dll(self.handle, "tessel_num_threads").value = int(count)

    def function(self, name: str, specs: list[ArgSpec]):
        entry = getattr(self.handle, name)
        entry.restype = None
        entry.argtypes = [ctypes.c_void_p] * len(specs)

        def call(*arrays):
            check_args(name, specs, arrays)
            entry(*(array.ctypes.data for array in arrays))

        return call


def aligned_buffer(nbytes: int, alignment: int = 64) -> np.ndarray:
    """A zeroed uint8 array of `nbytes` whose first byte sits on an `alignment` boundary."""
    raw = np.zeros(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes]


class NativeModel:
    """A whole model in one library: its params are copied once into an aligned buffer, its arena
    is allocated once, and every call runs the exported entry `run(inputs..., outputs..., params,
    arena)` on arrays that the caller has already checked."""

    def __init__(
        self,
        library: bytes,
        params: bytes,
        arena_bytes: int,
        outputs: list[ArgSpec],
        entry: str = "run",
        num_threads: int | None = None,
    ):
        self.library = NativeLibrary(library, num_threads)
        self.params = aligned_buffer(len(params))
        self.params[:] = np.frombuffer(params, np.uint8)
        self.arena = aligned_buffer(arena_bytes)
        self.outputs = outputs
        self.entry = getattr(self.library.handle, entry)
        self.entry.restype = None
        self.state = (ctypes.c_void_p(self.params.ctypes.data), ctypes.c_void_p(self.arena.ctypes.data))

    @property
    def num_threads(self) -> int:
        return self.library.num_threads

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        self.library.num_threads = count

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        outputs = [np.empty(spec.shape, spec.dtype) for spec in self.outputs]
        self.entry(*[ctypes.c_void_p(array.ctypes.data) for array in (*inputs, *outputs)], *self.state)
        return outputs
