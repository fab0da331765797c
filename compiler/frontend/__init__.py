"""Model importers: each turns a serialized model into the Graph IR that the passes read."""

from compiler.frontend.onnx import load_onnx

__all__ = ["load_onnx"]
