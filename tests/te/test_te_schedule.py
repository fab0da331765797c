"""Schedules: stage structure, what each primitive records, and every misuse error's message."""

import pytest

import compiler.te as te
from compiler.te import TEError
from compiler.te.schedule import Fuse, Split


def chain():
    a = te.placeholder((8, 6), name="A")
    b = te.compute((8, 6), lambda i, j: a[i, j] + 1.0, name="B")
    c = te.compute((8, 6), lambda i, j: b[i, j] * 2.0, name="C")
    return a, b, c


def matmul():
    a = te.placeholder((8, 8), name="A")
    b = te.placeholder((8, 8), name="B")
    k = te.reduce_axis((0, 8), name="k")
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return a, b, c, k


def test_stages_in_producer_order_and_lookup_by_tensor_or_op():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    assert [stage.name for stage in s.stages] == ["A", "B", "C"]
    assert s[c] is s[c.op] and s[c].is_output and not s[b].is_output
    assert s[c].op.axis == c.op.axis
    assert te.create_schedule([c]).stages[-1].op is c.op


def test_split_tile_reorder_fuse_record_relations_and_leaves():
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    io, jo, ii, ji = s[c].tile(i, j, 4, 2)
    assert [iv.name for iv in s[c].leaf_iter_vars] == ["i.outer", "j.outer", "i.inner", "j.inner", "k"]
    assert (io.extent, ii.extent, jo.extent, ji.extent) == (2, 4, 4, 2)
    assert isinstance(s[c].relations[0], Split) and s[c].relations[0].factor == 4
    s[c].reorder(k, io)
    assert [iv.name for iv in s[c].leaf_iter_vars] == ["k", "j.outer", "i.inner", "j.inner", "i.outer"]
    fused = s[c].fuse(jo, ii)
    assert fused.name == "j.outer.i.inner.fused" and fused.extent == 16
    assert isinstance(s[c].relations[-1], Fuse)
    ko, ki = s[c].split(k, nparts=3)
    assert (ko.extent, ki.extent, ki.kind) == (3, 3, "reduce")


def test_annotations_and_bindings():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    s[c].parallel(i)
    s[c].vectorize(j)
    assert s[c].annotations == {i: "parallel", j: "vectorized"}
    s2 = te.create_schedule(c.op)
    s2[c].bind(i, te.thread_axis("blockIdx.x"))
    assert s2[c].bindings[i].thread_tag == "blockIdx.x"


def test_cache_read_and_cache_write_make_new_stages():
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    a_shared = s.cache_read(a, "shared", [c])
    c_local = s.cache_write(c, "local")
    assert (a_shared.name, s[a_shared].scope, a_shared.shape) == ("A.shared", "shared", (8, 8))
    assert (c_local.name, s[c_local].scope) == ("C.local", "local")
    assert [stage.name for stage in s.stages] == ["A", "B", "A.shared", "C.local", "C"]
    assert s[c_local].op.reduce_axis[0].name == "k" and s[c_local].op.reduce_axis[0] is not k
    assert s[c].op.reduce_axis == ()
    assert s[c].op.axis == c.op.axis
    assert [t.name for t in s[c_local].op.input_tensors] == ["A.shared", "B"]


def test_unknown_axis_and_axis_of_another_stage():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    with pytest.raises(TEError, match=r"split on stage C: axis i belongs to stage B, not to C; use s\[C\].op.axis"):
        s[c].split(b.op.axis[0], 2)
    stray = te.reduce_axis((0, 3), name="r")
    with pytest.raises(TEError, match="vectorize on stage C: axis r is not an axis of this stage; its axes are i, j"):
        s[c].vectorize(stray)
    with pytest.raises(TEError, match="reorder on stage C: 3 is not an axis"):
        s[c].reorder(3)


def test_split_errors():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    with pytest.raises(TEError, match="give exactly one of factor or nparts"):
        s[c].split(i)
    with pytest.raises(TEError, match="give exactly one of factor or nparts"):
        s[c].split(i, factor=2, nparts=2)
    for bad in (0, -2, 2.5):
        with pytest.raises(TEError, match=f"factor must be a positive int, got {bad}"):
            s[c].split(i, bad)
    with pytest.raises(TEError, match="nparts must be a positive int, got 0"):
        s[c].split(i, nparts=0)
    s[c].split(i, 4)
    with pytest.raises(TEError, match="split on stage C: axis i was already split into i.outer and i.inner"):
        s[c].split(i, 2)
    fused = s[c].fuse(*s[c].leaf_iter_vars[1:])
    with pytest.raises(TEError, match=f"axis j was already fused into {fused.name}"):
        s[c].unroll(j)


def test_reorder_and_fuse_errors():
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    with pytest.raises(TEError, match="axis i is given twice"):
        s[c].reorder(i, j, i)
    with pytest.raises(TEError, match="axes i, k are not adjacent loops"):
        s[c].fuse(i, k)
    with pytest.raises(TEError, match="cannot fuse a reduce axis with a data-parallel axis"):
        s[c].fuse(j, k)


