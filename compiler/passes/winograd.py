"""Winograd convolution for CPU targets, run after alter_layout: each blocked 3x3 stride-1 conv (a ConvNCHWc of
group 1 with a param weight) whose output rows and columns are whole tiles, and whose channels are many enough for
the transforms to pay, becomes a ConvWinogradNCHWc over its filters transformed at compile time
(graph/ops/nn.py, winograd_weight). Hands fusion the same values, computed with fewer multiplies.

The tile is the larger of F(4 x 4, 3 x 3) and F(2 x 2, 3 x 3) that divides the output: 36 products per 16
outputs and channel pair, or 16 per 4, where the window makes 9 per output.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.ops.nn import Window, blocked_conv_types, conv_geometry, unpack_weight, winograd_weight
from compiler.target import Target

# each tile by the fewest input channels and filters (the smaller of the two) for which it pays: the transforms cost
# a few dozen adds per tile and channel, the matmul saves 6.75 (F4) or 5 (F2) products per output and channel pair,
# so with few channels on either side the transforms outweigh them. 3x3 convs after a 1x1 one, AVX-512, 1 thread, ms
# direct / F2 / F4: 96 -> 128 on 28 x 28 1.48 / 0.76 / 0.50; 64 -> 64 on 56 x 56 1.97 / 1.29 / 0.82; 32 -> 32 on
# 64 x 64 0.64 / 0.56 / 0.58; 16 -> 32 on 32 x 32 0.080 / 0.080 / 0.109; 256 -> 256 on 14 x 14 (no 4 x 4 tiles)
# 1.90 / 0.96
MIN_CHANNELS = {4: 64, 2: 32}


def winograd_plan(node: Node, graph: Graph) -> tuple[int, Window] | None:
    """The tile F(m, 3) a ConvNCHWc node is computed by and its window, or None when it stays a direct conv."""
    if node.op != "ConvNCHWc" or len(node.inputs) < 2 or node.inputs[1] not in graph.params:
        return None
    x, weight = node.inputs[:2]
    if graph.params[weight].dtype != np.float32 or int(node.attrs.get("group", 1)) != 1:
        return None
    plain_x, plain_w = blocked_conv_types(x.type, weight.type, node.attrs)
    _, window = conv_geometry("ConvNCHWc", plain_x, plain_w, node.attrs)
    square = window.kernel == (3, 3) and window.strides == (1, 1) and window.dilations == (1, 1)
    if not square or window.read_end != window.declared_end:
        return None
    channels = min(plain_w.shape[:2])
    fits = [tile for tile, least in MIN_CHANNELS.items() if channels >= least]
    tile = next((tile for tile in fits if all(size % tile == 0 for size in window.output)), 0)
    return (tile, window) if tile else None


def winograd(graph: Graph, target: Target) -> Graph:
    """Every ConvNCHWc that winograd_plan picks, as a ConvWinogradNCHWc of the same values."""
    result = graph.copy()
    nodes = []
    for node in result.nodes:
        plan = winograd_plan(node, result)
        if plan is None:
            nodes.append(node)
            continue
        (tile, window), (x, weight, *bias) = plan, node.inputs
        packed = result.params[weight]
        plain = np.moveaxis(packed, -1, 1).reshape(unpack_weight(packed.shape))
        transformed = result.add_param(f"{weight.name}_winograd{tile}", winograd_weight(plain, tile))
        attrs = {"tile": tile, "pads": [*window.pads_begin, *window.read_end], "block": packed.shape[-1]}
        nodes.append(Node("ConvWinogradNCHWc", [x, transformed, *bias], list(node.outputs), attrs, node.name))
    result.nodes = nodes
    return result
