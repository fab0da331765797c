"""Operator fusion, the last graph pass: groups ops by their pattern kind so that each group becomes
one kernel and its intermediate values never reach memory.

Hands the kernel stage a graph whose nodes are all op "fused", each carrying its members as a body graph.
"""

from __future__ import annotations

import heapq

from compiler.graph.ir import Graph, Node, Value
from compiler.graph.registry import Pattern, get_op

EPILOGUE_OWNERS = (Pattern.OUT_EWISE_FUSABLE, Pattern.REDUCE)

# A group stops growing at this many ops (TVM's FuseOps has max_depth for the same reasons): a group's kernel is
# one expression as deep as its chain, which every recursive visitor after this pass walks, and the bookkeeping
# per merge grows with the group, so an unbounded group makes a long chain (a 50,000-node export) quadratic.
MAX_GROUP_OPS = 64


def fuse_ops(graph: Graph) -> Graph:
    """Group ops as TVM does: an out-elementwise-fusable op or a reduction absorbs the elementwise/broadcast chain
    after it (a diamond too, such as x * sigmoid(x), when it closes inside the group), elementwise/broadcast/
    injective ops fuse with each other, a reduction absorbs injective producers that
    only it reads, an out-elementwise-fusable op absorbs LayoutTransforms (alone in their group) that only it reads,
    two out-elementwise-fusable ops never share a group, opaque ops stand alone, and no group holds more than
    MAX_GROUP_OPS ops."""
    grouping = _Grouping(graph)
    for index in range(len(graph.nodes)):
        grouping.place(index)
    return grouping.fused_graph()


def group_summary(fused_graph: Graph) -> list[tuple[str, str, list[str]]]:
    """(name, pattern, member op types) of each group of a graph that fuse_ops returned."""
    return [
        (node.name, node.attrs["pattern"], [member.op for member in node.attrs["body"].nodes])
        for node in fused_graph.nodes
    ]


