"""Layout alteration for CPU targets, run after simplification and before fusion: convolution chains move from NCHW
to the blocked NCHW[x]c layout, x being a measured multiple of the target's float32 vector lanes.

Each 2-D Conv with a param weight that is group=1 or depthwise becomes a ConvNCHWc over a weight packed at compile
time as (M / x, C / group, kh, kw, x); the elementwise ops after it (ReLU, Clip, residual Add, scale-shift Mul/Add
with per-channel params, repacked too) follow it into the blocked layout, and so does a MaxPool of a blocked value
(MaxPoolNCHWc). LayoutTransform nodes convert only where the layout must change: into the first blocked op, and back
to NCHW before an op that needs it (GlobalAveragePool, Flatten, a graph output). Hands fusion a graph whose
convolution groups read and write blocked tensors. A Gemm with transB gets the target's float32 vector width as
its split_lanes attribute (see alter_layout).
"""

from __future__ import annotations

import math

import numpy as np

from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.graph.ops.nn import block_channels
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

# ops that compute each element from the same element of their operands: they run in any layout
UNARY_OPS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu")
BINARY_OPS = ("Add", "Sub", "Mul", "Div")


def channel_block(target: Target | str) -> int:
    """The x of NCHW[x]c for `target`."""
    return BLOCK_BY_VECTOR_BYTES.get(Target.parse(target).vector_bytes, 8)