def test_vectorize_and_unroll_need_constant_extents():
    n = te.var("n")
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="B")
    s = te.create_schedule(b.op)
    with pytest.raises(TEError, match="cannot vectorize axis i of stage B: its extent n is not a constant"):
        s[b].vectorize(b.op.axis[0])
    with pytest.raises(TEError, match="cannot unroll axis i of stage B: its extent n is not a constant"):
        s[b].unroll(b.op.axis[0])
    outer, inner = s[b].split(b.op.axis[0], 4)
    s[b].vectorize(inner)


def test_reduction_axes_cannot_be_parallel_vectorized_or_bound():
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    with pytest.raises(TEError, match="cannot parallel axis k of stage C: it is a reduction axis"):
        s[c].parallel(k)
    with pytest.raises(TEError, match="cannot vectorize axis k of stage C: it is a reduction axis"):
        s[c].vectorize(k)
    with pytest.raises(TEError, match="a reduction axis cannot be bound to a thread"):
        s[c].bind(k, te.thread_axis("threadIdx.x"))
    s[c].unroll(k)


def test_bind_errors():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    s[c].bind(i, te.thread_axis("threadIdx.x"))
    with pytest.raises(TEError, match="bind of axis i in stage C: the axis is already bound to threadIdx.x"):
        s[c].bind(i, te.thread_axis("threadIdx.y"))
    with pytest.raises(TEError, match="threadIdx.x is already bound to axis i of this stage"):
        s[c].bind(j, te.thread_axis("threadIdx.x"))
    with pytest.raises(TEError, match="is not a te.thread_axis"):
        s[c].bind(j, i)
    with pytest.raises(TEError, match="cannot vectorize axis i of stage C: it is bound to threadIdx.x"):
        s[c].vectorize(i)


def test_compute_at_errors():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    with pytest.raises(TEError, match="compute_at of stage C: it is an output of the schedule"):
        s[c].compute_at(s[b], b.op.axis[0])
    with pytest.raises(TEError, match="a stage cannot be computed at itself"):
        s[b].compute_at(s[b], b.op.axis[0])
    with pytest.raises(TEError, match="compute_at of B on stage C: axis i belongs to stage B, not to C"):
        s[b].compute_at(s[c], b.op.axis[0])
    x = te.placeholder((4,), name="X")
    p = te.compute((4,), lambda i: x[i] + 1.0, name="P")
    q = te.compute((4,), lambda i: p[i] * 2.0, name="Q")
    r = te.compute((4,), lambda i: q[i] + p[i], name="R")
    s = te.create_schedule(r.op)
    with pytest.raises(TEError, match="compute_at of stage P at Q: Q is one of its inputs|P is one of its inputs"):
        s[q].compute_at(s[p], p.op.axis[0])
    u = te.compute((4,), lambda i: x[i] + 2.0, name="U")
    v = te.compute((4,), lambda i: x[i] + 3.0, name="V")
    w = te.compute((4,), lambda i: u[i] + v[i], name="W")
    s = te.create_schedule(w.op)
    s[u].compute_at(s[v], v.op.axis[0])
    with pytest.raises(
        TEError, match="compute_at of stage V at U: U is itself computed inside V; that would be a cycle"
    ):
        s[v].compute_at(s[u], u.op.axis[0])


def test_compute_inline_errors():
    a, b, c, k = matmul()
    d = te.compute((8, 8), lambda i, j: c[i, j] + 1.0, name="D")
    s = te.create_schedule(d.op)
    with pytest.raises(TEError, match="compute_inline of stage C: it is a reduction"):
        s[c].compute_inline()
    with pytest.raises(TEError, match="compute_inline of stage D: it is an output of the schedule"):
        s[d].compute_inline()
    with pytest.raises(TEError, match="only compute stages can be inlined"):
        s[a].compute_inline()


def test_cache_errors_and_schedule_lookup():
    a, b, c, k = matmul()
    s = te.create_schedule(c.op)
    with pytest.raises(TEError, match="scope 'texture' is unknown"):
        s.cache_read(a, "texture", [c])
    other = te.placeholder((2,), name="Other")
    with pytest.raises(TEError, match="Other has no stage in this schedule"):
        s[other]
    d = te.compute((8, 8), lambda i, j: a[i, j] * 2.0, name="D")
    s2 = te.create_schedule([c.op, d.op])
    with pytest.raises(TEError, match="cache_read of B: stage D does not read B"):
        s2.cache_read(b, "shared", [d])
    s2[c].split(s2[c].op.axis[0], 2)
    with pytest.raises(TEError, match="call cache_write before scheduling stage C"):
        s2.cache_write(c, "local")
    with pytest.raises(TEError, match="create_schedule: A is a placeholder"):
        te.create_schedule(a.op)


def test_annotated_axes_cannot_be_split_or_fused():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    s[c].vectorize(j)
    with pytest.raises(TEError, match="split of axis j in stage C: the axis is already vectorized"):
        s[c].split(j, 2)
    s[c].bind(i, te.thread_axis("blockIdx.x"))
    with pytest.raises(TEError, match="fuse of axis i in stage C: the axis is already blockIdx.x"):
        s[c].fuse(i, j)


