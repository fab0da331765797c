"""How the function emitter turns loop-IR expressions into LLVM values: variables, constants, casts, selects,
comparisons, integer and float arithmetic, math calls (polynomials, or libm where the machine has one)."""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen.llvm.types import (
    _F32,
    _F64,
    _I32,
    _I64,
    _UNSIGNED,
    CONTRACTED,
    _element,
    _float_resize,
    _lanes,
    _one_like,
    _vector,
    _width,
    value_type,
)
from compiler.errors import TargetError
from compiler.te.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    IfThenElse,
    Let,
    Logical,
    Select,
    Var,
    is_float,
    is_int,
)
from compiler.tir.nodes import (
    Load,
)


class ExprEmitter:
    """Expressions for FunctionEmitter (a mixin: its state is the emitter's)."""

    def expr(self, node: Expr) -> ir.Value:
        # the class's method, or its nearest base's (a SizeVar is a Var)
        names = (f"expr_{base.__name__.lower()}" for base in type(node).__mro__)
        method = next((getattr(self, name) for name in names if hasattr(self, name)), None)
        if method is None:
            raise TypeError(f"codegen cannot handle expression {type(node).__name__}")
        return method(node)

    def expr_var(self, node: Var) -> ir.Value:
        if node not in self.values:
            raise TargetError(f"variable {node.name!r} is used outside the loop or let that defines it")
        return self.widened(self.values[node], node.dtype)

    def expr_const(self, node: Const) -> ir.Value:
        if self.widening and is_int(node.dtype):
            return ir.Constant(_I64, int(node.value))
        return self.const(node.value, node.dtype)

    def expr_load(self, node: Load) -> ir.Value:
        return self.widened(self.load(node), node.buffer.dtype)

    def expr_let(self, node: Let) -> ir.Value:
        return self.bind(node.var, node.value, lambda: self.expr(node.body))

    def expr_cast(self, node: Cast) -> ir.Value:
        value, source = self.expr(node.value), node.value.dtype
        if self.widening and is_int(source):
            # widened (an unsigned one is never negative); converted to a narrower integer it wraps as in its own width
            source = "int64"
        return self.widened(self.convert(value, source, node.dtype), node.dtype)

    def expr_select(self, node: Select) -> ir.Value:
        cond, true_value, false_value = self.expr(node.cond), self.expr(node.true_value), self.expr(node.false_value)
        if _lanes(cond):
            cond, true_value, false_value = self.match(cond, true_value, false_value)
        else:
            true_value, false_value = self.match(true_value, false_value)
        return self.builder.select(cond, true_value, false_value)

    def expr_ifthenelse(self, node: IfThenElse) -> ir.Value:
        b = self.builder
        cond = self.expr(node.cond)
        with b.if_else(cond) as (then, otherwise):
            with then:
                true_value, true_block = self.expr(node.true_value), b.block
            with otherwise:
                false_value, false_block = self.expr(node.false_value), b.block
        phi = b.phi(true_value.type)
        phi.add_incoming(true_value, true_block)
        phi.add_incoming(false_value, false_block)
        return phi

    def expr_logical(self, node: Logical) -> ir.Value:
        b = self.builder
        if node.op == "not":
            value = self.expr(node.args[0])
            return b.xor(value, self.const(True, "bool", _lanes(value)))
        left, right = self.match(self.expr(node.args[0]), self.expr(node.args[1]))
        return b.and_(left, right) if node.op == "and" else b.or_(left, right)

    def expr_compare(self, node: Compare) -> ir.Value:
        left, right = self.match(self.expr(node.a), self.expr(node.b))
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[node.op]
        dtype = node.a.dtype
        if is_float(dtype):
            if node.op == "ne":
                return self.builder.fcmp_unordered(symbol, left, right)
            return self.builder.fcmp_ordered(symbol, left, right)
        if dtype in _UNSIGNED:
            return self.builder.icmp_unsigned(symbol, left, right)
        return self.builder.icmp_signed(symbol, left, right)

    def expr_binary(self, node: Binary) -> ir.Value:
        if node.op == "add":
            # a sum of byte products added to an int32 (a reduction's update) is one instruction on machines with an
            # integer dot product, which adds into its accumulator
            for total, term in ((node.a, node.b), (node.b, node.a)):
                if isinstance(term, Call) and term.name == "dot_bytes" and total.dtype == "int32":
                    return self.dot_bytes(term, self.expr(total))
        left, right = self.match(self.expr(node.a), self.expr(node.b))
        dtype = node.a.dtype
        if is_float(dtype):
            return self.float_binary(node.op, left, right)
        return self.int_binary(node.op, left, right, dtype)

    def float_binary(self, op: str, left: ir.Value, right: ir.Value, reassociate: bool = False) -> ir.Value:
        """float16 values stay float32 here: rounding to half happens at stores and casts only. `reassociate`
        (a reduction's update) lets LLVM reorder a chain of these adds or multiplies."""
        b = self.builder
        if op in CONTRACTED:
            # `contract` lets LLVM fuse a multiply and the add or subtract of its product into one FMA (one
            # rounding instead of two, within every tolerance the tests hold), as C compilers do by default.
            flags = ("contract", "reassoc") if reassociate else ("contract",)
            return CONTRACTED[op](b, left, right, flags=flags)
        if op == "div":
            return b.fdiv(left, right)
        if op in ("min", "max"):
            # minimum/maximum propagate NaN like numpy and ONNX, and are single instructions on wasm. `nsz` lets
            # LLVM ignore the order of -0 and +0, so max(x, 0) (ReLU, Clip) is one vmaxps on x86 that still
            # propagates x's NaN, instead of a max, a NaN compare and a blend.
            intrinsic = self.context.intrinsic("minimum" if op == "min" else "maximum", left.type)
            return b.call(intrinsic, [left, right], fastmath=("nsz",))
        if op == "floordiv":
            return self.call("floor", b.fdiv(left, right))
        if op == "floormod":
            return b.fsub(left, b.fmul(self.call("floor", b.fdiv(left, right)), right))
        if op == "pow":
            return self.float_call("pow", [left, right])
        raise TypeError(f"codegen cannot handle float operator {op!r}")

    def int_binary(self, op: str, left: ir.Value, right: ir.Value, dtype: str) -> ir.Value:
        b = self.builder
        unsigned = dtype in _UNSIGNED
        flags = ("nsw",) if self.indexing and not unsigned else ()
        if op == "add":
            return b.add(left, right, flags=flags)
        if op == "sub":
            return b.sub(left, right, flags=flags)
        if op == "mul":
            return b.mul(left, right, flags=flags)
        if op == "div":
            return b.udiv(left, right) if unsigned else b.sdiv(left, right)
        if op in ("floordiv", "floormod"):
            if unsigned:
                return b.udiv(left, right) if op == "floordiv" else b.urem(left, right)
            quotient, remainder = b.sdiv(left, right), b.srem(left, right)
            zero = ir.Constant(left.type, None)
            # Truncation rounds toward zero; step down when the remainder and divisor differ in sign.
            adjust = b.and_(
                b.icmp_signed("!=", remainder, zero),
                b.icmp_signed("!=", b.icmp_signed("<", remainder, zero), b.icmp_signed("<", right, zero)),
            )
            if op == "floordiv":
                return b.sub(quotient, b.zext(adjust, left.type))
            return b.select(adjust, b.add(remainder, right), remainder)
        if op in ("min", "max"):
            compare = b.icmp_unsigned if unsigned else b.icmp_signed
            return b.select(compare("<" if op == "min" else ">", left, right), left, right)
        raise TypeError(f"codegen cannot handle integer operator {op!r}")

    def float32_math(self, function, *args: ir.Value) -> ir.Value:
        """The polynomials are float32; in wasm, which has no libm, float64 values go through float32 and come
        back."""
        if _element(args[0].type) == _F64:
            narrow = [self.builder.fptrunc(arg, _vector(_F32, _lanes(arg))) for arg in args]
            return self.builder.fpext(function(*narrow), args[0].type)
        return function(*args)

    def libm(self, name: str, args: list[ir.Value]) -> ir.Value:
        """float64 `name` from the C library, lane by lane: float64 models keep float64 accuracy natively (the
        shared library links libm)."""
        b = self.builder
        function = self.context.function(name, _F64, [_F64] * len(args))
        if function.function_type != ir.FunctionType(_F64, [_F64] * len(args)):
            raise TargetError(
                f"a kernel is named {name!r}, as the C library's {name}, which its float64 {name} calls; "
                "give the kernel another name"
            )
        lanes = _lanes(args[0])
        if not lanes:
            return b.call(function, args)
        result = ir.Constant(args[0].type, ir.Undefined)
        for lane in range(lanes):
            position = ir.Constant(_I32, lane)
            value = b.call(function, [b.extract_element(arg, position) for arg in args])
            result = b.insert_element(result, value, position)
        return result

    def float64_call(self, name: str, args: list[ir.Value]) -> ir.Value:
        """exp, log, tanh, erf and pow of float64 values from libm."""
        return self.libm(name, args)

    def index_check(self, index: ir.Value, extent: ir.Value) -> ir.Value:
        """`index` where every lane lies in [0, extent), else 0 for the lanes outside, and the current call's
        number recorded as the run's failure."""
        b = self.builder
        outside = b.or_(b.icmp_signed("<", index, ir.Constant(index.type, None)), b.icmp_signed(">=", index, extent))
        lanes = _lanes(outside)
        anywhere = (
            b.icmp_unsigned("!=", b.bitcast(outside, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), 0))
            if lanes
            else outside
        )
        with b.if_then(anywhere, likely=False):
            b.store(b.load(self.context.current_call, typ=_I32), self.context.failed_call)
        return b.select(outside, ir.Constant(index.type, None), index)

    def expr_call(self, node: Call) -> ir.Value:
        if node.name == "index_check":
            # the index being checked is data (a Gather's indices): computed as plain, wrapping arithmetic
            with self.indexing_as(False):
                return self.index_check(*self.match(*(self.expr(arg) for arg in node.args)))
        if node.name == "dot_bytes":
            return self.dot_bytes(node)
        args = self.match(*(self.expr(arg) for arg in node.args))
        dtype = node.args[0].dtype
        if not is_float(dtype):
            if node.name == "abs":
                value = args[0]
                if dtype in _UNSIGNED:
                    return value
                return self.builder.select(
                    self.builder.icmp_signed("<", value, ir.Constant(value.type, None)), self.builder.neg(value), value
                )
            if node.name in ("floor", "ceil", "round"):
                return args[0]
            converted = [self.convert(arg, dtype, "float32") for arg in args]
            return self.convert(self.float_call(node.name, converted), "float32", node.dtype)
        return self.float_call(node.name, args)

    def float_call(self, name: str, args: list[ir.Value]) -> ir.Value:
        b = self.builder
        intrinsics = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "round": "roundeven", "abs": "fabs"}
        if name == "round" and self.target.arch in ("armv7", "arm"):
            return self.math.round_even(args[0])
        if name in intrinsics:
            return self.call(intrinsics[name], args[0])
        if name == "rsqrt":
            root = self.call("sqrt", args[0])
            return b.fdiv(_one_like(root), root)
        polynomials = {"exp": self.math.exp, "log": self.math.log}
        if _element(args[0].type) == _F64 and self.target.machine.libm:
            return self.float64_call(name, args)
        if name not in polynomials:
            raise TypeError(f"codegen cannot handle intrinsic {name!r}")
        return self.float32_math(polynomials[name], *args)

    def convert(self, value: ir.Value, source: str, dest: str) -> ir.Value:
        b, lanes = self.builder, _lanes(value)
        if source == dest:
            return value
        target_type = _vector(value_type(dest), lanes)
        if dest == "bool":
            if is_float(source):
                return b.fcmp_unordered("!=", value, ir.Constant(value.type, None))
            return b.icmp_signed("!=", value, ir.Constant(value.type, None))
        if is_float(dest):
            if is_float(source):
                result = value if value.type == target_type else _float_resize(b, value, target_type)
            elif source in _UNSIGNED:
                result = b.uitofp(value, target_type)
            else:
                result = b.sitofp(value, target_type)
            return self.to_half_and_back(result) if dest == "float16" else result
        if is_float(source):
            return b.fptoui(value, target_type) if dest in _UNSIGNED else b.fptosi(value, target_type)
        source_width, dest_width = _width(value.type), _width(target_type)
        if dest_width < source_width:
            return b.trunc(value, target_type)
        if dest_width > source_width:
            return b.zext(value, target_type) if source in _UNSIGNED else b.sext(value, target_type)
        return value
