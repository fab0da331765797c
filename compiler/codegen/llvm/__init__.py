"""LLVM code generation: PrimFuncs (the loop IR) → one llvmlite module → optimised IR, assembly
and an object file for a Target. link.py turns the object into a .so or .wasm; build.py drives it.

Every kernel is `void name(T0* arg0, T1* arg1, ...)`. Vectorized loops become LLVM vector values,
parallel loops an outlined body run through Tessel's thread pool (thread_pool.c natively, wasm_thread_pool.c in
threaded wasm; link.py links them) when tir/work.py says they do enough work, math a polynomial in IR."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from compiler.codegen.llvm.emitter import FunctionEmitter, ModuleContext
from compiler.codegen.llvm.types import _I8, _I32, _PTR, LIBM_MATH, NATIVE_MATH, _opaque
from compiler.errors import TargetError
from compiler.target import Target
from compiler.tir.fast_math import expand_math
from compiler.tir.nodes import (
    KernelCall,
    PrimFunc,
    Seq,
)


def generate_module(funcs: list[PrimFunc], target: Target, texts: dict[str, str] | None = None) -> ir.Module:
    """All `funcs` as external kernels of one module (plus their outlined parallel bodies), and for each of
    `texts` a function of that name returning a pointer to the NUL-terminated ASCII text."""
    context = ModuleContext(target)
    for name, text in (texts or {}).items():
        data = bytearray(text.encode("ascii") + b"\0")
        constant = ir.GlobalVariable(context.module, ir.ArrayType(_I8, len(data)), f"{name}.text")
        constant.global_constant, constant.linkage = True, "private"
        constant.initializer = ir.Constant(ir.ArrayType(_I8, len(data)), data)
        getter = ir.Function(context.module, ir.FunctionType(_PTR, []), name)
        ir.IRBuilder(getter.append_basic_block()).ret(_opaque(constant))
    # every kernel is declared before any body is emitted, so a body that declares a C library function finds a
    # kernel of the same name whichever comes first (FunctionEmitter.libm refuses the clash)
    # a model's run entry (a list of kernel calls, empty when the outputs are all copied by the host) returns the
    # number of the call that failed
    entries = [
        isinstance(func.body, Seq) and all(isinstance(node, KernelCall) for node in func.body.stmts) for func in funcs
    ]
    functions = [
        ir.Function(
            context.module,
            ir.FunctionType(_I32 if entry else ir.VoidType(), [_PTR] * len(func.params)),
            func.name,
        )
        for func, entry in zip(funcs, entries)
    ]
    # the kernels first, so that each entry knows the work its kernels hand to the pool
    order = sorted(zip(funcs, functions, entries), key=lambda item: item[2])
    for func, function, entry in order:
        function.attributes.add("nounwind")
        emitter = FunctionEmitter(context, function)
        for argument, buffer in zip(function.args, func.params):
            argument.name = buffer.name
            # Kernel arguments never overlap: the runtimes pass one distinct array per parameter.
            argument.add_attribute("noalias")
            emitter.buffers[buffer] = argument
        if entry:
            emitter.builder.store(ir.Constant(_I32, 0), context.failed_call)
            emitter.announce_run([call.func for call in func.body.stmts])
        # wasm has no C library, so its float64 math is expanded too (over float64 exp and log)
        native = NATIVE_MATH + LIBM_MATH if target.machine.libm else NATIVE_MATH
        emitter.visit(expand_math(func.body, native))
        emitter.finish()
    return context.module


@dataclass(frozen=True)
class CompiledModule:
    """Optimised LLVM IR text and object code of one module for `target`; its assembly text on demand."""

    target: Target
    ll: str
    object: bytes

    @functools.cached_property
    def asm(self) -> str:
        """The assembly, emitted from the optimised IR when first read: emitted with every compile, it took as long
        as the object code itself (9.5 s against 9.4 in a profile of a Llama-class decoder's wasm compile), for a text that
        only `source("asm")` and the tests of instructions read."""
        return target_machine(self.target).emit_assembly(llvm.parse_assembly(self.ll))


_initialized = False


def target_machine(target: Target) -> llvm.TargetMachine:
    global _initialized
    if not _initialized:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        # LLVM 22's loop vectorizer forms interleave groups from accesses like x[(j % 4) * 5 + c] as if
        # j % 4 were j, reading past the buffer (tests/codegen/test_llvm_codegen.py keeps the case).
        # Tessel's schedules vectorize explicitly, so losing interleave groups costs little.
        llvm.set_option("tessel", "-enable-interleaved-mem-accesses=false")
        # No partial unrolling: a schedule unrolls what it means to. LLVM still unrolls a loop of a few constant
        # trips fully (a window's columns, a filled MatMul block's rows), but it also unrolled the k loop around
        # such a block by 2 once its 64-bit addresses made the body smaller, and the two steps' multiply-adds then
        # took a register copy each (odd_transformer, AVX2, 1 thread: 2.41 -> 3.27 ms; 2.47 without it)
        llvm.set_option("tessel", "-unroll-allow-partial=false")
        _initialized = True
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as error:
        raise TargetError(f"LLVM in llvmlite cannot generate code for {target.triple!r}: {error}") from error
    return llvm_target.create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc=target.machine.relocation
    )


def compile_module(module: ir.Module, target: Target) -> CompiledModule:
    """Verify, optimise at O3 (new pass manager, the target's features) and emit code."""
    machine = target_machine(target)
    module.data_layout = str(machine.target_data)
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(parsed, passes)
    return CompiledModule(target, str(parsed), machine.emit_object(parsed))


def compile_funcs(funcs: list[PrimFunc], target: Target, texts: dict[str, str] | None = None) -> CompiledModule:
    return compile_module(generate_module(funcs, target, texts), target)


__all__ = ["CompiledModule", "compile_funcs", "compile_module", "generate_module", "target_machine"]
