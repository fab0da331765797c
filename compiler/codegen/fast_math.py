"""Math intrinsics as straight-line LLVM IR for codegen/llvm/: exp, log and half-precision conversions, built from
selects, bit casts and polynomials so they work lane-wise on vectors and need no libm (wasm32 has none, and a libm
call stops vectorization natively). erf, tanh, sigmoid and pow are loop-IR rewrites over these (tir/fast_math.py)."""

from __future__ import annotations

import math

from llvmlite import ir

from compiler.tir.fast_math import EXP_POLY, LOG_POLY

_I32 = ir.IntType(32)
_F32 = ir.FloatType()

# ln 2 split so that n * _LN2_HIGH is exact for every exponent n a float32 can have.
_LN2_HIGH = 0.693359375
_LN2_LOW = -2.12194440e-4
_ROUNDING_SHIFT = 1.5 * 2.0**23


def intrinsic_suffix(ty: ir.Type) -> str:
    """LLVM's overload suffix of a scalar or vector type: f32, v16f32, i32, v16i32, f16, f64."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{intrinsic_suffix(ty.element)}"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    return {ir.HalfType(): "f16", ir.FloatType(): "f32", ir.DoubleType(): "f64"}[ty]


class FastMath:
    """Emits float32 math (scalar or vector) with `builder`; `intrinsic(name, type)` declares llvm.* calls and
    `function(name, return type, argument types)` any other declaration. `scalef`: the target scales by a power
    of two in one instruction (AVX-512's vscalefps), which LLVM's ldexp lowers to; elsewhere ldexp is a libm
    call, so exp scales with bit operations."""

    def __init__(self, builder: ir.IRBuilder, intrinsic, function, scalef: bool = False):
        self.builder = builder
        self.intrinsic = intrinsic
        self.function = function
        self.scalef = scalef

    def const(self, value: float, like: ir.Type) -> ir.Constant:
        if isinstance(like, ir.VectorType):
            return ir.Constant(like, [ir.Constant(like.element, value)] * like.count)
        return ir.Constant(like, value)

    def int_type(self, like: ir.Type) -> ir.Type:
        return ir.VectorType(_I32, like.count) if isinstance(like, ir.VectorType) else _I32

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.builder.call(self.intrinsic(name, args[0].type), list(args))

    # Products and the sums they feed may fuse into FMAs (LLVM's `contract`), as in the kernels' own arithmetic:
    # Horner steps and the range reductions become one instruction each, at one rounding instead of two.
    def fmul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.builder.fmul(a, b, flags=("contract",))

    def fadd(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.builder.fadd(a, b, flags=("contract",))

    def fsub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.builder.fsub(a, b, flags=("contract",))

    def poly(self, x: ir.Value, coefficients) -> ir.Value:
        result = self.const(coefficients[0], x.type)
        for coefficient in coefficients[1:]:
            result = self.fadd(self.fmul(result, x), self.const(coefficient, x.type))
        return result

    def clamp(self, x: ir.Value, low: float, high: float) -> ir.Value:
        """Compare-and-select rather than llvm.minnum, which wasm32 lowers to a libm call."""
        b = self.builder
        x = b.select(b.fcmp_ordered("<", x, self.const(low, x.type)), self.const(low, x.type), x)
        return b.select(b.fcmp_ordered(">", x, self.const(high, x.type)), self.const(high, x.type), x)

    def round_even(self, x: ir.Value) -> ir.Value:
        """Round half to even by adding and subtracting 2**23 (2**52 for double), which the FPU's
        default rounding does exactly; unlike llvm.roundeven it needs no libm call on ARMv7."""
        b = self.builder
        element = x.type.element if isinstance(x.type, ir.VectorType) else x.type
        shift = self.const(2.0**52 if isinstance(element, ir.DoubleType) else 2.0**23, x.type)
        magnitude = self.call("fabs", x)
        rounded = self.call("copysign", self.fsub(self.fadd(magnitude, shift), shift), x)
        return b.select(b.fcmp_ordered("<", magnitude, shift), rounded, x)

    def exp2_int(self, n: ir.Value, like: ir.Type) -> ir.Value:
        """2**n for n in [-126, 127], as float bits."""
        b = self.builder
        bits = b.shl(b.add(n, self.const(127, n.type)), self.const(23, n.type))
        return b.bitcast(bits, like)

    def exp(self, x: ir.Value) -> ir.Value:
        b, ty = self.builder, x.type
        clamped = self.clamp(x, -104.0, 88.8)
        # Adding 1.5 * 2**23 rounds x / ln 2 to an integer, to nearest even, in the float's last bits (its
        # magnitude stays under 2**22): subtracting it back gives n as a float, the bits' difference as an int.
        shifted = self.fadd(self.fmul(clamped, self.const(1 / math.log(2), ty)), self.const(_ROUNDING_SHIFT, ty))
        n = self.fsub(shifted, self.const(_ROUNDING_SHIFT, ty))
        r = self.fsub(
            self.fsub(clamped, self.fmul(n, self.const(_LN2_HIGH, ty))), self.fmul(n, self.const(_LN2_LOW, ty))
        )
        p = self.fadd(self.fadd(self.fmul(self.poly(r, EXP_POLY), self.fmul(r, r)), r), self.const(1.0, ty))
        if self.scalef and isinstance(ty, ir.VectorType) and ty.count == 16:
            # p * 2^n in one vscalefps, n as the float it already is, subnormal and overflowing results included
            scalef = self.function("llvm.x86.avx512.mask.scalef.ps.512", ty, [ty, ty, ty, ir.IntType(16), _I32])
            return b.call(scalef, [p, n, ir.Constant(ty, None), ir.Constant(ir.IntType(16), -1), ir.Constant(_I32, 4)])
        ity = self.int_type(ty)
        whole = b.sub(b.bitcast(shifted, ity), b.bitcast(self.const(_ROUNDING_SHIFT, ty), ity))
        if self.scalef:
            # the same for other widths: LLVM's ldexp becomes an int-to-float conversion and vscalefps
            ldexp = self.function(f"llvm.ldexp.{intrinsic_suffix(ty)}.{intrinsic_suffix(ity)}", ty, [ty, ity])
            return b.call(ldexp, [p, whole])
        # n spans [-150, 128]; two half-size scalings keep each power of two a normal float.
        half = b.ashr(whole, self.const(1, whole.type))
        # No special cases: past 88.72 the last multiply overflows to inf, below -103.97 it rounds to 0 (the clamp
        # keeps n where both hold), and a NaN stays NaN through p.
        return self.fmul(self.fmul(p, self.exp2_int(half, ty)), self.exp2_int(b.sub(whole, half), ty))

    def log(self, x: ir.Value) -> ir.Value:
        b, ty = self.builder, x.type
        ity = self.int_type(ty)
        # Subnormal inputs are scaled into the normal range first; their exponent is corrected below.
        subnormal = b.fcmp_ordered("<", x, self.const(1.17549435e-38, ty))
        scaled = b.select(subnormal, self.fmul(x, self.const(8388608.0, ty)), x)
        bits = b.bitcast(scaled, ity)
        exponent = b.sub(b.and_(b.lshr(bits, self.const(23, ity)), self.const(255, ity)), self.const(127, ity))
        exponent = b.select(subnormal, b.sub(exponent, self.const(23, ity)), exponent)
        mantissa_bits = b.or_(b.and_(bits, self.const(0x7FFFFF, ity)), self.const(0x3F800000, ity))
        mantissa = b.bitcast(mantissa_bits, ty)
        high = b.fcmp_ordered(">", mantissa, self.const(math.sqrt(2), ty))
        mantissa = b.select(high, self.fmul(mantissa, self.const(0.5, ty)), mantissa)
        exponent = b.select(high, b.add(exponent, self.const(1, ity)), exponent)
        f = self.fsub(mantissa, self.const(1.0, ty))
        e = b.sitofp(exponent, ty)
        z = self.fmul(f, f)
        y = self.fmul(self.fmul(self.poly(f, LOG_POLY), f), z)
        y = self.fadd(y, self.fmul(e, self.const(_LN2_LOW, ty)))
        y = self.fsub(y, self.fmul(z, self.const(0.5, ty)))
        result = self.fadd(self.fadd(f, y), self.fmul(e, self.const(_LN2_HIGH, ty)))
        result = b.select(b.fcmp_ordered("==", x, self.const(math.inf, ty)), x, result)
        result = b.select(b.fcmp_ordered("==", x, self.const(0.0, ty)), self.const(-math.inf, ty), result)
        return b.select(b.fcmp_unordered("<", x, self.const(0.0, ty)), self.const(math.nan, ty), result)

    def half_to_float(self, bits: ir.Value) -> ir.Value:
        """IEEE half bits (i16 lanes) to float32, for targets with no conversion instruction."""
        b = self.builder
        fty = ir.VectorType(_F32, bits.type.count) if isinstance(bits.type, ir.VectorType) else _F32
        ity = self.int_type(fty)
        h = b.zext(bits, ity)
        shifted = b.shl(b.and_(h, self.const(0x7FFF, ity)), self.const(13, ity))
        exponent = b.and_(shifted, self.const(0x7C00 << 13, ity))
        normal = b.add(shifted, self.const((127 - 15) << 23, ity))
        special = b.add(normal, self.const((128 - 16) << 23, ity))
        subnormal = self.fsub(
            b.bitcast(b.add(normal, self.const(1 << 23, ity)), fty), b.bitcast(self.const(113 << 23, ity), fty)
        )
        magnitude = b.select(b.icmp_unsigned("==", exponent, self.const(0x7C00 << 13, ity)), special, normal)
        magnitude = b.select(b.icmp_unsigned("==", exponent, self.const(0, ity)), b.bitcast(subnormal, ity), magnitude)
        sign = b.shl(b.and_(h, self.const(0x8000, ity)), self.const(16, ity))
        return b.bitcast(b.or_(magnitude, sign), fty)

    def float_to_half(self, x: ir.Value) -> ir.Value:
        """float32 to IEEE half bits (i16 lanes), rounding to nearest even."""
        b = self.builder
        ity = self.int_type(x.type)
        bits = b.bitcast(x, ity)
        sign = b.and_(bits, self.const(0x80000000 - (1 << 32), ity))
        magnitude = b.xor(bits, sign)
        overflow = b.select(
            b.icmp_unsigned(">", magnitude, self.const(255 << 23, ity)),
            self.const(0x7E00, ity),
            self.const(0x7C00, ity),
        )
        denorm_magic = ((127 - 15) + (23 - 10) + 1) << 23
        subnormal = b.sub(
            b.bitcast(self.fadd(b.bitcast(magnitude, x.type), b.bitcast(self.const(denorm_magic, ity), x.type)), ity),
            self.const(denorm_magic, ity),
        )
        odd = b.and_(b.lshr(magnitude, self.const(13, ity)), self.const(1, ity))
        rounded = b.add(b.add(magnitude, self.const(((15 - 127) << 23) + 0xFFF, ity)), odd)
        normal = b.lshr(rounded, self.const(13, ity))
        result = b.select(b.icmp_unsigned("<", magnitude, self.const(113 << 23, ity)), subnormal, normal)
        result = b.select(b.icmp_unsigned(">=", magnitude, self.const((127 + 16) << 23, ity)), overflow, result)
        result = b.or_(result, b.lshr(sign, self.const(16, ity)))
        i16 = ir.VectorType(ir.IntType(16), x.type.count) if isinstance(x.type, ir.VectorType) else ir.IntType(16)
        return b.trunc(result, i16)
