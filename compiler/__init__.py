"""Tessel: a deep-learning compiler. The public API is kept short here.

`build` is imported eagerly on purpose: the submodule `compiler.build` and the function share a
name, and only binding the function at package import keeps `compiler.build(...)` callable."""

from compiler.build import build, compile_model, load_module
from compiler.errors import ModelError, ShapeError, TargetError, TesselError, UnsupportedOpError
from compiler.target import Target
from compiler.torch_export import from_torch

__all__ = [
    "ModelError",
    "ShapeError",
    "Target",
    "TargetError",
    "TesselError",
    "UnsupportedOpError",
    "build",
    "compile_model",
    "from_torch",
    "load_module",
]