def pack_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """(M, C / group, kh, kw) -> (M / block, C / group, kh, kw, block)."""
    filters = weight.shape[0]
    return np.ascontiguousarray(np.moveaxis(weight.reshape(filters // block, block, *weight.shape[1:]), 1, -1))


def alter_layout(graph: Graph, target: Target | str = "llvm") -> Graph:
    """`graph` with its convolution chains in NCHW[x]c for `target`; outputs and their names unchanged. A conv
    that would be converted in and straight back out (no other blocked conv before or after it) stays NCHW unless
    it does enough work (ISOLATED_MACS_PER_ELEMENT per converted element, ISOLATED_MIN_MACS in all): the two
    conversions would cost more than the blocked layout saves. Being linked is mutual, so leaving such convs out
    isolates no other one."""
    target = Target.parse(target)
    block = channel_block(target)
    first = _Rewriter(graph, block, excluded=set())
    result = first.run()
    isolated = first.isolated_convs()
    result = _Rewriter(graph, block, isolated).run() if isolated else result
    lanes = max(4, target.vector_bytes // 4)
    for node in result.nodes:
        if node.op == "Gemm" and node.attrs.get("transB", 0):
            # a transposed-B dense sums `split_lanes` interleaved partial products along the contiguous K
            # (compiler/ops/nn.py): one float32 vector of the target (mlp: 16 on AVX-512, 0.028 ms against 0.037
            # with 8; 4 in wasm, 0.107 ms against 0.143 with 16)
            node.attrs = {**node.attrs, "split_lanes": lanes}
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

    def run(self) -> Graph:
        for position, node in enumerate(self.graph.nodes):
            if position not in self.excluded and self._conv(node):
                self.converted[position] = self.nodes[-1]
            elif not (self._pool(node) or self._elementwise(node)):
                for value in node.inputs:
                    self._plain(value)
                self.nodes.append(node)
        for value in self.graph.outputs:
            self._plain(value)
        self.graph.nodes = self.nodes
        return self.graph

    def isolated_convs(self) -> set[int]:
        """Positions of converted convs that reach no other ConvNCHWc through blocked elementwise ops, either way,
        and do too little work to pay for their conversions."""
        producers = {value: node for node in self.nodes for value in node.outputs}
        readers: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                readers.setdefault(value, []).append(node)

        def linked(node: Node, step) -> bool:
            pending, seen = [node], set()
            while pending:
                for neighbour in step(pending.pop()):
                    if neighbour.op == "ConvNCHWc":
                        return True
                    if neighbour.op in (*UNARY_OPS, *BINARY_OPS) and id(neighbour) not in seen:
                        seen.add(id(neighbour))
                        pending.append(neighbour)
            return False

        def upstream(node: Node) -> list[Node]:
            return [producers[value] for value in node.inputs if value in producers]

        def downstream(node: Node) -> list[Node]:
            return [reader for value in node.outputs for reader in readers.get(value, [])]

        def cheap(conv: Node) -> bool:
            x, weight = conv.inputs[:2]
            (output,) = conv.outputs
            # a packed weight is (M / x, C / group, kh, kw, x): each output sums (C / group) * kh * kw products
            macs = output.type.size * math.prod(weight.type.shape[1:4])
            return macs < max(ISOLATED_MIN_MACS, ISOLATED_MACS_PER_ELEMENT * (x.type.size + output.type.size))

        return {
            position
            for position, conv in self.converted.items()
            if cheap(conv) and not linked(conv, upstream) and not linked(conv, downstream)
        }

    def _block_for(self, channels: int) -> int:
        """The x for a tensor of `channels`: the target's block, else half of it (mobilenet's 24 channels with 16),
        else 0 (stays NCHW)."""
        for block in (self.block, self.block // 2):
            if block >= 4 and channels % block == 0:
                return block
        return 0

    def _blocked_of(self, value: Value, block: int) -> Value:
        """The NCHW[block]c twin of `value`, converting it now if nothing made it yet."""
        key = (value, block)
        if key not in self.blocked:
            self._plain(value)
            batch, channels, height, width = value.type.shape
            twin = self._twin(value, (batch, channels // block, height, width, block))
            attrs = {"src": "NCHW", "dst": f"NCHW{block}c"}
            self.nodes.append(Node("LayoutTransform", [value], [twin], attrs, f"{value.name}_to_nchw{block}c"))
            self.blocked[key] = twin
            self.first_block.setdefault(value, block)
        return self.blocked[key]

    def _plain(self, value: Value | None) -> None:
        """Make `value` in NCHW (from its blocked twin) if only the twin exists so far."""
        if value is None or value not in self.only_blocked:
            return
        block = self.only_blocked.pop(value)
        attrs = {"src": f"NCHW{block}c", "dst": "NCHW"}
        self.nodes.append(
            Node("LayoutTransform", [self.blocked[(value, block)]], [value], attrs, f"{value.name}_to_nchw")
        )

    def _twin(self, value: Value, shape: tuple[int, ...]) -> Value:
        return Value(self.graph.fresh_name(f"{value.name}_nchwc"), TensorType(shape, value.type.dtype))

    def _replace(self, node: Node, op: str, inputs: list, attrs: dict, block: int) -> None:
        """Emit `op` computing the NCHW[block]c twin of `node`'s single output."""
        (output,) = node.outputs
        batch, channels, height, width = output.type.shape
        twin = self._twin(output, (batch, channels // block, height, width, block))
        self.nodes.append(Node(op, inputs, [twin], attrs, node.name))
        self.blocked[(output, block)] = twin
        self.first_block.setdefault(output, block)
        self.only_blocked[output] = block

    def _conv(self, node: Node) -> bool:
        if node.op != "Conv" or len(node.inputs) < 2 or len(node.outputs) != 1:
            return False
        x, weight = node.inputs[:2]
        array = self.graph.params.get(weight)
        if array is None or array.dtype != np.float32 or array.ndim != 4 or len(x.type.shape) != 4:
            return False
        channels, filters, group = x.type.shape[1], array.shape[0], int(node.attrs.get("group", 1))
        block = self._block_for(filters)
        if group == 1:
            # the input keeps the block it has; a few input channels (an RGB image) form one block of their own
            made = self.first_block.get(x, 0)
            input_block = made or self._block_for(channels) or (channels if channels < self.block else 0)
        else:
            input_block = block if group == channels == filters else 0
        if not block or not input_block:
            return False
        packed = self.graph.add_param(f"{weight.name}_packed{block}", pack_weight(array, block))
        inputs = [self._blocked_of(x, input_block), packed, *node.inputs[2:]]
        self._replace(node, "ConvNCHWc", inputs, dict(node.attrs), block)
        return True

    def _pool(self, node: Node) -> bool:
        """A MaxPool (values only) whose input is already blocked stays blocked: the pool's vector loop then runs
        over the channel block, and the chain needs no conversion around it."""
        if node.op != "MaxPool" or len(node.outputs) != 1 or len(node.inputs[0].type.shape) != 4:
            return False
        x = node.inputs[0]
        block = self.first_block.get(x, 0)
        if not block:
            return False
        self._replace(node, "MaxPoolNCHWc", [self.blocked[(x, block)]], dict(node.attrs), block)
        return True

    def _elementwise(self, node: Node) -> bool:
        if node.op not in (*UNARY_OPS, *BINARY_OPS) or len(node.outputs) != 1:
            return False
        shape = node.outputs[0].type.shape
        operands = [value for value in node.inputs if value is not None]
        if node.op in UNARY_OPS and len(operands) != 1:
            return False
        block = self._block_for(shape[1]) if len(shape) == 4 else 0
        if not block or not any((value, block) in self.blocked for value in operands):
            return False
        activations = [value.type.shape == shape and value not in self.graph.params for value in operands]
        if not all(active or self._channel_param(value, shape[1]) for value, active in zip(operands, activations)):
            return False
        inputs = [
            self._blocked_of(value, block) if active else self._repack(value, shape[1], block)
            for value, active in zip(operands, activations)
        ]
        self._replace(node, node.op, inputs, dict(node.attrs), block)
        return True

    def _channel_param(self, value: Value, channels: int) -> bool:
        """Whether a param operand broadcast against NCHW has a blocked form: a scalar, or per channel as
        (C, 1, 1) or (1, C, 1, 1)."""
        array = self.graph.params.get(value)
        if array is None:
            return False
        per_channel = array.ndim in (3, 4) and array.shape[-3:] == (channels, 1, 1) and array.size == channels
        return array.size == 1 or per_channel

    def _repack(self, value: Value, channels: int, block: int) -> Value:
        """The param as broadcast against NCHW[block]c: a scalar as it is, per-channel ones as (C / x, 1, 1, x)."""
        array = self.graph.params[value]
        if array.size == 1:
            return value
        blocked = block_channels(array.reshape(1, channels, 1, 1), block)[0]
        return self.graph.add_param(f"{value.name}_nchw{block}c", blocked)
