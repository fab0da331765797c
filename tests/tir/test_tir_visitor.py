"""The loop IR's one visitor and mutator (tir/visitor.py): dispatch by node class with fallbacks, rebuilding only what
changed, dropping statements, the one walk and the one structural equality; and the printer's KernelCall."""

from compiler.te.expr import Binary, Const, Expr, Var
from compiler.tir.nodes import (
    Barrier,
    Buffer,
    For,
    ForKind,
    IfThen,
    KernelCall,
    Load,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from compiler.tir.printer import format_func, format_stmt
from compiler.tir.visitor import (
    StmtMutator,
    StmtVisitor,
    structural_key,
    structurally_equal,
    walk,
)


def _loop():
    """for i in 0..8: b[i] = a[i] * 2 + a[i]; then a barrier."""
    a, b = Buffer("a", (8,), "float32"), Buffer("b", (8,), "float32")
    i = Var("i")
    value = Binary("add", Binary("mul", Load(a, i), Const(2.0, "float32")), Load(a, i))
    return a, b, i, Seq((For(i, Const(0, "int32"), Const(8, "int32"), ForKind.SERIAL, Store(b, i, value)), Barrier()))


def test_dispatch_picks_the_class_then_its_bases_then_generic_visit():
    class Seen(StmtVisitor):
        def __init__(self):
            self.seen = []

        def visit_load(self, node):
            self.seen.append(f"load {node.buffer.name}")

        def visit_expr(self, node):
            self.seen.append(type(node).__name__)
            self.generic_visit(node)

        def visit_barrier(self, node):
            self.seen.append("barrier")

    visitor = Seen()
    visitor.visit(_loop()[3])
    # For's var, min and extent, then its body's index and value; loads stop there (no generic_visit of their index)
    assert visitor.seen == [
        "Var",
        "Const",
        "Const",
        "Var",
        "Binary",
        "Binary",
        "load a",
        "Const",
        "load a",
        "barrier",
    ]


def test_mutator_rebuilds_only_what_changed_and_drops_none():
    a, b, i, body = _loop()
    doubled = Buffer("c", (8,), "float32")

    class Retarget(StmtMutator):
        def visit_load(self, node):
            return Load(doubled, node.index)

        def visit_barrier(self, node):
            return None

    result = Retarget().visit(body)
    assert isinstance(result, Seq) and len(result.stmts) == 1
    (loop,) = result.stmts
    assert loop.min is body.stmts[0].min and loop.var is i
    assert {node.buffer.name for node in walk(loop) if isinstance(node, Load)} == {"c"}
    assert {node.buffer.name for node in walk(body) if isinstance(node, Load)} == {"a"}, "the input was changed"
    untouched = StmtMutator().visit(body)
    assert untouched is body


def test_walk_goes_parents_first_over_statements_and_expressions():
    body = _loop()[3]
    nodes = list(walk(body))
    assert nodes[0] is body and nodes[1] is body.stmts[0]
    assert sum(isinstance(node, Load) for node in nodes) == 2
    assert [type(node).__name__ for node in walk_stmts(body)] == ["Seq", "For", "Store", "Barrier"]
    assert all(isinstance(node, Stmt) for node in walk_stmts(body))
    assert any(isinstance(node, Expr) for node in nodes)


def test_structural_equality_compares_structure_vars_and_buffers_by_identity():
    a, b, i, body = _loop()
    _, again_b, _, _ = _loop()
    store = body.stmts[0].body
    same = Store(b, i, Binary("add", Binary("mul", Load(a, i), Const(2.0, "float32")), Load(a, i)))
    assert structurally_equal(store, same) and structural_key(store) == structural_key(same)
    assert not structurally_equal(store, Store(again_b, i, same.value)), "another buffer of the same name"
    assert not structurally_equal(store.value, Binary("add", Load(a, Var("i")), Load(a, i)))
    assert not structurally_equal(Const(1, "int32"), Const(1, "int64"))
    serial, unrolled = (
        For(i, Const(0, "int32"), Const(8, "int32"), kind, store) for kind in (ForKind.SERIAL, ForKind.UNROLLED)
    )
    assert not structurally_equal(serial, unrolled)


def test_the_printer_prints_kernel_calls():
    inputs, arena = Buffer("input_0", (64,), "uint8"), Buffer("arena", (0,), "uint8")
    run = PrimFunc("run", [inputs, arena], Seq((KernelCall("kernel_0", ((inputs, 0), (arena, 128))),)))
    assert format_func(run).splitlines() == [
        "func run(input_0: uint8[64], arena: uint8[0]) {",
        "  kernel_0(input_0 + 0, arena + 128)",
        "}",
    ]
    guarded = IfThen(Binary("add", Var("n"), Const(1, "int32")), KernelCall("k", ((inputs, 4),)))
    assert format_stmt(guarded).splitlines()[1] == "  k(input_0 + 4)"
