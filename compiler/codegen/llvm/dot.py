"""How the function emitter lowers te.dot_bytes (four uint8 activations times the four int8 bytes of an int32 weight
word, summed into an int32 lane): one instruction of the machine's integer dot product where the target has one,
else widening to 16 bits and the machine's pairwise multiply-add, else plain shifts and multiplies. The instructions
are data: a table per step, keyed by the target features that make each one available."""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen.llvm.types import _I8, _I16, _I32, _concatenate, _lanes, _lanes_of
from compiler.te.expr import Call

# The features that provide an instruction adding four u8 x s8 products per 32-bit lane into an accumulator, and
# the intrinsic, by the 32-bit lanes of one instruction: AVX-512 VNNI (vpdpbusd; 256 and 128 bits with AVX-512 VL),
# AVX-VNNI (the same instruction, VEX-encoded), AArch64's mixed-sign dot product (usdot, with the int8 matrix
# extension). The operands are (accumulator, the activations' bytes, the weights' bytes).
BYTE_DOT = (
    (("avx512vnni",), 16, "llvm.x86.avx512.vpdpbusd.512"),
    (("avx512vnni", "avx512vl"), 8, "llvm.x86.avx512.vpdpbusd.256"),
    (("avx512vnni", "avx512vl"), 4, "llvm.x86.avx512.vpdpbusd.128"),
    (("avxvnni",), 8, "llvm.x86.avx512.vpdpbusd.256"),
    (("avxvnni",), 4, "llvm.x86.avx512.vpdpbusd.128"),
    (("i8mm",), 4, "llvm.aarch64.neon.usdot.v4i32.v16i8"),
)

# Where there is none: the instruction multiplying 16-bit lanes and adding each pair of products into a 32-bit lane
# (exact: a u8 x s8 product fits 16 bits, two fit 32), by the 32-bit lanes of its result: pmaddwd on x86,
# i32x4.dot_i16x8_s in wasm SIMD128. Neighbouring lanes of its results then add up to the four products of a word.
PAIRWISE_DOT = (
    (("avx512bw",), 16, "llvm.x86.avx512.pmaddw.d.512"),
    (("avx2",), 8, "llvm.x86.avx2.pmadd.wd"),
    (("sse2",), 4, "llvm.x86.sse2.pmadd.wd"),
    (("simd128",), 4, "llvm.wasm.dot"),
)


class DotEmitter:
    """te.dot_bytes for FunctionEmitter (a mixin: its state is the emitter's)."""

    def dot_bytes(self, node: Call, total: ir.Value | None = None) -> ir.Value:
        """`total` (an int32 accumulator, or none) plus node's four products per lane."""
        b = self.builder
        *activations, word = (self.expr(arg) for arg in node.args)
        lanes = max(_lanes(value) for value in (*activations, word, *(() if total is None else (total,))))
        # the four activations as one word, lowest byte first (four adjacent loads become one 32-bit load)
        packed = None
        for position, value in enumerate(activations):
            value = b.zext(value, _I32 if not _lanes(value) else ir.VectorType(_I32, _lanes(value)))
            if position:
                value = b.shl(value, self.const(8 * position, "int32", _lanes(value)))
            packed = value if packed is None else b.or_(*self.match(packed, value))
        packed, word = self.match(packed, word)
        if total is not None:
            total, packed, word = self.match(total, packed, word)
        if not lanes:
            return self._dot_shifted(packed, word, total)
        instruction = self._dot_instruction(BYTE_DOT, lanes)
        if instruction is not None:
            name, width = instruction
            pieces = []
            for first in range(0, lanes, width):
                part = [_lanes_of(b, value, first, width) for value in (packed, word)]
                acc = (
                    ir.Constant(ir.VectorType(_I32, width), None)
                    if total is None
                    else _lanes_of(b, total, first, width)
                )
                bytes_type = ir.VectorType(_I8, 4 * width)
                function = self.context.function(name, acc.type, [acc.type, bytes_type, bytes_type])
                pieces.append(b.call(function, [acc, *(b.bitcast(value, bytes_type) for value in part)]))
            return pieces[0] if len(pieces) == 1 else _concatenate(b, pieces)
        products = self._dot_pairwise(packed, word, lanes)
        return products if total is None else b.add(total, products)

    def _dot_instruction(self, table, lanes: int) -> tuple[str, int] | None:
        """(intrinsic, its 32-bit lanes) of the widest entry of `table` the target has that divides `lanes`."""
        features = self.target.feature_set
        for needs, width, name in table:
            if all(feature in features for feature in needs) and lanes % width == 0:
                return name, width
        return None

    def _dot_pairwise(self, packed: ir.Value, word: ir.Value, lanes: int) -> ir.Value:
        """The four products per lane by 16-bit multiplies: bytes widened (activations zero-, weights sign-extended),
        multiplied and added in pairs (the machine's pairwise multiply-add, or plain arithmetic), then the pairs of
        each word added."""
        b = self.builder
        wide = ir.VectorType(_I16, 4 * lanes)
        activations = b.zext(b.bitcast(packed, ir.VectorType(_I8, 4 * lanes)), wide)
        weights = b.sext(b.bitcast(word, ir.VectorType(_I8, 4 * lanes)), wide)
        instruction = self._dot_instruction(PAIRWISE_DOT, 2 * lanes)
        if instruction is not None:
            name, width = instruction  # width: 32-bit lanes of one result
            half = ir.VectorType(_I16, 2 * width)
            result = ir.VectorType(_I32, width)
            function = self.context.function(name, result, [half, half])
            pairs = (
                _concatenate(
                    b,
                    [
                        b.call(
                            function,
                            [
                                _lanes_of(b, activations, 2 * first, 2 * width),
                                _lanes_of(b, weights, 2 * first, 2 * width),
                            ],
                        )
                        for first in range(0, 2 * lanes, width)
                    ],
                )
                if 2 * lanes > width
                else b.call(function, [activations, weights])
            )
        else:
            products = b.mul(
                b.sext(activations, ir.VectorType(_I32, 4 * lanes)), b.sext(weights, ir.VectorType(_I32, 4 * lanes))
            )
            pairs = b.add(_every_other(b, products, 0), _every_other(b, products, 1))
        return b.add(_every_other(b, pairs, 0), _every_other(b, pairs, 1))

    def _dot_shifted(self, packed: ir.Value, word: ir.Value, total: ir.Value | None) -> ir.Value:
        """One lane: each signed byte of the word shifted down, times its activation byte, added up."""
        b = self.builder
        result = total
        for position in range(4):
            weight = b.ashr(b.shl(word, ir.Constant(_I32, 24 - 8 * position)), ir.Constant(_I32, 24))
            activation = b.and_(b.lshr(packed, ir.Constant(_I32, 8 * position)), ir.Constant(_I32, 255))
            product = b.mul(weight, activation)
            result = product if result is None else b.add(result, product)
        return result


def _every_other(b: ir.IRBuilder, vector: ir.Value, first: int) -> ir.Value:
    """Lanes first, first + 2, first + 4, ... of `vector`."""
    count = _lanes(vector) // 2
    return b.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(_I32, count), list(range(first, 2 * count, 2))))
