"""Printed names for the loop IR's variables and buffers, shared by the loop-IR printer (tir/printer.py) and the GPU
code generators (codegen/wgsl.py, codegen/c_source.py): each language gives only how an IR name is spelled."""

from __future__ import annotations

from collections.abc import Callable


class UniqueNames:
    """`names(node)` is the one name of `node` (a Var or Buffer, by identity): `spell(node.name)`, or where another
    node took that, the first free `<spelling>_1`, `<spelling>_2`... `fresh(base)` takes a name no node is given."""

    def __init__(self, spell: Callable[[str], str] = str):
        self.spell = spell
        self.names: dict[int, str] = {}
        self.taken: set[str] = set()

    def __call__(self, node) -> str:
        key = id(node)
        if key not in self.names:
            self.names[key] = self.fresh(self.spell(node.name))
        return self.names[key]

    def fresh(self, base: str) -> str:
        name, suffix = base, 0
        while name in self.taken:
            suffix += 1
            name = f"{base}_{suffix}"
        self.taken.add(name)
        return name
