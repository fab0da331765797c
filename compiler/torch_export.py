"""A driver for PyTorch models: torch.onnx.export (the dynamo exporter by default) writes the module as ONNX
with its weights in an external data file, onnx reads both back, and compile_model takes it from there.
torch is an optional extra (`pip install tessel[torch]`), imported only when from_torch is called."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import onnx

from compiler.build import Module, compile_model
from compiler.errors import ModelError, TesselError
from compiler.target import Target


def from_torch(
    module,
    example_inputs,
    target: Target | str = "wasm",
    *,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    dynamo: bool = True,
    **options,
) -> Module:
    """Compile a torch.nn.Module for `target`: `example_inputs` (a tensor or a tuple of them) fix the input
    shapes and dtypes, `input_names` and `output_names` name the Module's inputs and outputs (torch's own names
    otherwise), `options` go to compile_model. The module is exported as it is: call module.eval() first for
    inference behaviour of dropout and batch norm."""
    try:
        import torch
    except ImportError:
        raise TesselError("from_torch needs PyTorch; install it with `pip install tessel[torch]`") from None
    if dynamo and importlib.util.find_spec("onnxscript") is None:
        raise TesselError(
            "torch's dynamo ONNX exporter needs onnxscript; `pip install tessel[torch]` installs it, "
            "or pass dynamo=False for the TorchScript exporter"
        )
    if not isinstance(module, torch.nn.Module):
        raise TesselError(f"from_torch takes a torch.nn.Module, not {type(module).__name__}")
    arguments = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    with tempfile.TemporaryDirectory(prefix="tessel-torch-") as folder:
        path = Path(folder, "model.onnx")
        try:
            torch.onnx.export(
                module,
                arguments,
                str(path),
                input_names=input_names,
                output_names=output_names,
                dynamo=dynamo,
                external_data=True,
                **({"verbose": False} if dynamo else {}),
            )
        except Exception as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ModelError(f"torch.onnx.export could not export the module: {reason}") from None
        model = onnx.load(str(path))
    return compile_model(model, target, **options)
