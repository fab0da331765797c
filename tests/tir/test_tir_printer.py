"""The loop-IR printer: one stable text per construct."""

import compiler.te as te
from compiler.te.expr import Binary, Call, Cast, Const, IfThenElse, Let, Logical, Select, Var
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    For,
    ForKind,
    IfThen,
    LetStmt,
    Load,
    PrimFunc,
    Seq,
    Store,
)
from compiler.tir.printer import format_expr, format_func, format_stmt

i, j = Var("i"), Var("j")
A = Buffer("A", (4, 8), "float32")


def test_expressions():
    assert format_expr(i * 8 + j) == "(i*8) + j"
    assert format_expr(i - (j + 1)) == "i - (j + 1)"
    assert format_expr(Binary("floordiv", i, Const(4, "int32"))) == "floordiv(i, 4)"
    assert format_expr(Binary("max", i, j)) == "max(i, j)"
    assert format_expr(Logical("not", (i < j,))) == "!(i < j)"
    assert format_expr(te.all(i < 4, j >= 1)) == "(i < 4) && (j >= 1)"
    assert format_expr(Select(i < 4, Load(A, i), Const(0.0, "float32"))) == "select(i < 4, A[i], 0.0f)"
    assert format_expr(IfThenElse(i < 4, Load(A, i), Const(0.0, "float32"))) == "if_then_else(i < 4, A[i], 0.0f)"
    assert format_expr(Cast("float16", Load(A, j))) == "float16(A[j])"
    assert format_expr(Call("exp", (Load(A, j),), "float32")) == "exp(A[j])"
    assert format_expr(Let(i, j + 1, i * 2)) == "(let i = j + 1 in i*2)"
    assert format_expr(Const(3, "int64")) == "int64(3)"
    assert format_expr(Const(True, "bool")) == "True"
    assert format_expr(Const(float("-inf"), "float32")) == "float32(-inf)"


def test_vars_with_the_same_name_are_told_apart():
    other = Var("i")
    assert format_expr(i + other) == "i + i_1"


def test_function_with_every_statement_kind():
    shared = Buffer("A.shared", (16,), "float32", "shared")
    tx = Var("tx")
    body = For(
        i,
        Const(0, "int32"),
        Const(4, "int32"),
        ForKind.PARALLEL,
        Allocate(
            shared,
            Seq(
                (
                    For(
                        tx,
                        Const(0, "int32"),
                        Const(16, "int32"),
                        ForKind.THREAD_BINDING,
                        Store(shared, tx, Load(A, tx)),
                        "threadIdx.x",
                    ),
                    Barrier("shared"),
                    LetStmt(j, i * 2, IfThen(j < 4, Store(A, j, Load(shared, j)), Store(A, j, Const(0.0, "float32")))),
                    For(j, Const(0, "int32"), Const(4, "int32"), ForKind.VECTORIZED, Store(A, j, Load(A, j))),
                    For(j, Const(0, "int32"), Const(2, "int32"), ForKind.UNROLLED, Store(A, j, Load(A, j))),
                )
            ),
        ),
    )
    text = format_func(PrimFunc("kernel", [A], body))
    assert text == "\n".join(
        [
            "func kernel(A: float32[4, 8]) {",
            "  for (i: int32, 0, 4) parallel {",
            "    allocate A.shared: float32[16] shared {",
            "      for (tx: int32, 0, 16) thread_binding(threadIdx.x) {",
            "        A.shared[tx] = A[tx]",
            "      }",
            "      barrier(shared)",
            "      let j: int32 = i*2",
            "      if (j < 4) {",
            "        A[j] = A.shared[j]",
            "      } else {",
            "        A[j] = 0.0f",
            "      }",
            "      for (j: int32, 0, 4) vectorized {",
            "        A[j] = A[j]",
            "      }",
            "      for (j: int32, 0, 2) unrolled {",
            "        A[j] = A[j]",
            "      }",
            "    }",
            "  }",
            "}",
        ]
    )
    assert format_stmt(Barrier("shared")) == "barrier(shared)"
