"""Text form of a graph, used by `print(graph)`, `tessel inspect` and pass tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from compiler.graph.ir import Graph


def _format_attr(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array<{value.dtype}{list(value.shape)}>"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_format_attr(v) for v in value) + "]"
    if hasattr(value, "nodes"):  # a nested graph (the body of a fused group)
        return "<graph>"
    return repr(value) if isinstance(value, str) else str(value)


def format_graph(graph: Graph, indent: str = "") -> str:
    def ref(v):
        return "_" if v is None else f"%{v.name}"

    lines = [f"{indent}graph {graph.name}({', '.join(f'%{v.name}: {v.type}' for v in graph.inputs)}) {{"]
    for value in graph.params:
        lines.append(f"{indent}  %{value.name}: {value.type} = param")
    for node in graph.nodes:
        outs = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
        shown = {k: v for k, v in node.attrs.items() if k != "body"}
        attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in sorted(shown.items()))
        lines.append(
            f"{indent}  {outs} = {node.op}({', '.join(ref(v) for v in node.inputs)}){f' {{{attrs}}}' if attrs else ''}"
        )
        if "body" in node.attrs:
            lines.append(format_graph(node.attrs["body"], indent + "    "))
    lines.append(f"{indent}  return {', '.join(ref(v) for v in graph.outputs)}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)
