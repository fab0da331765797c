"""Errors a user can cause. Each carries one message that names the thing and what to do; the CLI
prints it and exits 2, the server turns it into a 4xx JSON body. Every stage may raise these."""


class TesselError(Exception):
    """Base of all user-facing errors."""


class ModelError(TesselError):
    """The model file is not ONNX, is truncated, or is malformed."""


class UnsupportedOpError(TesselError):
    """One or more ops have no implementation; `ops` maps op type -> node names."""

    def __init__(self, message: str, ops: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.ops = ops or {}


class ShapeError(TesselError):
    """A symbolic or wrong input shape, or shapes that do not agree."""


class SymbolicSizeError(ShapeError):
    """An operation needs a size fixed at compile time, but the size is symbolic (compiler/graph/sym.py)."""


class TargetError(TesselError):
    """An unknown target string or a missing toolchain."""


class TuningError(TesselError):
    """A tuning config or records file that does not fit: a knob no template has, a value outside a knob's space."""


class RunError(TesselError):
    """A model refused its inputs while running: an index out of range for the axis it reads."""


class GpuKernelError(TesselError):
    """A kernel a GPU target cannot run: more threads, blocks or shared memory than the device has, a dtype it lacks,
    a barrier that only some threads reach, or no thread-bound loop at all (a CPU schedule)."""


class PlatformError(TesselError):
    """The runtime a target needs is not on this machine (no OpenCL platform, no WebGPU adapter, no CUDA driver)."""
