"""CUDA runtime: kernels.cu (codegen/cuda.py) compiled to a cubin with NVRTC (cuda-python), or with nvcc where
NVRTC is missing, then loaded and launched through the CUDA driver API. Compiling needs no GPU; loading needs the
NVIDIA driver, and says so when it is absent."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from compiler.errors import PlatformError, TargetError
from compiler.runtime import ArgSpec
from compiler.runtime.device import DispatchModel, kernel_call

_INSTALL_DRIVER = "install the NVIDIA driver on a machine with a CUDA GPU"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    return nvrtc


def compile_nvrtc(source: str, arch: str) -> bytes:
    """The cubin of `source` for `arch` (sm_80...) from NVRTC. A cubin, not PTX: a driver older than this NVRTC
    cannot JIT its PTX, but runs its cubins."""
    nvrtc = _nvrtc()
    if nvrtc is None:
        raise PlatformError("the cuda target needs cuda-python with NVRTC (pip install cuda-python) or nvcc on PATH")
    error, program = nvrtc.nvrtcCreateProgram(source.encode(), b"kernels.cu", 0, [], [])
    _check_nvrtc(nvrtc, error, "create the program")
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        (error,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            raise TargetError(
                f"NVRTC refused the generated kernels.cu for {arch}: {log.decode(errors='replace').strip()[:2000]}"
            )
        error, size = nvrtc.nvrtcGetCUBINSize(program)
        _check_nvrtc(nvrtc, error, "size the cubin")
        cubin = b" " * size
        (error,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        _check_nvrtc(nvrtc, error, "read the cubin")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _check_nvrtc(nvrtc, error, step: str) -> None:
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise TargetError(f"NVRTC could not {step}: {error}")


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def compile_nvcc(source: str, arch: str) -> bytes:
    """The cubin of `source` for `arch` from nvcc."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise PlatformError("nvcc was not found; install the CUDA toolkit or use NVRTC (pip install cuda-python)")
    with tempfile.TemporaryDirectory(prefix="tessel-nvcc-") as folder:
        source_path, cubin_path = Path(folder, "kernels.cu"), Path(folder, "kernels.cubin")
        source_path.write_text(source)
        done = subprocess.run(
            [nvcc, "--cubin", f"--gpu-architecture={arch}", "-o", str(cubin_path), str(source_path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise TargetError(f"nvcc refused the generated kernels.cu for {arch}: {done.stderr.strip()[:2000]}")
        return cubin_path.read_bytes()


def compile_cuda(source: str, arch: str) -> bytes:
    """NVRTC where cuda-python has it, else nvcc."""
    return compile_nvrtc(source, arch) if _nvrtc() is not None else compile_nvcc(source, arch)


def _check(result, step: str):
    """The values of a driver call after its status, which must be CUDA_SUCCESS."""
    from cuda.bindings import driver

    error, *values = result
    if error != driver.CUresult.CUDA_SUCCESS:
        raise TargetError(f"the CUDA driver could not {step}: {error}")
    return values[0] if len(values) == 1 else values


@functools.cache
def cuda_context():
    """The primary context of device 0, made current in this process once."""
    try:
        from cuda.bindings import driver

        (error,) = driver.cuInit(0)
    except ImportError:
        raise PlatformError(f"the cuda target needs cuda-python (pip install cuda-python); {_INSTALL_DRIVER}") from None
    except Exception as error:  # cuda-python raises its own loader error when libcuda.so is absent
        raise PlatformError(f"no CUDA driver was found ({error}); {_INSTALL_DRIVER}") from None
    if error != driver.CUresult.CUDA_SUCCESS:
        raise PlatformError(f"the CUDA driver did not start ({error}); {_INSTALL_DRIVER}")
    count = _check(driver.cuDeviceGetCount(), "count devices")
    if count == 0:
        raise PlatformError(f"the CUDA driver found no GPU; {_INSTALL_DRIVER}")
    device = _check(driver.cuDeviceGet(0), "open device 0")
    context = _check(driver.cuDevicePrimaryCtxRetain(device), "retain the device's context")
    _check(driver.cuCtxSetCurrent(context), "make the context current")
    return device, context


def device_arch() -> str:
    """The compute capability of device 0 as sm_XY."""
    from cuda.bindings import driver

    device, _ = cuda_context()
    attribute = driver.CUdevice_attribute
    major = _check(driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "")
    minor = _check(driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "")
    return f"sm_{major}{minor}"


def device_name() -> str:
    from cuda.bindings import driver

    device, _ = cuda_context()
    name = _check(driver.cuDeviceGetName(64, device), "name the device")
    return name.split(b"\0", 1)[0].decode()


def allocate(nbytes: int) -> int:
    from cuda.bindings import driver

    cuda_context()
    return int(_check(driver.cuMemAlloc(max(int(nbytes), 4)), "allocate device memory"))


def copy_in(pointer: int, array: np.ndarray, step: str = "copy in") -> None:
    from cuda.bindings import driver

    _check(driver.cuMemcpyHtoD(pointer, array.ctypes.data, array.nbytes), step)


def copy_out(array: np.ndarray, pointer: int) -> None:
    from cuda.bindings import driver

    _check(driver.cuMemcpyDtoH(array.ctypes.data, pointer, array.nbytes), "copy out")


def wait() -> None:
    from cuda.bindings import driver

    _check(driver.cuCtxSynchronize(), "wait for the kernel")


def free(pointers: list[int]) -> None:
    from cuda.bindings import driver

    for pointer in pointers:
        driver.cuMemFree(pointer)


def pointer_arguments(pointers: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """cuLaunchKernel's argument array: the address of each argument's value (here each a device pointer). The
    value arrays are returned too, so they outlive the launch."""
    values = [np.array([pointer], dtype=np.uint64) for pointer in pointers]
    return values, np.array([value.ctypes.data for value in values], dtype=np.uint64)


def launch(kernel, dispatch: dict, pointers: list[int]) -> None:
    """Launch `kernel` over `dispatch`'s grid and block with the device pointers as its arguments, on the default
    stream."""
    from cuda.bindings import driver

    values, arguments = pointer_arguments(pointers)
    launched = driver.cuLaunchKernel(kernel, *dispatch["grid"], *dispatch["block"], 0, 0, arguments.ctypes.data, 0)
    _check(launched, f"launch kernel {dispatch['kernel']}")
    del values


class CudaDevice:
    """The primitives device.py's kernel call and model are written over; copies are synchronous on the default
    stream, launches are not."""

    allocate = staticmethod(allocate)
    copy_in = staticmethod(copy_in)
    copy_out = staticmethod(copy_out)
    launch = staticmethod(launch)
    wait = staticmethod(wait)
    free = staticmethod(free)


class CudaProgram:
    """kernels.cu compiled for `arch` (the target's, e.g. sm_80) when made; the module is loaded at the first kernel
    asked for. `kernels[name]` describes each lone kernel `function` can call: {"parts": [{"kernel", "grid",
    "block"}...], "workspace": [bytes...]} (tir/gpu.py's split_launches)."""

    def __init__(self, source: str, kernels: dict[str, dict], arch: str):
        self.source = source
        self.kernels = kernels
        self.arch = arch
        self.cubin = compile_cuda(source, arch)
        self.module = None

    def load(self):
        from cuda.bindings import driver

        cuda_context()
        if self.module is None:
            present = device_arch()
            if present != self.arch:
                raise TargetError(
                    f"these kernels were compiled for {self.arch}, but the GPU here is {present}; compile for "
                    f'target "cuda -arch={present}"'
                )
            self.module = _check(driver.cuModuleLoadData(self.cubin), "load the cubin")
        return self.module

    def kernel(self, name: str):
        from cuda.bindings import driver

        return _check(driver.cuModuleGetFunction(self.load(), name.encode()), f"find kernel {name}")

    def function(self, name: str, specs: list[ArgSpec]):
        """A callable on numpy arrays that copies them in, runs the kernel's parts and copies them back; the driver
        is first asked for at its first call."""
        return kernel_call(name, specs, self.kernels[name], self.kernel, CudaDevice)


class CudaModel(CudaDevice, DispatchModel):
    """A whole model from its bundle (device.py's DispatchModel): kernels.cu compiled for `arch` when made (no GPU
    needed); at the first run the module and each dispatch's kernel and argument pointers are made, and every dispatch
    launches on one stream."""

    def __init__(
        self,
        source: str,
        dispatches: list[dict],
        params: bytes,
        arena_bytes: int,
        inputs: list[ArgSpec],
        outputs: list[ArgSpec],
        arch: str,
    ):
        super().__init__(CudaProgram(source, {}, arch), dispatches, params, arena_bytes, inputs, outputs)
        self.kernels: dict[str, object] = {}

    def prepare(self) -> None:
        self.kernels = {name: self.program.kernel(name) for name in {dispatch["kernel"] for dispatch in self.plan}}

    def bind(self, dispatch: dict) -> tuple:
        pointers = [self.regions[(item["region"], item["index"])] + item["offset"] for item in dispatch["bindings"]]
        return dispatch, self.kernels[dispatch["kernel"]], pointers

    def enqueue(self, bound: tuple) -> None:
        dispatch, kernel, pointers = bound
        launch(kernel, dispatch, pointers)
