"""Code generation from the loop IR. llvm.py serves every CPU target (x86-64, AArch64, ARMv7) and
wasm32; it hands object code to link.py."""

from compiler.codegen.llvm import CompiledModule, compile_funcs, compile_module, generate_module

__all__ = ["CompiledModule", "compile_funcs", "compile_module", "generate_module"]
