"""The graph pass pipeline: the frontend's graph goes through PASSES in order, then (given a target) the layout
pass for it, then fusion.

Hands the kernel stage a verified graph of fused groups (or, with fuse=False, the simplified graph).
"""

from __future__ import annotations

from compiler.errors import TesselError
from compiler.graph.ir import Graph, GraphError
from compiler.passes.alter_layout import alter_layout
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_ops import fuse_ops
from compiler.passes.simplify import simplify
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


def optimize(graph: Graph, fuse: bool = True, target: Target | str | None = None) -> Graph:
    """Run every pass of PASSES, then alter_layout for a CPU `target` (NCHW[x]c is a CPU decision: GPU targets and
    None keep the ONNX layouts) and eliminate_dead for the weights it replaced, then fuse_ops when `fuse`, verifying
    the graph before and after each one."""
    graph.verify()
    passes = list(PASSES)
    target = Target.parse(target) if target is not None else None
    if target is not None and not target.is_gpu:

        def alter_layout_for_target(graph: Graph) -> Graph:
            return alter_layout(graph, target)

        passes += [alter_layout_for_target, eliminate_dead]
    for graph_pass in [*passes, fuse_ops] if fuse else passes:
        graph = graph_pass(graph)
        try:
            graph.verify()
        except (GraphError, TesselError) as error:
            raise GraphError(f"pass {graph_pass.__name__} broke the graph: {error}") from error
    return graph
