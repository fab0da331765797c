"""Graph passes: each a pure Graph -> Graph rewrite, run in the order `pipeline.PASSES` lists.

They read the graph the frontend built and hand the kernel stage a graph of fused groups.
"""

from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fuse_ops import fuse_ops, group_summary
from compiler.passes.pipeline import PASSES, optimize
from compiler.passes.simplify import simplify

__all__ = [
    "PASSES",
    "eliminate_dead",
    "fold_batchnorm",
    "fold_constants",
    "fuse_ops",
    "group_summary",
    "optimize",
    "simplify",
]
