"""Lowering tests: small schedules and the exact loop IR they print (before/expected style)."""

import pytest

import compiler.te as te
from compiler.te import TEError
from compiler.tir.lower import lower
from compiler.tir.nodes import For, ForKind
from compiler.tir.printer import format_func


def printed(schedule, args):
    return format_func(lower(schedule, args, "f"))


def vector(n=10):
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    return a, b


def grid(rows=4, columns=6):
    a = te.placeholder((rows, columns), name="A")
    b = te.compute((rows, columns), lambda i, j: a[i, j] + 1.0, name="B")
    return a, b


def matmul(n=8, m=8, k_extent=8):
    a = te.placeholder((n, k_extent), name="A")
    b = te.placeholder((k_extent, m), name="B")
    k = te.reduce_axis((0, k_extent), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return a, b, c, k


def case_split():
    a, b = vector(16)
    s = te.create_schedule(b.op)
    s[b].split(b.op.axis[0], factor=4)
    return s, [a, b]


def case_split_nondividing():
    a, b = vector(10)
    s = te.create_schedule(b.op)
    s[b].split(b.op.axis[0], factor=4)
    return s, [a, b]


def case_nparts():
    a, b = vector(12)
    s = te.create_schedule(b.op)
    s[b].split(b.op.axis[0], nparts=3)
    return s, [a, b]


def case_tile():
    a, b = grid(4, 6)
    s = te.create_schedule(b.op)
    s[b].tile(*b.op.axis, 2, 3)
    return s, [a, b]


def case_reorder():
    a, b = grid(4, 6)
    s = te.create_schedule(b.op)
    s[b].reorder(b.op.axis[1], b.op.axis[0])
    return s, [a, b]


def case_fuse_parallel():
    a, b = grid(4, 6)
    s = te.create_schedule(b.op)
    s[b].parallel(s[b].fuse(*b.op.axis))
    return s, [a, b]


def case_vectorize_unroll():
    a, b = grid(4, 8)
    s = te.create_schedule(b.op)
    outer, inner = s[b].split(b.op.axis[1], 4)
    s[b].vectorize(inner)
    s[b].unroll(b.op.axis[0])
    return s, [a, b]


def case_compute_at():
    a, b = grid(4, 6)
    c = te.compute((4, 5), lambda i, j: b[i, j] + b[i, j + 1], name="C")
    s = te.create_schedule(c.op)
    s[b].compute_at(s[c], c.op.axis[0])
    return s, [a, c]


def case_compute_inline():
    a, b = grid(4, 6)
    c = te.compute((4, 6), lambda i, j: b[i, j] * b[i, j], name="C")
    s = te.create_schedule(c.op)
    s[b].compute_inline()
    return s, [a, c]


def case_bind():
    a, b = vector(64)
    s = te.create_schedule(b.op)
    bx, tx = s[b].split(b.op.axis[0], 16)
    s[b].bind(bx, te.thread_axis("blockIdx.x"))
    s[b].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [a, b]


def case_vthread():
    a, b = vector(8)
    s = te.create_schedule(b.op)
    vx, x = s[b].split(b.op.axis[0], nparts=2)
    s[b].bind(vx, te.thread_axis("vthread"))
    return s, [a, b]


def case_reduction():
    a, b, c, k = matmul(4, 4, 8)
    s = te.create_schedule(c.op)
    return s, [a, b, c]


def case_reduction_split_reordered():
    a, b, c, k = matmul(4, 4, 8)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    ko, ki = s[c].split(k, 4)
    s[c].reorder(i, ko, j, ki)
    return s, [a, b, c]


def case_reduction_outermost():
    a, b, c, k = matmul(4, 4, 8)
    s = te.create_schedule(c.op)
    s[c].reorder(k, *c.op.axis)
    return s, [a, b, c]


def case_cache_read_shared():
    a, b, c, k = matmul(8, 8, 8)
    s = te.create_schedule(c.op)
    a_shared = s.cache_read(a, "shared", [c])
    i, j = c.op.axis
    bx, tx = s[c].split(i, 4)
    s[c].reorder(bx, j, tx)
    s[c].bind(bx, te.thread_axis("blockIdx.x"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    s[a_shared].compute_at(s[c], j)
    return s, [a, b, c]


def case_cache_write_local():
    a, b, c, k = matmul(4, 4, 8)
    s = te.create_schedule(c.op)
    c_local = s.cache_write(c, "local")
    s[c_local].compute_at(s[c], c.op.axis[0])
    return s, [a, b, c]


def case_padding_select():
    a = te.placeholder((6,), name="A")
    p = te.compute((8,), lambda i: te.select(te.all(i >= 1, i < 7), a[i - 1], 0.0), name="P")
    s = te.create_schedule(p.op)
    return s, [a, p]


EXPECTED = {
    "split": """
func f(A: float32[16], B: float32[16]) {
  for (i.outer: int32, 0, 4) {
    for (i.inner: int32, 0, 4) {
      B[(i.outer*4) + i.inner] = A[(i.outer*4) + i.inner]*2.0f
    }
  }
}
""",
    "split_nondividing": """
func f(A: float32[10], B: float32[10]) {
  for (i.outer: int32, 0, 3) {
    for (i.inner: int32, 0, 4) {
      if (((i.outer*4) + i.inner) < 10) {
        B[(i.outer*4) + i.inner] = A[(i.outer*4) + i.inner]*2.0f
      }
    }
  }
}
""",
    "nparts": """
func f(A: float32[12], B: float32[12]) {
  for (i.outer: int32, 0, 3) {
    for (i.inner: int32, 0, 4) {
      B[(i.outer*4) + i.inner] = A[(i.outer*4) + i.inner]*2.0f
    }
  }
}
""",
    "tile": """
func f(A: float32[4, 6], B: float32[4, 6]) {
  for (i.outer: int32, 0, 2) {
    for (j.outer: int32, 0, 2) {
      for (i.inner: int32, 0, 2) {
        for (j.inner: int32, 0, 3) {
          B[(i.outer*12) + (i.inner*6) + (j.outer*3) + j.inner] = A[(i.outer*12) + (i.inner*6) + (j.outer*3) + j.inner] + 1.0f
        }
      }
    }
  }
}
""",
    "reorder": """
func f(A: float32[4, 6], B: float32[4, 6]) {
  for (j: int32, 0, 6) {
    for (i: int32, 0, 4) {
      B[(i*6) + j] = A[(i*6) + j] + 1.0f
    }
  }
}
""",
    "fuse_parallel": """
func f(A: float32[4, 6], B: float32[4, 6]) {
  for (i.j.fused: int32, 0, 24) parallel {
    B[i.j.fused] = A[i.j.fused] + 1.0f
  }
}
""",
    "vectorize_unroll": """
func f(A: float32[4, 8], B: float32[4, 8]) {
  for (i: int32, 0, 4) unrolled {
    for (j.outer: int32, 0, 2) {
      for (j.inner: int32, 0, 4) vectorized {
        B[(i*8) + (j.outer*4) + j.inner] = A[(i*8) + (j.outer*4) + j.inner] + 1.0f
      }
    }
  }
}
""",
    "compute_at": """
func f(A: float32[4, 6], C: float32[4, 5]) {
  for (i: int32, 0, 4) {
    allocate B: float32[1, 6] global {
      for (j: int32, 0, 6) {
        B[j] = A[(i*6) + j] + 1.0f
      }
      for (j_1: int32, 0, 5) {
        C[(i*5) + j_1] = B[j_1] + B[j_1 + 1]
      }
    }
  }
}
""",
    "compute_inline": """
func f(A: float32[4, 6], C: float32[4, 6]) {
  for (i: int32, 0, 4) {
    for (j: int32, 0, 6) {
      C[(i*6) + j] = (A[(i*6) + j] + 1.0f)*(A[(i*6) + j] + 1.0f)
    }
  }
}
""",
    "bind": """
func f(A: float32[64], B: float32[64]) {
  for (i.outer: int32, 0, 4) thread_binding(blockIdx.x) {
    for (i.inner: int32, 0, 16) thread_binding(threadIdx.x) {
      B[(i.outer*16) + i.inner] = A[(i.outer*16) + i.inner]*2.0f
    }
  }
}
""",
    "vthread": """
func f(A: float32[8], B: float32[8]) {
  for (i.outer: int32, 0, 2) unrolled {
    for (i.inner: int32, 0, 4) {
      B[(i.outer*4) + i.inner] = A[(i.outer*4) + i.inner]*2.0f
    }
  }
}
""",
    "reduction": """
func f(A: float32[4, 8], B: float32[8, 4], C: float32[4, 4]) {
  for (i: int32, 0, 4) {
    for (j: int32, 0, 4) {
      C[(i*4) + j] = 0.0f
      for (k: int32, 0, 8) {
        C[(i*4) + j] = C[(i*4) + j] + (A[(i*8) + k]*B[(k*4) + j])
      }
    }
  }
}
""",
    "reduction_split_reordered": """
func f(A: float32[4, 8], B: float32[8, 4], C: float32[4, 4]) {
  for (i: int32, 0, 4) {
    for (j.init: int32, 0, 4) {
      C[(i*4) + j.init] = 0.0f
    }
    for (k.outer: int32, 0, 2) {
      for (j: int32, 0, 4) {
        for (k.inner: int32, 0, 4) {
          C[(i*4) + j] = C[(i*4) + j] + (A[(i*8) + (k.outer*4) + k.inner]*B[(k.outer*16) + (k.inner*4) + j])
        }
      }
    }
  }
}
""",
    "reduction_outermost": """
func f(A: float32[4, 8], B: float32[8, 4], C: float32[4, 4]) {
  for (i.init: int32, 0, 4) {
    for (j.init: int32, 0, 4) {
      C[(i.init*4) + j.init] = 0.0f
    }
  }
  for (k: int32, 0, 8) {
    for (i: int32, 0, 4) {
      for (j: int32, 0, 4) {
        C[(i*4) + j] = C[(i*4) + j] + (A[(i*8) + k]*B[(k*4) + j])
      }
    }
  }
}
""",
    "cache_read_shared": """
func f(A: float32[8, 8], B: float32[8, 8], C: float32[8, 8]) {
  for (i.outer: int32, 0, 2) thread_binding(blockIdx.x) {
    for (j: int32, 0, 8) {
      allocate A.shared: float32[4, 8] shared {
        barrier(shared)
        for (ax0: int32, 0, 4) {
          for (ax1: int32, 0, 8) {
            A.shared[(ax0*8) + ax1] = A[(i.outer*32) + (ax0*8) + ax1]
          }
        }
        barrier(shared)
        for (i.inner: int32, 0, 4) thread_binding(threadIdx.x) {
          C[(i.outer*32) + (i.inner*8) + j] = 0.0f
          for (k: int32, 0, 8) {
            C[(i.outer*32) + (i.inner*8) + j] = C[(i.outer*32) + (i.inner*8) + j] + (A.shared[(i.inner*8) + k]*B[(k*8) + j])
          }
        }
      }
    }
  }
}
""",
    "cache_write_local": """
func f(A: float32[4, 8], B: float32[8, 4], C: float32[4, 4]) {
  for (i: int32, 0, 4) {
    allocate C.local: float32[1, 4] local {
      for (j.c: int32, 0, 4) {
        C.local[j.c] = 0.0f
        for (k: int32, 0, 8) {
          C.local[j.c] = C.local[j.c] + (A[(i*8) + k]*B[(k*4) + j.c])
        }
      }
      for (j: int32, 0, 4) {
        C[(i*4) + j] = C.local[j]
      }
    }
  }
}
""",
    "padding_select": """
func f(A: float32[6], P: float32[8]) {
  for (i: int32, 0, 8) {
    P[i] = if_then_else((i >= 1) && (i < 7), A[i - 1], 0.0f)
  }
}
""",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_printed_loop_ir(name):
    schedule, args = globals()[f"case_{name}"]()
    assert printed(schedule, args) == EXPECTED[name].strip("\n")


def test_params_follow_args_order_shape_and_dtype():
    a = te.placeholder((3, 5), "int8", name="A")
    b = te.compute((3, 5), lambda i, j: a[i, j].astype("int32") * 2, name="B")
    func = lower(te.create_schedule(b.op), [b, a], "g")
    assert [(p.name, p.shape, p.dtype, p.scope) for p in func.params] == [
        ("B", (3, 5), "int32", "global"),
        ("A", (3, 5), "int8", "global"),
    ]


def test_select_with_in_bounds_arms_stays_a_select():
    a = te.placeholder((8,), name="A")
    b = te.compute((8,), lambda i: te.select(a[i] > 0.0, a[i], a[7 - i]), name="B")
    text = printed(te.create_schedule(b.op), [a, b])
    assert "B[i] = select(A[i] > 0.0f, A[i], A[7 - i])" in text


def test_vectorized_and_unrolled_loops_have_constant_extents():
    s, args = case_vectorize_unroll()
    func = lower(s, args, "f")
    kinds = []
    stack = [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, For):
            kinds.append((node.kind, node.extent.value))
            stack.append(node.body)
    assert (ForKind.VECTORIZED, 4) in kinds and (ForKind.UNROLLED, 4) in kinds


def test_no_te_nodes_survive_lowering():
    s, args = case_compute_at()
    func = lower(s, args, "f")
    text = repr(func.body)
    assert "TensorLoad" not in text and "Reduce(" not in text and "IterVar" not in text


def test_fused_split_of_nondividing_extent_is_guarded_on_the_fused_index():
    a, b = grid(3, 5)
    s = te.create_schedule(b.op)
    fused = s[b].fuse(*b.op.axis)
    s[b].split(fused, 4)
    text = printed(s, [a, b])
    assert "if (((i.j.fused.outer*4) + i.j.fused.inner) < 15) {" in text


def test_compute_at_region_is_clamped_to_the_producer_shape():
    a = te.placeholder((10,), name="A")
    b = te.compute((10,), lambda i: a[i] + 1.0, name="B")
    c = te.compute((9,), lambda i: b[i] + b[i + 1], name="C")
    s = te.create_schedule(c.op)
    outer, inner = s[c].split(c.op.axis[0], 4)
    s[b].compute_at(s[c], outer)
    text = printed(s, [a, c])
    assert "allocate B: float32[5] global {" in text
    assert "if (((i.outer*4) + i) < 10) {" in text


def test_lowering_errors_name_the_tensor():
    a, b = vector()
    s = te.create_schedule(b.op)
    with pytest.raises(TEError, match="output B is not in the arguments"):
        lower(s, [a], "f")
    with pytest.raises(TEError, match="reads placeholder A, which is not in the arguments"):
        lower(s, [b], "f")
    with pytest.raises(TEError, match="tensor B is given twice"):
        lower(s, [a, b, b], "f")
    n = te.var("n")
    x = te.placeholder((n,), name="X")
    y = te.compute((n,), lambda i: x[i] + 1.0, name="Y")
    with pytest.raises(TEError, match="symbolic dimension n"):
        lower(te.create_schedule(y.op), [x, y], "f")


def test_compute_at_with_a_reader_outside_the_loop_is_an_error():
    a, b = grid()
    c = te.compute((4, 6), lambda i, j: b[i, j] * 2.0, name="C")
    d = te.compute((4, 6), lambda i, j: b[i, j] + c[i, j], name="D")
    s = te.create_schedule(d.op)
    s[b].compute_at(s[c], c.op.axis[0])
    with pytest.raises(TEError, match="its reader D runs outside that loop"):
        lower(s, [a, d], "f")


def test_the_tiled_matmul_document_shows_what_the_printer_prints():
    from pathlib import Path

    document = (Path(__file__).parents[2] / "docs" / "tiled_matmul_tir.md").read_text()
    blocks = document.split("```")
    code, shown = blocks[1].removeprefix("python\n"), blocks[3].strip("\n")
    namespace: dict = {}
    exec(code.replace("print(format_func(", "result = (format_func("), namespace)
    assert namespace["result"] == shown


def test_prefetch_lines_open_their_loop_and_stay_inside_the_tensor():
    """A prefetch hint is a loop over its lines at the start of its axis's body (only in the update nest, not the
    reduction's init), each element clamped to the tensor's last one."""
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    s[c].reorder(i, k, j)
    s[c].prefetch(b, k, 2, lambda line: (k + 1) * 8 + line * 4)
    assert printed(s, [a, b, c]) == (
        "func f(A: float32[8, 8], B: float32[8, 8], C: float32[8, 8]) {\n"
        "  for (i: int32, 0, 8) {\n"
        "    for (j.init: int32, 0, 8) {\n"
        "      C[(i*8) + j.init] = 0.0f\n"
        "    }\n"
        "    for (k: int32, 0, 8) {\n"
        "      for (B.line: int32, 0, 2) {\n"
        "        prefetch(B[min((k*8) + (B.line*4) + 8, 63)])\n"
        "      }\n"
        "      for (j: int32, 0, 8) {\n"
        "        C[(i*8) + j] = C[(i*8) + j] + (A[(i*8) + k]*B[(k*8) + j])\n"
        "      }\n"
        "    }\n"
        "  }\n"
        "}"
    )


def test_prefetch_errors():
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    s[c].prefetch(a, i, 1, lambda line: i * 8 + j)
    with pytest.raises(TEError, match="a prefetch of A in stage C reads loop j, which is not around loop i"):
        lower(s, [a, b, c], "f")
    with pytest.raises(TEError, match="prefetch on stage C: lines must be a positive int, got 0"):
        s[c].prefetch(a, i, 0, lambda line: i)
    with pytest.raises(TEError, match="prefetch on stage C: 3 is not a tensor"):
        s[c].prefetch(3, i, 1, lambda line: i)
