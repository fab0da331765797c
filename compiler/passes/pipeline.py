"""The graph pass pipeline: the frontend's graph goes through PASSES in order, then (given a target) the layout
passes of its family, then fusion.

Hands the kernel stage a verified graph of fused groups (or, with fuse=False, the simplified graph).
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.errors import TesselError
from compiler.graph.ir import Graph, GraphError
from compiler.passes.alter_layout import alter_layout, gpu_layout
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_constants import fold_constants, fold_decompressions
from compiler.passes.fuse_attention import fuse_attention
from compiler.passes.fuse_ops import fuse_ops
from compiler.passes.integer_products import integer_products
from compiler.passes.narrow_int64 import narrow_int64
from compiler.passes.simplify import simplify
from compiler.passes.widen_half import widen_half
from compiler.passes.winograd import winograd, winograd_gpu
from compiler.target import Target

# folding again after simplify catches constants that only became foldable once Identity/Reshape chains went away
PASSES = [
    fold_constants,
    eliminate_dead,
    fold_batchnorm,
    simplify,
    fold_constants,
    eliminate_dead,
]


# The layout passes of each target family, after PASSES. NCHW[x]c (alter_layout) is a CPU decision: a block of
# channels is a vector register; so is Winograd (winograd), whose transforms are vector adds over a block, and one
# Attention op per attention block (fuse_attention), whose template has no GPU counterpart yet. GPU
# kernels keep the ONNX layout and spread threads over it (gpu_layout), and store int64 tensors as int32 on a device
# without int64 (narrow_int64: a no-op where the device has it).
LAYOUT_PASSES: dict[str, list[Callable[[Graph, Target], Graph]]] = {
    "cpu": [widen_half, fuse_attention, alter_layout, integer_products, winograd],
    "gpu": [gpu_layout, winograd_gpu, narrow_int64],
}


def _for_target(layout_pass: Callable[[Graph, Target], Graph], target: Target) -> Callable[[Graph], Graph]:
    def run(graph: Graph) -> Graph:
        return layout_pass(graph, target)

    run.__name__ = layout_pass.__name__
    return run


def optimize(graph: Graph, fuse: bool = True, target: Target | None = None) -> Graph:
    """Run every pass of PASSES, then the layout passes of `target`'s family (LAYOUT_PASSES; None keeps the ONNX
    layouts), each followed by eliminate_dead for the weights it replaced, then fuse_ops when `fuse`, verifying the
    graph before and after each one."""
    graph.verify()
    passes = list(PASSES)
    if target is not None:
        for layout_pass in LAYOUT_PASSES[target.family]:
            passes += [_for_target(layout_pass, target), eliminate_dead]
    # the narrow weights no layout pass handed to a kernel (fold_constants kept them for pack_dense) become floats
    passes += [_for_target(fold_decompressions, target), eliminate_dead]
    for graph_pass in [*passes, fuse_ops] if fuse else passes:
        graph = graph_pass(graph)
        try:
            graph.verify()
        except (GraphError, TesselError) as error:
            raise GraphError(f"pass {graph_pass.__name__} broke the graph: {error}") from error
    return graph