class _Grouping:
    """Groups of node indices, grown as nodes are placed in topological order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes = graph.nodes
        self.patterns = [get_op(node.op).pattern_of(node.attrs) for node in self.nodes]
        self.producer = {value: index for index, node in enumerate(self.nodes) for value in node.outputs}
        self.consumers: dict[Value, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for value in node.inputs:
                if value is not None and index not in self.consumers.setdefault(value, []):
                    self.consumers[value].append(index)
        self.group_of = list(range(len(self.nodes)))
        self.members = {index: [index] for index in range(len(self.nodes))}
        self.group_patterns = dict(enumerate(self.patterns))

    def pattern(self, group: int) -> Pattern:
        """The group's pattern: the highest of its members'."""
        return self.group_patterns[group]

    def place(self, index: int) -> None:
        """Put node `index` into the group of one of its producers if a fusion rule allows, else leave it alone."""
        if self.patterns[index] == Pattern.OUT_EWISE_FUSABLE:
            self._absorb_layout_transforms(index)
        if self.patterns[index] >= Pattern.OUT_EWISE_FUSABLE:
            return
        # an epilogue owner's group comes first, then the latest producer's: a residual Add joins the later of
        # the two convolutions
        producers = sorted({self.producer[v] for v in self.nodes[index].inputs if v in self.producer}, reverse=True)
        sources = list(dict.fromkeys(self.group_of[producer] for producer in producers))
        sources.sort(key=lambda group: self.pattern(group) not in EPILOGUE_OWNERS)
        joined = next((group for group in sources if self._absorbs(group, index)), None)
        if joined is None:
            return
        self._merge(joined, self.group_of[index])
        if self.pattern(joined) > Pattern.INJECTIVE:
            return
        for group in sources:
            if group == joined or len(self.members[joined]) + len(self.members[group]) > MAX_GROUP_OPS:
                continue
            if self.pattern(group) <= Pattern.INJECTIVE:
                if not self._creates_cycle(self.members[joined] + self.members[group], index):
                    self._merge(joined, group)

    def _absorb_layout_transforms(self, index: int) -> None:
        """An out-elementwise-fusable op takes in the groups of LayoutTransforms alone that only it reads: its
        kernel reads the other layout in place (the conv's padded copy, or its input loads) and no separate kernel
        converts through memory."""
        for value in self.nodes[index].inputs:
            if value not in self.producer:
                continue
            group = self.group_of[self.producer[value]]
            members = self.members[group]
            if group == self.group_of[index] or any(self.nodes[m].op != "LayoutTransform" for m in members):
                continue
            outputs = [v for m in members for v in self.nodes[m].outputs]
            if all(self.consumers.get(v, []) == [index] and v not in self.graph.outputs for v in outputs):
                self._merge(self.group_of[index], group)

    def _absorbs(self, group: int, index: int) -> bool:
        if len(self.members[group]) >= MAX_GROUP_OPS:
            return False
        node, pattern, group_pattern = self.nodes[index], self.patterns[index], self.pattern(group)
        links = [v for v in node.inputs if v in self.producer and self.group_of[self.producer[v]] == group]
        if pattern <= Pattern.BROADCAST and group_pattern in EPILOGUE_OWNERS:
            # the epilogue runs on the anchor's output in place: nothing outside the group may read it, and the
            # shape stays
            allowed = all(
                self._read_only_by_epilogue(v, group, index)
                and all(out.type.shape == v.type.shape for out in node.outputs)
                for v in links
            )
        elif pattern <= Pattern.INJECTIVE:
            allowed = group_pattern <= Pattern.INJECTIVE
        elif pattern == Pattern.REDUCE:
            allowed = group_pattern <= Pattern.INJECTIVE and all(
                self.consumers[v] == [index] and v not in self.graph.outputs for v in links
            )
        else:
            allowed = False
        return allowed and not self._creates_cycle([*self.members[group], index], index)

    def _read_only_by_epilogue(self, v: Value, group: int, index: int) -> bool:
        """Whether every reader of `v` besides node `index` is already in `group`, or they are later elementwise
        nodes of a diamond that closes (_closes_diamond). x * sigmoid(x) after a conv (SiLU) is such a diamond:
        Sigmoid joins first, then the Mul, which by then finds every other reader of x in the group; so are GELU's
        x * 0.5 * (1 + erf(x / sqrt 2)), whose Div, Erf and Add join one by one before the Mul, and its tanh form,
        which reads x four times."""
        others = [c for c in self.consumers[v] if c != index and self.group_of[c] != group]
        if not others:
            return True
        return min(others) > index and self._closes_diamond(v, index, max(others), group)

    def _closes_diamond(self, v: Value, index: int, closing: int, group: int) -> bool:
        """Whether the nodes from `index` to `closing` that read `v` or each other's outputs form a region that each
        of them joins in turn: all elementwise and of v's shape, fed only by v, each other and values no node makes
        (params, graph inputs), and read from outside only through `closing`."""
        region = {index}
        for position in range(index + 1, closing + 1):
            node = self.nodes[position]
            made = [u for u in node.inputs if u is not None and u is not v and u in self.producer]
            if v not in node.inputs and not any(self.producer[u] in region for u in made):
                continue
            if any(self.producer[u] not in region for u in made) or self.patterns[position] > Pattern.BROADCAST:
                return False
            if any(out.type.shape != v.type.shape for out in node.outputs):
                return False
            region.add(position)
        if closing not in region or len(self.members[group]) + len(region) > MAX_GROUP_OPS:
            return False
        inner = [out for position in region - {closing} for out in self.nodes[position].outputs]
        return all(
            out not in self.graph.outputs and all(c in region for c in self.consumers.get(out, [])) for out in inner
        )

    def _creates_cycle(self, united: list[int], last: int) -> bool:
        """Whether some path leaves the united nodes and comes back through other groups.

        Nodes after `last` are still alone and only lead further on, so the search stops at `last`.
        """
        inside = set(united)
        frontier = [self.group_of[c] for c in self._readers(united) if c not in inside and c <= last]
        seen = set(frontier)
        while frontier:
            group = frontier.pop()
            for reader in self._readers(self.members[group]):
                if reader in inside:
                    return True
                if reader <= last and self.group_of[reader] not in seen:
                    seen.add(self.group_of[reader])
                    frontier.append(self.group_of[reader])
        return False

    def _readers(self, indices: list[int]) -> list[int]:
        return [c for index in indices for v in self.nodes[index].outputs for c in self.consumers.get(v, [])]

    def _merge(self, group: int, other: int) -> None:
        if group == other:
            return
        for index in self.members[other]:
            self.group_of[index] = group
        self.members[group] = sorted(self.members[group] + self.members.pop(other))
        self.group_patterns[group] = max(self.group_patterns[group], self.group_patterns.pop(other))

    def _ordered_groups(self) -> list[int]:
        """Groups in a topological order of the group graph, earliest first node first among the ready ones."""
        depends: dict[int, set[int]] = {group: set() for group in self.members}
        for group, members in self.members.items():
            for index in members:
                for v in self.nodes[index].inputs:
                    if v in self.producer and self.group_of[self.producer[v]] != group:
                        depends[group].add(self.group_of[self.producer[v]])
        dependents: dict[int, list[int]] = {group: [] for group in self.members}
        for group, needed in depends.items():
            for other in needed:
                dependents[other].append(group)
        ready = [(self.members[group][0], group) for group, needed in depends.items() if not needed]
        heapq.heapify(ready)
        order = []
        while ready:
            _, group = heapq.heappop(ready)
            order.append(group)
            for other in dependents[group]:
                depends[other].discard(group)
                if not depends[other]:
                    heapq.heappush(ready, (self.members[other][0], other))
        return order

    def fused_graph(self) -> Graph:
        outputs = set(self.graph.outputs)
        nodes = []
        for number, group in enumerate(self._ordered_groups()):
            members = [self.nodes[index] for index in self.members[group]]
            produced = {v for member in members for v in member.outputs}
            external = list(dict.fromkeys(v for m in members for v in m.inputs if v is not None and v not in produced))
            exported = [
                v
                for member in members
                for v in member.outputs
                if v in outputs or any(self.group_of[c] != group for c in self.consumers.get(v, []))
            ]
            name = "_".join(["fused", str(number), *(member.op.lower() for member in members)])
            pattern = self.pattern(group)
            anchor = next((self.nodes[i].op for i in self.members[group] if self.patterns[i] == pattern), "")
            attrs = {
                "body": _body(name, members, external, exported),
                "pattern": pattern.name,
                "anchor": anchor if pattern >= Pattern.REDUCE else "",
            }
            nodes.append(Node("fused", external, exported, attrs, name))
        return Graph(list(self.graph.inputs), list(self.graph.outputs), nodes, dict(self.graph.params), self.graph.name)


def _body(name: str, members: list[Node], external: list[Value], exported: list[Value]) -> Graph:
    """The group's members as a graph of fresh Values, its inputs and outputs matching the fused node's."""
    fresh = {v: Value(v.name, v.type) for v in external}
    fresh.update({v: Value(v.name, v.type) for member in members for v in member.outputs})
    nodes = [
        Node(
            m.op,
            [None if v is None else fresh[v] for v in m.inputs],
            [fresh[v] for v in m.outputs],
            dict(m.attrs),
            m.name,
        )
        for m in members
    ]
    return Graph([fresh[v] for v in external], [fresh[v] for v in exported], nodes, {}, name)
