"""Layout alteration for CPU targets, run after simplification and before fusion: convolution chains move from NCHW
to the blocked NCHW[x]c layout, x being a measured multiple of the target's float32 vector lanes.

Each 2-D Conv with a param weight that is group=1, depthwise, or grouped in whole blocks becomes a ConvNCHWc over a weight packed at compile
time as (M / x, C / group, kh, kw, x). The blocked layout then flows through every op that has a blocked form, one
rule each: elementwise ops (ReLU, Clip, residual Add, scale-shift Mul/Add with per-channel params, repacked too,
and activations broadcast per channel, such as the SE scale (N, C, 1, 1)); max and average pools (MaxPoolNCHWc,
AveragePoolNCHWc); a group-1 ConvTranspose (ConvTransposeNCHWc); global pools (a mean or max over the two spatial axes); Concat, Split and Slice on channels in
whole blocks; spatial Pad and Resize; ShuffleNet's channel shuffle (ChannelShuffleNCHWc). LayoutTransform nodes convert only where the layout must change: into the
first blocked op, and back to NCHW before an op that needs it (Flatten, a softmax, a graph output). Hands fusion a
graph whose convolution groups read and write blocked tensors.

A MatMul or Gemm whose B is a param and whose A has more than one row becomes a MatMulPacked over B packed at compile
time into panels of the target's dense column tile (pack_dense), so the dense template's register block reads B at
unit stride. Another Gemm with transB gets the target's float32 vector width as its split_lanes attribute.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.graph.ops.conv import block_channels, pack_transposed_weight
from compiler.graph.ops.dense import pack_dense_weight, pack_nibbles
from compiler.graph.ops.quantize import quantization_axis
from compiler.graph.ops.resize import ASPECT_POLICIES, attr_string, resize_plan
from compiler.graph.ops.transform import pad_widths, slice_plan
from compiler.graph.registry import get_op
from compiler.graph.sym import Sym, upper
from compiler.target import Target

# channels per block, by the target's vector width in bytes (measured on mobilenet_v2 and resnet18, 1 thread): one
# vector on AVX-512 (16 beat 8 by ~15%) and AVX2; two 128-bit vectors on wasm SIMD128 and NEON (8 beat 4 by ~35% in
# wasmtime: each broadcast input then feeds two multiply-adds).
BLOCK_BY_VECTOR_BYTES = {64: 16, 32: 8, 16: 8}

# an isolated conv (converted in and straight back out) still pays off with this many multiply-adds per element
# converted and in all: resnet18's 7x7 stem (124 per element, 118M) gains 0.8 ms of 40 ms; a lone depthwise conv
# (9 per element) loses more to the conversions than it gains, and so do tiny convs (digits: 74K in all)
ISOLATED_MACS_PER_ELEMENT = 64
ISOLATED_MIN_MACS = 1 << 22

# the columns of a packed dense weight's panel, by the target's vector width in bytes: the dense template's register
# block is tile_m rows x one panel (compiler/schedules/cpu/dense.py, "dense_packed"): four AVX-512 vectors, two of AVX2,
# two of wasm SIMD128 or NEON (XNNPACK's 4 x 8 wasm tile)
DENSE_PANEL_COLUMNS = {64: 64, 32: 16, 16: 8}

# ops that compute each element from the same element of their operands: they run in any layout
UNARY_OPS = (
    *("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Gelu"),
    *("Softplus", "Softsign", "Exp", "Neg", "Abs", "Sqrt", "Reciprocal", "Erf", "Identity"),
    # a per-tensor quantization's steps (compiler/frontend/quantized.py): x / scale, rounded, shifted, cast
    *("Round", "Floor", "Ceil", "Cast"),
)
BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu")
# ops that can make an infinity or a NaN of the finite values in padded channels (0 / 0), which a conv's zero
# weights for them would then spread (0 * inf): they read padded values only in NCHW
UNSAFE_ON_PADDING = ("Div", "Reciprocal")

# a tensor's channels are padded to whole blocks of the target's x when that wastes at most 1 / PADDED_WASTE of them
PADDED_WASTE = 8


def channel_block(target: Target) -> int:
    """The x of NCHW[x]c for `target`."""
    return BLOCK_BY_VECTOR_BYTES.get(target.vector_bytes, 8)


def pack_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """(M, C / group, kh, kw) -> (M / block, C / group, kh, kw, block)."""
    filters = weight.shape[0]
    return np.ascontiguousarray(np.moveaxis(weight.reshape(filters // block, block, *weight.shape[1:]), 1, -1))


def alter_layout(graph: Graph, target: Target) -> Graph:
    """`graph` with its convolution chains in NCHW[x]c for `target`; outputs and their names unchanged. A conv
    that would be converted in and straight back out (no other blocked conv before or after it) stays NCHW unless
    it does enough work (ISOLATED_MACS_PER_ELEMENT per converted element, ISOLATED_MIN_MACS in all): the two
    conversions would cost more than the blocked layout saves. Being linked is mutual, so leaving such convs out
    isolates no other one."""
    block = channel_block(target)
    first = _Rewriter(graph, block, excluded=set())
    result = first.run()
    isolated = first.isolated_convs()
    result = _Rewriter(graph, block, isolated).run() if isolated else result
    result = pack_dense(result, target)
    lanes = max(4, target.vector_bytes // 4)
    for node in result.nodes:
        if node.op == "Gemm" and node.attrs.get("transB", 0):
            # a transposed-B dense sums `split_lanes` interleaved partial products along the contiguous K
            # (compiler/compute/dense.py): one float32 vector of the target (mlp: 16 on AVX-512, 0.028 ms against 0.037
            # with 8; 4 in wasm, 0.107 ms against 0.143 with 16)
            node.attrs = {**node.attrs, "split_lanes": lanes}
    return result


def dense_panel(target: Target, columns: int) -> int:
    """The columns of a packed dense weight's panel for `target`: DENSE_PANEL_COLUMNS, or N rounded up to whole
    vectors when N is narrower."""
    widest = DENSE_PANEL_COLUMNS.get(target.vector_bytes, 8)
    vector = max(4, target.vector_bytes // 4)
    return min(widest, -(-columns // vector) * vector)


def pack_dense(graph: Graph, target: Target) -> Graph:
    """Every MatMul of a float32 A of more than one row (counting its leading axes) by a 2-D float32 param B, and every
    Gemm of that kind (transA 0, alpha 1, its C added with beta 1), becomes a MatMulPacked over B packed once into
    column panels (pack_dense_weight); a Gemm's C becomes an Add after it, which fusion makes the kernel's epilogue.
    A B that is a narrow weight widened (a DequantizeLinear of int8/uint8 levels, a Cast of float16; fold_constants
    kept these) is packed narrow, with its scales and zero points packed beside it, and the kernel widens each
    element as it reads it (compiler/compute/dense.py, matmul_packed): the bundle keeps the narrow bytes.
    A single row (a classifier's head, a decode step) of a float32 weight keeps its MatMul; of a narrow one it is
    packed too (packs_dense)."""
    result = graph.copy()
    producers = {value: node for node in result.nodes for value in node.outputs}
    packed: dict[tuple, list[Value]] = {}
    nodes = []
    for node in result.nodes:
        weight = _dense_weight(result, node, producers)
        if weight is None:
            nodes.append(node)
            continue
        transposed = node.op == "Gemm" and int(node.attrs.get("transB", 0))
        columns = weight.type.shape[0] if transposed else weight.type.shape[1]
        panel = dense_panel(target, columns)
        key = (weight, panel, transposed)
        if key not in packed:
            packed[key] = _packed_weight(result, weight, producers.get(weight), panel, transposed)
        *inputs, block, bits = packed[key]
        addend = node.inputs[2] if node.op == "Gemm" and len(node.inputs) > 2 else None
        (output,) = node.outputs
        product = Value(result.fresh_name(f"{output.name}_product"), output.type) if addend is not None else output
        attrs = {"columns": columns, **({"block": block} if block else {}), **({"bits": bits} if bits != 8 else {})}
        nodes.append(Node("MatMulPacked", [node.inputs[0], *inputs], [product], attrs, node.name))
        if addend is not None:
            nodes.append(Node("Add", [product, addend], [output], {}, f"{node.name}_bias"))
    result.nodes = nodes
    return result


def _packed_weight(graph: Graph, weight: Value, producer: Node | None, panel: int, transposed: bool) -> list:
    """[packed B, packed scale, packed zero point (each present or not), block, bits]: B as (N / panel, K, panel) in
    its stored dtype (4-bit levels two a byte: pack_nibbles); a scale and zero point as (N / panel, groups, panel), a
    group being `block` consecutive k (one group of all k when block is 0)."""
    name = weight.name
    if producer is None:  # a float32 param
        array = graph.params[weight]
        packed = pack_dense_weight(array.T if transposed else array, panel)
        return [graph.add_param(f"{name}_panels{panel}", packed), 0, 8]
    levels = graph.params[producer.inputs[0]]
    levels = pack_dense_weight(levels.T if transposed else levels, panel)
    if producer.op == "Cast":
        return [graph.add_param(f"{name}_panels{panel}", levels), 0, 8]
    # levels that all fit 4 bits (a 4-bit quantizer's: MatMulNBits' as unpacked, an int4 or uint4 initializer's) are
    # stored two a byte, signed ones offset by 8 (and their zero point with them)
    offset = 8 if levels.dtype == np.int8 and levels.size and -8 <= levels.min() and levels.max() <= 7 else 0
    bits = 4 if offset or (levels.dtype == np.uint8 and levels.max(initial=0) < 16) else 8
    stored = pack_nibbles((levels.astype(np.int16) + offset).astype(np.uint8)) if bits == 4 else levels
    parts = [graph.add_param(f"{name}_panels{panel}", stored)]
    scale, zero, block = _weight_groups(graph, producer, transposed)
    if offset:
        zero = (np.zeros(scale.shape, np.int16) if zero is None else zero.astype(np.int16)) + offset
    parts.append(graph.add_param(f"{name}_scale_panels{panel}", pack_dense_weight(scale, panel)))
    if zero is not None and np.any(zero):  # a symmetric weight's zero points (all 0) cost a subtraction for nothing
        parts.append(graph.add_param(f"{name}_zero_panels{panel}", pack_dense_weight(zero, panel)))
    return [*parts, block, bits]


def _weight_groups(graph: Graph, dequantize: Node, transposed: bool) -> tuple:
    """A DequantizeLinear's scale and zero point over its (K, N) weight as (groups, N) arrays and the group's length
    along K: per tensor and per column (N) one group of all k (block 0); per block along K, groups of block_size k;
    per row of K, groups of one k. A blocked scale along N is spread to every column."""
    levels, scale_value = dequantize.inputs[:2]
    zero_value = dequantize.inputs[2] if len(dequantize.inputs) > 2 else None
    granularity, axis, block_size = quantization_axis(
        levels.type, scale_value.type, dequantize.attrs, "DequantizeLinear"
    )
    inner, columns = levels.type.shape[::-1] if transposed else levels.type.shape
    k_axis = 1 if transposed else 0

    def grouped(array: np.ndarray) -> tuple[np.ndarray, int]:
        if granularity == "tensor":
            return np.broadcast_to(array.reshape(1, 1), (1, columns)), 0
        if granularity == "axis":
            along_k = axis == k_axis
            return (array.reshape(inner, 1) if along_k else array.reshape(1, columns)), int(along_k)
        array = array.T if transposed else array
        if axis == k_axis:
            return array, block_size
        return np.repeat(array, block_size, axis=1)[:, :columns], 1

    scale, block = grouped(graph.params[scale_value].astype(np.float32))
    if granularity == "axis" and block:  # one scale per k: spread over the columns
        scale = np.broadcast_to(scale, (inner, columns))
    zero = None
    if zero_value is not None:
        zero = grouped(graph.params[zero_value])[0]
        zero = np.broadcast_to(zero, scale.shape)
    return np.ascontiguousarray(scale), None if zero is None else np.ascontiguousarray(zero), block


def packs_dense(node: Node, narrow: bool = False) -> bool:
    """Whether pack_dense makes `node` a MatMulPacked once its B is a param (or, `narrow`, a narrow one widened): a
    MatMul of a float32 A of more than one row (of any rows for a narrow B, which a single row then streams at a
    quarter or half the bytes) by a 2-D float32 B, or a Gemm of that kind (transA 0, alpha 1, beta 1). The weights
    pass (passes/half_weights.py) asks the same before it stores a B as float16."""
    if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2 or len(node.outputs) != 1:
        return False
    a, weight = node.inputs[:2]
    if a is None or weight is None or a.type.dtype != "float32" or weight.type.dtype != "float32":
        return False
    if len(weight.type.shape) != 2 or len(a.type.shape) < 2:
        return False
    if upper(math.prod(a.type.shape[:-1])) < 2 and not narrow:  # (symbolic rows: packed when they may be several)
        return False
    if node.op == "Gemm":
        attrs = node.attrs
        addend = node.inputs[2] if len(node.inputs) > 2 else None
        beta = float(attrs.get("beta", 1.0)) if addend is not None else 1.0
        if int(attrs.get("transA", 0)) or float(attrs.get("alpha", 1.0)) != 1.0 or beta != 1.0:
            return False
    return True


def _dense_weight(graph: Graph, node: Node, producers: dict) -> Value | None:
    """The B of a MatMul or Gemm that pack_dense packs (a float32 param, or a narrow one widened), else None."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    narrow = weight is not None and weight not in graph.params and _packable_narrow_weight(graph, producers.get(weight))
    if not packs_dense(node, narrow) or (weight not in graph.params and not narrow):
        return None
    return weight


def _narrow_conv_weight(graph: Graph, producer: Node | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(levels, one float32 scale per filter) of a conv weight that is a DequantizeLinear of int8/uint8 param levels
    with a per-tensor or per-filter scale and no zero point (or zeros: the symmetric weights quantizers write);
    (float32 weight, None) of any other weight computed from params alone; (None, None) otherwise."""
    if producer is None or not all(value is None or value in graph.params for value in producer.inputs):
        return None, None
    if producer.op == "DequantizeLinear" and _packable_narrow_weight(graph, producer):
        levels, scale = (graph.params[value] for value in producer.inputs[:2])
        zero = graph.params[producer.inputs[2]] if len(producer.inputs) > 2 and producer.inputs[2] is not None else None
        granularity, axis, _ = quantization_axis(
            producer.inputs[0].type, producer.inputs[1].type, producer.attrs, "DequantizeLinear"
        )
        symmetric = zero is None or not np.any(zero)
        if symmetric and granularity != "block" and (granularity == "tensor" or axis == 0):
            return levels, np.broadcast_to(scale.astype(np.float32).reshape(-1), (levels.shape[0],)).copy()
    # any other weight computed from params (kept narrow for a kernel that could not take it): widened here, so the
    # conv is blocked as a float32 param's would be
    arrays = [None if value is None else graph.params[value] for value in producer.inputs]
    (array,) = get_op(producer.op).run_reference(arrays, producer.attrs)[:1]
    return np.asarray(array, dtype=np.float32), None


def _packable_narrow_weight(graph: Graph, producer: Node | None) -> bool:
    """Whether `producer` widens a narrow param that the packed kernel can read: a Cast of float16, or a
    DequantizeLinear of int8/uint8 levels with param scale and zero point."""
    if producer is None or not all(value is None or value in graph.params for value in producer.inputs):
        return False
    if producer.op == "Cast":
        return producer.inputs[0].type.dtype == "float16"
    return producer.op == "DequantizeLinear" and producer.inputs[0].type.dtype in ("int8", "uint8")


def gpu_layout(graph: Graph, target: Target) -> Graph:
    """The GPU family's layout decisions: the ONNX layouts stay, and a transposed-B Gemm keeps one sum per output
    (split_lanes 1): its K is split over threads by the GPU templates, not over a vector's lanes, and the split-K
    partial sums would be a second root stage that other blocks read (compiler/compute/dense.py defaults to 16)."""
    result = graph.copy()
    for node in result.nodes:
        if node.op == "Gemm" and node.attrs.get("transB", 0):
            node.attrs = {**node.attrs, "split_lanes": 1}
    return result


class _Rewriter:
    def __init__(self, graph: Graph, block: int, excluded: set[int]):
        self.graph = graph.copy()
        self.block = block
        self.excluded = excluded  # positions of the convs to leave in NCHW
        self.nodes: list[Node] = []
        self.blocked: dict[tuple[Value, int], Value] = {}  # (NCHW value, x) -> its NCHW[x]c twin
        self.first_block: dict[Value, int] = {}  # NCHW value -> the x of its first twin
        self.only_blocked: dict[Value, int] = {}  # values whose NCHW form nobody has made yet -> their twin's x
        self.converted: dict[int, Node] = {}  # position of each converted conv -> its ConvNCHWc
        self.readers: dict[Value, list[Node]] = {}
        self.producers = {value: node for node in self.graph.nodes for value in node.outputs}
        for node in self.graph.nodes:
            for value in node.inputs:
                self.readers.setdefault(value, []).append(node)
        self.absorbed: set[int] = set()  # ids of nodes a rule has rewritten together with an earlier one
        self.rules = {
            "Conv": self._conv,
            "ConvTranspose": self._conv_transpose,
            "MaxPool": self._pool,
            "AveragePool": self._pool,
            "GlobalAveragePool": self._global_pool,
            "GlobalMaxPool": self._global_pool,
            "Concat": self._concat,
            "Split": self._split,
            "Slice": self._slice,
            "Pad": self._pad,
            "Resize": self._resize,
            "Reshape": self._channel_shuffle,
            **dict.fromkeys((*UNARY_OPS, *BINARY_OPS), self._elementwise),
        }

    def run(self) -> Graph:
        for position, node in enumerate(self.graph.nodes):
            if id(node) in self.absorbed:
                continue
            rule = self.rules.get(node.op)
            if node.op == "Conv" and position in self.excluded:
                rule = None
            if rule is not None and rule(node):
                if node.op == "Conv":
                    self.converted[position] = self.nodes[-1]
            else:
                for value in node.inputs:
                    self._plain(value)
                self.nodes.append(node)
        for value in self.graph.outputs:
            self._plain(value)
        self.graph.nodes = self.nodes
        return self.graph

    def isolated_convs(self) -> set[int]:
        """Positions of converted convs that reach no other ConvNCHWc through blocked values (elementwise ops,
        pools, concats...), either way, and do too little work to pay for their conversions."""
        producers = {value: node for node in self.nodes for value in node.outputs}
        readers: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                readers.setdefault(value, []).append(node)
        twins = set(self.blocked.values())

        def neighbours(node: Node) -> list[Node]:
            before = [producers[value] for value in node.inputs if value in producers]
            return before + [reader for value in node.outputs for reader in readers.get(value, [])]

        def linked(conv: Node) -> bool:
            pending, seen = [conv], {id(conv)}
            while pending:
                for neighbour in neighbours(pending.pop()):
                    if neighbour.op == "ConvNCHWc" and neighbour is not conv:
                        return True
                    flows = neighbour.op != "LayoutTransform" and any(v in twins for v in neighbour.outputs)
                    if flows and id(neighbour) not in seen:
                        seen.add(id(neighbour))
                        pending.append(neighbour)
            return False

        def cheap(conv: Node) -> bool:
            x, weight = conv.inputs[:2]
            (output,) = conv.outputs
            # a packed weight is (M / x, C / group, kh, kw, x): each output sums (C / group) * kh * kw products
            macs = output.type.size * math.prod(weight.type.shape[1:4])
            return macs < max(ISOLATED_MIN_MACS, ISOLATED_MACS_PER_ELEMENT * (x.type.size + output.type.size))

        return {position for position, conv in self.converted.items() if cheap(conv) and not linked(conv)}

    def _block_for(self, channels: int) -> int:
        """The x for a tensor of `channels`: the target's block, also when padding the last block wastes at most
        1 / PADDED_WASTE of it (1000 classes in 63 blocks of 16), else half of it (mobilenet's 24 channels with
        16), else 0 (stays NCHW, as a symbolic number of channels does)."""
        if isinstance(channels, Sym):
            return 0
        if channels > self.block and (-channels % self.block) * PADDED_WASTE <= channels:
            return self.block
        for block in (self.block, self.block // 2):
            if block >= 4 and channels % block == 0:
                return block
        return 0

    def _shape(self, value: Value, block: int) -> tuple[int, ...]:
        """The NCHW[block]c shape of `value` (a 1-D one as a row of height 1), its channels padded to whole
        blocks."""
        batch, channels, *spatial = value.type.shape
        return (batch, -(-channels // block), *([1] * (2 - len(spatial))), *spatial, block)

    @staticmethod
    def _padding(value: Value, block: int) -> dict:
        """A LayoutTransform's attrs for the channels past `value`'s whole blocks, if it has any."""
        channels = value.type.shape[1]
        return {"channels": channels} if channels % block else {}

    def _blocked_of(self, value: Value, block: int) -> Value:
        """The NCHW[block]c twin of `value`, converting it now if nothing made it yet."""
        key = (value, block)
        if key not in self.blocked:
            self._plain(value)
            twin = self._twin(value, self._shape(value, block))
            attrs = {"src": _plain_layout(value), "dst": f"NCHW{block}c", **self._padding(value, block)}
            self.nodes.append(Node("LayoutTransform", [value], [twin], attrs, f"{value.name}_to_nchw{block}c"))
            self._record(value, block, twin)
        return self.blocked[key]

    def _record(self, value: Value, block: int, twin: Value) -> None:
        self.blocked[(value, block)] = twin
        self.first_block.setdefault(value, block)

    def _plain(self, value: Value | None) -> None:
        """Make `value` in NCHW (from its blocked twin) if only the twin exists so far."""
        if value is None or value not in self.only_blocked:
            return
        block = self.only_blocked.pop(value)
        attrs = {"src": f"NCHW{block}c", "dst": _plain_layout(value), **self._padding(value, block)}
        self.nodes.append(
            Node("LayoutTransform", [self.blocked[(value, block)]], [value], attrs, f"{value.name}_to_nchw")
        )

    def _twin(self, value: Value, shape: tuple[int, ...]) -> Value:
        return Value(self.graph.fresh_name(f"{value.name}_nchwc"), TensorType(shape, value.type.dtype))

    def _replace(self, node: Node, op: str, inputs: list, attrs: dict, block: int) -> None:
        """Emit `op` computing the NCHW[block]c twins of `node`'s outputs."""
        twins = []
        for output in node.outputs:
            twins.append(self._twin(output, self._shape(output, block)))
            self._record(output, block, twins[-1])
            self.only_blocked[output] = block
        self.nodes.append(Node(op, inputs, twins, attrs, node.name))

    def _blocked_input(self, node: Node, ranks: tuple[int, ...] = (4,)) -> int:
        """The x of the twin of `node`'s first input when it is a value of one of `ranks` already blocked (ops that
        only follow a blocked layout, never start one) and its outputs have its rank, else 0."""
        x = node.inputs[0] if node.inputs else None
        if (
            x is None
            or len(x.type.shape) not in ranks
            or any(len(v.type.shape) != len(x.type.shape) for v in node.outputs)
        ):
            return 0
        return self.first_block.get(x, 0)

    def _conv(self, node: Node) -> bool:
        if len(node.inputs) < 2 or len(node.outputs) != 1:
            return False
        x, weight = node.inputs[:2]
        array, scale = self.graph.params.get(weight), None
        if array is None:  # int8/uint8 levels dequantized per filter: kept narrow, scaled as the kernel stores
            array, scale = _narrow_conv_weight(self.graph, self.producers.get(weight))
        elif array.dtype != np.float32:
            return False
        if array is None or array.ndim not in (3, 4) or len(x.type.shape) != array.ndim:
            return False
        attrs = dict(node.attrs)
        if array.ndim == 3:  # a 1-D conv is a 2-D one over a row of height 1
            array, attrs = array[:, :, None, :], _as_2d(attrs)
        channels, filters, group = x.type.shape[1], array.shape[0], int(node.attrs.get("group", 1))
        block = self._block_for(filters)
        depthwise = 1 < group == channels == filters
        if depthwise:
            # channels short of a whole block are padded as the filters are (72 in blocks of 16: 80), the extra
            # channels' filters zeros. In NCHW, mobilenet_v3_small's 72-, 88- and 120-channel depthwise convs read
            # their blocked inputs through a conversion, 0.09-0.12 ms each against onnxruntime's 0.014 (1 thread)
            input_block = block
        elif group == 1:
            # the input keeps the block it has; a few input channels (an RGB image) form one block of their own
            made = self.first_block.get(x, 0)
            input_block = made or self._block_for(channels) or (channels if channels < self.block else 0)
        else:
            # groups of whole blocks (ResNeXt, RegNet, ShuffleNet v1): a block never spans two groups
            input_block = self.first_block.get(x, 0) or self._block_for(channels // group)
            if input_block and (channels // group % input_block or filters // group % block):
                input_block = 0
        if not block or not input_block:
            return False
        # padded channels: the packed weight's extra filters and input channels are zeros, and so are the bias's
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        padded_filters = -(-filters // block) * block
        if padded_filters != filters and bias is not None and bias not in self.graph.params:
            return False
        array = np.pad(array, [(0, padded_filters - filters), (0, 0), (0, 0), (0, 0)])
        if group == 1:
            array = np.pad(array, [(0, 0), (0, -channels % input_block), (0, 0), (0, 0)])
        packed = self.graph.add_param(f"{weight.name}_packed{block}", pack_weight(array, block))
        if padded_filters != filters and bias is not None:
            padded = np.pad(self.graph.params[bias], (0, padded_filters - filters))
            bias = self.graph.add_param(f"{bias.name}_padded", padded)
        if depthwise:
            attrs["group"] = padded_filters
        inputs = [self._blocked_of(x, input_block), packed, *([bias] if bias is not None else [])]
        if scale is not None:
            if bias is None:  # the scale is input 3
                bias = self.graph.add_param(f"{weight.name}_zero_bias", np.zeros(padded_filters, np.float32))
                inputs.append(bias)
            padded_scale = np.pad(scale, (0, padded_filters - filters))
            inputs.append(self.graph.add_param(f"{weight.name}_scale{block}", padded_scale))
        self._replace(node, "ConvNCHWc", inputs, attrs, block)
        return True

    def _conv_transpose(self, node: Node) -> bool:
        """A group-1 2-D ConvTranspose (a U-Net's upsampling) of a blocked value, with a param weight, stays blocked
        as a ConvTransposeNCHWc over its weight packed as (M / x, C, kh, kw, x)."""
        block = self._blocked_input(node)
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        array = self.graph.params.get(weight)
        if not block or array is None or array.ndim != 4 or int(node.attrs.get("group", 1)) != 1:
            return False
        filters = self._block_for(array.shape[1])
        if not filters or array.shape[1] % filters or node.inputs[0].type.shape[1] % block or array.dtype != np.float32:
            return False
        packed = self.graph.add_param(f"{weight.name}_packed{filters}", pack_transposed_weight(array, filters))
        inputs = [self.blocked[(node.inputs[0], block)], packed, *node.inputs[2:]]
        self._replace(node, "ConvTransposeNCHWc", inputs, dict(node.attrs), filters)
        return True

    def _pool(self, node: Node) -> bool:
        """A MaxPool (values only) or AveragePool whose input is already blocked stays blocked, ceil_mode and
        padding included: the pool's vector loop then runs over the channel block, and the chain needs no
        conversion around it."""
        block = self._blocked_input(node, ranks=(3, 4))
        if not block or len(node.outputs) != 1:
            return False
        x = self.blocked[(node.inputs[0], block)]
        attrs = _as_2d(node.attrs) if len(node.inputs[0].type.shape) == 3 else dict(node.attrs)
        self._replace(node, f"{node.op}NCHWc", [x], attrs, block)
        return True

    def _global_pool(self, node: Node) -> bool:
        """A global pool of a blocked value is a mean (max) over its two spatial axes, (N, C / x, 1, 1, x): the SE
        block's squeeze then stays blocked, and so does the scale it computes."""
        block = self._blocked_input(node, ranks=(3, 4))
        if not block:
            return False
        op = "ReduceMean" if node.op == "GlobalAveragePool" else "ReduceMax"
        self._replace(node, op, [self.blocked[(node.inputs[0], block)]], {"axes": (2, 3), "keepdims": 1}, block)
        return True

    def _concat(self, node: Node) -> bool:
        """A Concat on channels stays blocked when its blocked inputs share one x and every input's channel count
        is a multiple of it: along C / x it is the same concatenation (a plain input is converted to join).
        Otherwise it runs in NCHW, its blocked inputs converted inside its kernel (fusion joins them)."""
        parts = [value for value in node.inputs if value is not None]
        if any(len(value.type.shape) != 4 for value in parts) or int(node.attrs.get("axis", 0)) not in (1, -3):
            return False
        blocks = {self.first_block[value] for value in parts if value in self.first_block}
        if len(blocks) != 1:
            return False
        (block,) = blocks
        if any(value.type.shape[1] % block for value in parts):
            return False
        inputs = [self._blocked_of(value, block) for value in parts]
        self._replace(node, "Concat", inputs, {**node.attrs, "axis": 1}, block)
        return True

    def _split(self, node: Node) -> bool:
        """A Split on channels of a blocked value into parts that are whole blocks stays blocked."""
        block = self._blocked_input(node)
        x = node.inputs[0]
        axis = int(node.attrs.get("axis", 0))
        if not block or axis not in (1, -3):
            return False
        sizes = [value.type.shape[1] for value in node.outputs]
        if any(size % block for size in sizes):
            return False
        attrs = {key: value for key, value in node.attrs.items() if key != "num_outputs"}
        attrs.update(axis=1, split=tuple(size // block for size in sizes))
        self._replace(node, "Split", [self.blocked[(x, block)]], attrs, block)
        return True

    def _slice(self, node: Node) -> bool:
        """A Slice of a blocked value with positive steps stays blocked when on channels it keeps whole blocks with
        step 1: C / x is sliced by whole blocks, the spatial axes as they were."""
        block = self._blocked_input(node)
        if not block:
            return False
        x = node.inputs[0]
        slices, _ = slice_plan(x.type.shape, **node.attrs)
        pieces = [piece.indices(size) for piece, size in zip(slices, x.type.shape)]
        start, stop, step = pieces[1]
        if any(stride < 0 for _, _, stride in pieces) or step != 1 or start % block or stop % block:
            return False
        kept = [axis for axis, piece in enumerate(pieces) if piece != (0, x.type.shape[axis], 1)] or [1]
        divisors = [block if axis == 1 else 1 for axis in kept]
        attrs = {
            "starts": tuple(pieces[axis][0] // d for axis, d in zip(kept, divisors)),
            "ends": tuple(pieces[axis][1] // d for axis, d in zip(kept, divisors)),
            "axes": tuple(kept),
            "steps": tuple(pieces[axis][2] for axis in kept),
        }
        self._replace(node, "Slice", [self.blocked[(x, block)]], attrs, block)
        return True

    def _pad(self, node: Node) -> bool:
        """A Pad of a blocked value that leaves the channels alone stays blocked, the block axis unpadded."""
        block = self._blocked_input(node)
        if not block:
            return False
        widths = pad_widths(node.inputs[0].type.shape, **node.attrs)
        if widths[1] != (0, 0):
            return False
        widths = [*widths, (0, 0)]
        attrs = {key: value for key, value in node.attrs.items() if key != "axes"}
        attrs["pads"] = tuple(begin for begin, _ in widths) + tuple(end for _, end in widths)
        self._replace(node, "Pad", [self.blocked[(node.inputs[0], block)]], attrs, block)
        return True

    def _resize(self, node: Node) -> bool:
        """A Resize of a blocked value over its spatial axes only stays blocked: the same resize over axes 2 and 3
        of the blocked tensor, its scales or sizes for those two."""
        block = self._blocked_input(node)
        roi = node.attrs.get("roi")
        if not block or (roi is not None and len(roi)):
            return False
        x = node.inputs[0]
        plan = resize_plan(x.type.shape, node.attrs)
        stretched = attr_string(node.attrs, "keep_aspect_ratio_policy", "stretch", ASPECT_POLICIES) == "stretch"
        if plan.output[:2] != x.type.shape[:2] or plan.scales[:2] != (1.0, 1.0) or not stretched:
            return False
        attrs = {key: value for key, value in node.attrs.items() if key not in ("scales", "sizes", "axes")}
        if node.attrs.get("scales") is not None and len(node.attrs["scales"]):
            attrs["scales"] = plan.scales[2:]
        else:
            attrs["sizes"] = plan.output[2:]
        attrs["axes"] = (2, 3)
        self._replace(node, "Resize", [self.blocked[(x, block)]], attrs, block)
        return True

    def _only_reader(self, value: Value, op: str) -> Node | None:
        """The one node that reads `value`, when it is an `op` and `value` is no graph output."""
        readers = self.readers.get(value, [])
        if len(readers) != 1 or readers[0].op != op or value in self.graph.outputs:
            return None
        return readers[0]

    def _channel_shuffle(self, node: Node) -> bool:
        """ShuffleNet's channel shuffle of a blocked value, Reshape (N, C, H, W) -> (N, g, C / g, H, W), Transpose
        (0, 2, 1, 3, 4), Reshape back to (N, C, H, W), is one ChannelShuffleNCHWc when g divides the block and the
        block divides C / g: the value stays blocked, and the Concat before it and the Split after it with it."""
        x = node.inputs[0]
        block = self.first_block.get(x, 0) if len(x.type.shape) == 4 else 0
        transpose = self._only_reader(node.outputs[0], "Transpose") if len(node.outputs) == 1 else None
        if not block or transpose is None or tuple(transpose.attrs.get("perm", ())) != (0, 2, 1, 3, 4):
            return False
        back = self._only_reader(transpose.outputs[0], "Reshape")
        (batch, channels, *spatial), split = x.type.shape, node.outputs[0].type.shape
        if back is None or back.outputs[0].type.shape != x.type.shape or len(split) != 5:
            return False
        groups = split[1]
        if split != (batch, groups, channels // groups, *spatial) or channels % block:
            return False
        if groups < 2 or block % groups or (channels // groups) % block:
            return False
        self.absorbed.update((id(transpose), id(back)))
        self._replace(back, "ChannelShuffleNCHWc", [self.blocked[(x, block)]], {"groups": groups}, block)
        return True

    def _elementwise(self, node: Node) -> bool:
        if len(node.outputs) != 1:
            return False
        shape = node.outputs[0].type.shape
        operands = [value for value in node.inputs if value is not None]
        if node.op in UNARY_OPS and len(operands) != 1:
            return False
        block = self._block_for(shape[1]) if len(shape) in (3, 4) else 0
        if not block or not any((value, block) in self.blocked for value in operands):
            return False
        if shape[1] % block and node.op in UNSAFE_ON_PADDING and not self._nonzero_divisor(node):
            return False
        activations = [value not in self.graph.params and _broadcasts_per_channel(value, shape) for value in operands]
        if not all(active or self._channel_param(value, shape) for value, active in zip(operands, activations)):
            return False
        inputs = [
            self._blocked_of(value, block) if active else self._repack(value, shape[1], block)
            for value, active in zip(operands, activations)
        ]
        self._replace(node, node.op, inputs, dict(node.attrs), block)
        return True

    def _nonzero_divisor(self, node: Node) -> bool:
        """A Div by a param without zeros (a quantization's scale) keeps padded channels' zeros zero."""
        divisor = self.graph.params.get(node.inputs[1]) if node.op == "Div" and len(node.inputs) > 1 else None
        return divisor is not None and bool(np.all(divisor != 0))

    def _channel_param(self, value: Value, shape: tuple[int, ...]) -> bool:
        """Whether a param operand broadcast against NCHW (or NCW) `shape` has a blocked form: a scalar, or per
        channel as (C, 1, 1) or (1, C, 1, 1) ((C, 1) or (1, C, 1))."""
        array = self.graph.params.get(value)
        if array is None:
            return False
        trailing = (shape[1], *(1,) * (len(shape) - 2))
        per_channel = array.ndim in (len(shape) - 1, len(shape)) and array.shape[-len(trailing) :] == trailing
        return array.size == 1 or (per_channel and array.size == shape[1])

    def _repack(self, value: Value, channels: int, block: int) -> Value:
        """The param as broadcast against NCHW[block]c: a scalar as it is, per-channel ones as (C / x, 1, 1, x)."""
        array = self.graph.params[value]
        if array.size == 1:
            return value
        blocked = block_channels(array.reshape(1, channels, 1, 1), block)[0]
        return self.graph.add_param(f"{value.name}_nchw{block}c", blocked)


def _plain_layout(value: Value) -> str:
    """The LayoutTransform name of a plain value's layout: NCW for a 1-D one, else NCHW."""
    return "NCW" if len(value.type.shape) == 3 else "NCHW"


def _as_2d(attrs: dict) -> dict:
    """A 1-D conv's or pool's attrs as those of the 2-D one over a row of height 1."""
    result = dict(attrs)
    for name, fill in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if attrs.get(name) is not None:
            result[name] = (fill, *attrs[name])
    if attrs.get("pads") is not None:
        begin, end = attrs["pads"]
        result["pads"] = (0, begin, 0, end)
    return result


def _broadcasts_per_channel(value: Value, shape: tuple[int, ...]) -> bool:
    """Whether an activation operand of an elementwise op with output `shape` (N, C, H, W) is (N or 1, C, H or 1,
    W or 1): its blocked twin then broadcasts against the output's the same way (the SE scale (N, C, 1, 1))."""
    operand = value.type.shape
    if len(operand) != len(shape) or operand[1] != shape[1]:
        return False
    return all(size in (1, full) for axis, (size, full) in enumerate(zip(operand, shape)) if axis != 1)
