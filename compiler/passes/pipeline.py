"""The graph pass pipeline: the frontend's graph goes through PASSES in order, then fusion.

Hands the kernel stage a verified graph of fused groups (or, with fuse=False, the simplified graph).
"""

from __future__ import annotations

from compiler.errors import TesselError
from compiler.graph.ir import Graph, GraphError
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_ops import fuse_ops
from compiler.passes.simplify import simplify

# folding again after simplify catches constants that only became foldable once Identity/Reshape chains went away
PASSES = [
    fold_constants,
    eliminate_dead,
    fold_batchnorm,
    simplify,
    fold_constants,
    eliminate_dead,
]


def optimize(graph: Graph, fuse: bool = True) -> Graph:
    """Run every pass of PASSES, then fuse_ops when `fuse`, verifying the graph before and after each one."""
    graph.verify()
    for graph_pass in [*PASSES, fuse_ops] if fuse else PASSES:
        graph = graph_pass(graph)
        try:
            graph.verify()
        except (GraphError, TesselError) as error:
            raise GraphError(f"pass {graph_pass.__name__} broke the graph: {error}") from error
    return graph
