"""Winograd convolution: a 3x3 stride-1 conv of group 1 with a param weight, whose channels are many enough for the
transforms to pay, becomes a Winograd conv over its filters transformed at compile time (graph/ops/conv.py,
winograd_weight). Hands fusion the same values, computed with fewer multiplies.

- CPU targets (`winograd`, after alter_layout): a blocked ConvNCHWc whose output rows and columns are whole tiles
  becomes a ConvWinogradNCHWc. The tile is the larger of F(4 x 4, 3 x 3) and F(2 x 2, 3 x 3) that divides the
  output: 36 products per 16 outputs and channel pair, or 16 per 4, where the window makes 9 per output.
- GPU targets (`winograd_gpu`, on the ONNX layout): a Conv of enough channels and multiply-adds becomes a
  ConvWinograd of F(4 x 4, 3 x 3) or F(2 x 2, 3 x 3), the larger that gives each transformed filter enough tiles, its
  last tiles reaching past the output where it is no whole number of them.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.ops.conv import blocked_conv_types, conv_geometry, unpack_weight, winograd_weight
from compiler.graph.ops.window import Window
from compiler.target import Target

# each tile by the fewest input channels and filters (the smaller of the two) for which it pays: the transforms cost
# a few dozen adds per tile and channel, the matmul saves 6.75 (F4) or 5 (F2) products per output and channel pair,
# so with few channels on either side the transforms outweigh them. 3x3 convs after a 1x1 one, AVX-512, 1 thread, ms
# direct / F2 / F4: 96 -> 128 on 28 x 28 1.48 / 0.76 / 0.50; 64 -> 64 on 56 x 56 1.97 / 1.29 / 0.82; 32 -> 32 on
# 64 x 64 0.64 / 0.56 / 0.58; 16 -> 32 on 32 x 32 0.080 / 0.080 / 0.109; 256 -> 256 on 14 x 14 (no 4 x 4 tiles)
# 1.90 / 0.96
MIN_CHANNELS = {4: 64, 2: 32}
# GPU targets: Winograd from this many channels (the smaller of input channels and filters) on, and the larger tile
# whose tiles per image are at least GPU_MIN_TILES: each transformed filter, (m + 2)^2 / 9 times the filter's bytes
# (4x for F(4, 3), 1.8x for F(2, 3)), is then read by that many tiles
GPU_MIN_CHANNELS = 16
GPU_MIN_TILES = 16
# and from this many multiply-adds (of the direct conv) on: each Winograd conv is three launches, two pipelines more
# to create at load, which a small conv does not win back soon (SwiftShader: odd_convnet's 61 -> 19-channel conv on
# 8 x 11, 0.9M, ran 11.6 -> 6.8 ms for 95 ms more of pipelines; squeezenet's 4-9M ones about 50 -> 10 ms each)
GPU_MIN_MACS = 1 << 22


def _square_window(node: Node, window: Window) -> bool:
    """A 3x3 stride-1 undilated window of group 1 that reads no padding it does not declare."""
    square = window.kernel == (3, 3) and window.strides == (1, 1) and window.dilations == (1, 1)
    return square and window.read_end == window.declared_end and int(node.attrs.get("group", 1)) == 1


def _float_param_weight(node: Node, graph: Graph) -> bool:
    return len(node.inputs) >= 2 and node.inputs[1] in graph.params and graph.params[node.inputs[1]].dtype == np.float32


def winograd_plan(node: Node, graph: Graph) -> tuple[int, Window] | None:
    """The tile F(m, 3) a ConvNCHWc node is computed by and its window, or None when it stays a direct conv."""
    if node.op != "ConvNCHWc" or not _float_param_weight(node, graph):
        return None
    x, weight = node.inputs[:2]
    plain_x, plain_w = blocked_conv_types(x.type, weight.type, node.attrs)
    _, window = conv_geometry("ConvNCHWc", plain_x, plain_w, node.attrs)
    if not _square_window(node, window):
        return None
    channels = min(plain_w.shape[:2])
    fits = [tile for tile, least in MIN_CHANNELS.items() if channels >= least]
    tile = next((tile for tile in fits if all(size % tile == 0 for size in window.output)), 0)
    return (tile, window) if tile else None


def gpu_winograd_plan(node: Node, graph: Graph) -> tuple[int, Window] | None:
    """The tile a plain Conv node is computed by on a GPU target and its window, or None."""
    if node.op != "Conv" or not _float_param_weight(node, graph) or len(node.inputs[0].type.shape) != 4:
        return None
    weight = node.inputs[1]
    _, window = conv_geometry("Conv", node.inputs[0].type, weight.type, node.attrs)
    macs = node.inputs[0].type.shape[0] * math.prod(weight.type.shape) * math.prod(window.output)
    if not _square_window(node, window) or min(weight.type.shape[:2]) < GPU_MIN_CHANNELS or macs < GPU_MIN_MACS:
        return None
    tiles = {tile: math.prod(-(-size // tile) for size in window.output) for tile in (4, 2)}
    tile = next((tile for tile, count in tiles.items() if count >= GPU_MIN_TILES), 0)
    return (tile, window) if tile else None


def _rewrite(graph: Graph, plan, op: str, plain_weight, attrs) -> Graph:
    """`graph` with each node that `plan` picks as an `op` node over its transformed weight."""
    result = graph.copy()
    nodes = []
    for node in result.nodes:
        found = plan(node, result)
        if found is None:
            nodes.append(node)
            continue
        (tile, window), (x, weight, *bias) = found, node.inputs
        packed = result.params[weight]
        transformed = result.add_param(f"{weight.name}_winograd{tile}", winograd_weight(plain_weight(packed), tile))
        node_attrs = {"tile": tile, "pads": [*window.pads_begin, *window.read_end], **attrs(packed)}
        nodes.append(Node(op, [x, transformed, *bias], list(node.outputs), node_attrs, node.name))
    result.nodes = nodes
    return result


def winograd(graph: Graph, target: Target) -> Graph:
    """Every ConvNCHWc that winograd_plan picks, as a ConvWinogradNCHWc of the same values."""
    return _rewrite(
        graph,
        winograd_plan,
        "ConvWinogradNCHWc",
        lambda packed: np.moveaxis(packed, -1, 1).reshape(unpack_weight(packed.shape)),
        lambda packed: {"block": packed.shape[-1]},
    )


def winograd_gpu(graph: Graph, target: Target) -> Graph:
    """Every Conv that gpu_winograd_plan picks, as a ConvWinograd of the same values."""
    return _rewrite(graph, gpu_winograd_plan, "ConvWinograd", lambda weight: weight, lambda weight: {})