def test_rfactor_makes_a_partial_stage_over_lanes():
    """C's reduction over k becomes a partial stage C.rf[lane, i, j] (lane t sums k = t, t + 3, ...) and C sums the
    lanes; a factor that does not divide k selects the identity past its end."""
    _, _, c, _ = matmul()
    s = te.create_schedule(c.op)
    partial = s.rfactor(c, 3)
    assert [stage.name for stage in s.stages] == ["A", "B", "C.rf", "C"]
    assert partial.shape == (3, 8, 8)
    (step,) = s[partial].op.reduce_axis
    assert step.extent == 3 and "select" in repr(s[partial].op.body).lower()
    (lanes,) = s[c].op.reduce_axis
    assert lanes.extent == 3 and s[c].leaf_iter_vars[-1] is lanes


def test_rfactor_matches_the_reduction_when_built():
    """Two reduce axes flattened, 37 x 7 elements in 16 lanes, max and sum, against numpy on the llvm target."""
    import numpy as np

    from compiler.build import build

    a = te.placeholder((5, 7, 37), name="A")

    def reduction(combiner):
        i, j = te.reduce_axis((0, 7), "i"), te.reduce_axis((0, 37), "j")
        return te.compute((5,), lambda n: combiner(a[n, i, j], axis=[i, j]), name="B")

    for combiner, reference in ((te.sum, np.sum), (te.max, np.max)):
        b = reduction(combiner)
        s = te.create_schedule(b.op)
        s.rfactor(b, 16)
        kernel = build(s, [a, b], target="llvm", name="rf")
        data, result = np.random.default_rng(0).standard_normal((5, 7, 37)).astype(np.float32), np.zeros(5, np.float32)
        kernel(data, result)
        np.testing.assert_allclose(result, reference(data, axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_rfactor_errors():
    a, b, c = chain()
    s = te.create_schedule(c.op)
    with pytest.raises(TEError, match="only a reduction stage"):
        s.rfactor(c, 4)
    _, _, c, _ = matmul()
    s = te.create_schedule(c.op)
    s[c].split(c.op.axis[0], 2)
    with pytest.raises(TEError, match="before scheduling"):
        s.rfactor(c, 4)
    with pytest.raises(TEError, match="positive int"):
        te.create_schedule(c.op).rfactor(c, 0)


def test_rfactor_tree_halves_the_partials_down_to_two_lanes():
    """16 lanes halve to 8, 4 and 2 (three halving stages), 13 lanes to 7, 4 and 2 (the odd step selects the identity
    past the end); the reduction combines the last two. Built on llvm, sum and max match numpy."""
    import numpy as np

    from compiler.build import build

    a = te.placeholder((5, 7, 37), name="A")

    def reduction(combiner):
        i, j = te.reduce_axis((0, 7), "i"), te.reduce_axis((0, 37), "j")
        return te.compute((5,), lambda n: combiner(a[n, i, j], axis=[i, j]), name="B")

    for factor, widths in ((16, [16, 8, 4, 2]), (13, [13, 7, 4, 2])):
        for combiner, reference in ((te.sum, np.sum), (te.max, np.max)):
            b = reduction(combiner)
            s = te.create_schedule(b.op)
            chain = s.rfactor_tree(b, factor)
            assert [tensor.shape[0] for tensor in chain] == widths
            (lanes,) = s[b].op.reduce_axis
            assert lanes.extent == 2
            kernel = build(s, [a, b], target="llvm", name="tree")
            data = np.random.default_rng(1).standard_normal((5, 7, 37)).astype(np.float32)
            result = np.zeros(5, np.float32)
            kernel(data, result)
            np.testing.assert_allclose(result, reference(data, axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_recompute_gives_readers_an_inlined_copy():
    """B is an output that C also reads: after recompute C reads an inlined copy of B's compute (A + 1) instead of
    B's stored values, and the result is the same."""
    import numpy as np

    from compiler.build import build

    a = te.placeholder((8, 6), name="A")
    b = te.compute((8, 6), lambda i, j: a[i, j] + 1.0, name="B")
    c = te.compute((8, 6), lambda i, j: b[i, j] * 2.0, name="C")
    s = te.create_schedule([b.op, c.op])
    copy = s.recompute(b)
    assert s[copy].attach_type == "inline" and s[b] not in s.producers_of(s[c])
    kernel = build(s, [a, b, c], target="llvm", name="recompute")
    data, first, second = (
        np.arange(48, dtype=np.float32).reshape(8, 6),
        np.zeros((8, 6), np.float32),
        np.zeros((8, 6), np.float32),
    )
    kernel(data, first, second)
    np.testing.assert_allclose(first, data + 1)
    np.testing.assert_allclose(second, (data + 1) * 2)
    with pytest.raises(TEError, match="no stage reads it"):
        s.recompute(c)
