"""End to end: TE compute + schedule -> lower -> LLVM (native and wasm32) -> run, checked against numpy."""

import numpy as np
import pytest

import compiler.te as te
from compiler.build import build
from compiler.te import TEError
from compiler.te.expr import Logical, Select

TARGETS = ["llvm", "wasm"]
RNG = np.random.default_rng(0)


def rand(shape, dtype="float32"):
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -100), min(info.max, 100), size=shape, dtype=dtype)
    return RNG.standard_normal(shape).astype(dtype)


def run(schedule, args, inputs, target, name="kernel"):
    """Build, then call with `inputs` plus a zeroed array for each remaining (output) arg."""
    kernel = build(schedule, args, target=target, name=name)
    outputs = [np.zeros(tuple(t.shape), t.dtype) for t in args[len(inputs) :]]
    kernel(*inputs, *outputs)
    return outputs[0] if len(outputs) == 1 else outputs


def elementwise(shape=(37, 19)):
    a = te.placeholder(shape, name="A")
    b = te.compute(shape, lambda *i: a[i] * 2.0 + 1.0, name="B")
    return a, b


def matmul(n, m, k_extent, dtype="float32", acc="float32"):
    a = te.placeholder((n, k_extent), dtype, name="A")
    b = te.placeholder((k_extent, m), dtype, name="B")
    k = te.reduce_axis((0, k_extent), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k), name="C")
    return a, b, c, k


def matmul_reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "primitive",
    ["plain", "split", "split_nondividing", "nparts", "tile", "reorder", "fuse", "vectorize", "unroll", "parallel"],
)
def test_loop_primitives_on_elementwise(target, primitive):
    a, b = elementwise()
    s = te.create_schedule(b.op)
    i, j = s[b].op.axis
    if primitive == "split":
        s[b].split(j, factor=19)
    elif primitive == "split_nondividing":
        s[b].split(i, factor=8)
    elif primitive == "nparts":
        s[b].split(j, nparts=4)
    elif primitive == "tile":
        s[b].tile(i, j, 8, 4)
    elif primitive == "reorder":
        s[b].reorder(j, i)
    elif primitive == "fuse":
        fused = s[b].fuse(i, j)
        s[b].split(fused, 16)
    elif primitive == "vectorize":
        outer, inner = s[b].split(j, 8)
        s[b].vectorize(inner)
    elif primitive == "unroll":
        outer, inner = s[b].split(j, 4)
        s[b].unroll(inner)
    elif primitive == "parallel":
        s[b].parallel(i)
    x = rand(a.shape)
    np.testing.assert_allclose(run(s, [a, b], [x], target), x * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_elementwise(target):
    a = te.placeholder((8, 1, 5), name="A")
    b = te.placeholder((6, 5), name="B")
    c = te.compute((8, 6, 5), lambda i, j, k: te.maximum(a[i, 0, k] - b[j, k], 0.0), name="C")
    s = te.create_schedule(c.op)
    s[c].vectorize(s[c].op.axis[2])
    x, y = rand(a.shape), rand(b.shape)
    np.testing.assert_allclose(run(s, [a, b, c], [x, y], target), np.maximum(x - y, 0), rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("combiner", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_reductions(target, combiner, axis):
    a = te.placeholder((13, 22), name="A")
    extent = a.shape[axis]
    r = te.reduce_axis((0, extent), name="r")
    reducer = {"sum": te.sum, "max": te.max, "min": te.min}[combiner]
    if axis == 1:
        out = te.compute((13,), lambda i: reducer(a[i, r], axis=r), name="R")
    else:
        out = te.compute((22,), lambda j: reducer(a[r, j], axis=r), name="R")
    s = te.create_schedule(out.op)
    outer, inner = s[out].split(r, 4)
    s[out].reorder(outer, s[out].op.axis[0], inner)
    x = rand(a.shape)
    expected = {"sum": np.sum, "max": np.max, "min": np.min}[combiner](x, axis=axis)
    np.testing.assert_allclose(run(s, [a, out], [x], target), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_tiled_vectorized_unrolled_parallel_matmul(target):
    a, b, c, k = matmul(256, 256, 256)
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    io, jo, ii, ji = s[c].tile(i, j, 32, 32)
    ko, ki = s[c].split(k, 4)
    s[c].reorder(io, jo, ko, ii, ki, ji)
    s[c].vectorize(ji)
    s[c].unroll(ki)
    s[c].parallel(io)
    x, y = rand(a.shape), rand(b.shape)
    np.testing.assert_allclose(run(s, [a, b, c], [x, y], target), matmul_reference(x, y), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("target", TARGETS)
def test_compute_at_and_compute_inline(target):
    a = te.placeholder((20, 30), name="A")
    b = te.compute((20, 30), lambda i, j: a[i, j] + 1.0, name="B")
    c = te.compute((20, 30), lambda i, j: b[i, j] * 3.0, name="C")
    d = te.compute((20, 29), lambda i, j: c[i, j] + c[i, j + 1], name="D")
    s = te.create_schedule(d.op)
    s[b].compute_inline()
    io, ii = s[d].split(s[d].op.axis[0], 8)
    s[c].compute_at(s[d], io)
    x = rand(a.shape)
    expected = (x + 1) * 3
    np.testing.assert_allclose(run(s, [a, d], [x], target), expected[:, :-1] + expected[:, 1:], rtol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_bind_runs_serially_on_cpu(target):
    a, b = elementwise((64, 48))
    s = te.create_schedule(b.op)
    fused = s[b].fuse(*s[b].op.axis)
    bx, tx = s[b].split(fused, 64)
    s[b].bind(bx, te.thread_axis("blockIdx.x"))
    s[b].bind(tx, te.thread_axis("threadIdx.x"))
    x = rand(a.shape)
    np.testing.assert_allclose(run(s, [a, b], [x], target), x * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_gpu_style_matmul_with_shared_and_local_caches(target):
    a, b, c, _ = matmul(64, 48, 40)
    s = te.create_schedule(c.op)
    a_shared = s.cache_read(a, "shared", [c])
    b_shared = s.cache_read(b, "shared", [c])
    c_local = s.cache_write(c, "local")
    i, j = s[c].op.axis
    bx, ty = s[c].split(i, 16)
    by, tx = s[c].split(j, 16)
    s[c].reorder(bx, by, ty, tx)
    s[c].bind(bx, te.thread_axis("blockIdx.y"))
    s[c].bind(by, te.thread_axis("blockIdx.x"))
    s[c].bind(ty, te.thread_axis("threadIdx.y"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    s[c_local].compute_at(s[c], tx)
    ko, ki = s[c_local].split(s[c_local].op.reduce_axis[0], 8)
    for cache in (a_shared, b_shared):
        s[cache].compute_at(s[c_local], ko)
        row, column = s[cache].op.axis
        s[cache].bind(row, te.thread_axis("threadIdx.y"))
    x, y = rand(a.shape), rand(b.shape)
    np.testing.assert_allclose(run(s, [a, b, c], [x, y], target), matmul_reference(x, y), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_cache_read_and_cache_write_local(target):
    a, b, c, k = matmul(30, 20, 10)
    s = te.create_schedule(c.op)
    b_local = s.cache_read(b, "local", [c])
    c_local = s.cache_write(c, "local")
    io, jo, ii, ji = s[c].tile(*s[c].op.axis, 8, 8)
    s[c_local].compute_at(s[c], jo)
    s[b_local].compute_at(s[c_local], s[c_local].op.reduce_axis[0])
    s[c_local].reorder(s[c_local].op.reduce_axis[0], *s[c_local].op.axis)
    x, y = rand(a.shape), rand(b.shape)
    np.testing.assert_allclose(run(s, [a, b, c], [x, y], target), matmul_reference(x, y), rtol=1e-4, atol=1e-4)


def depthwise_conv2d(batch, in_channel, in_height, in_width, channel_multiplier, filter_height, filter_width):
    """The seeds' depthwise convolution, written as the tutorial writes it (stride 1, pad same)."""
    stride_h = stride_w = 1
    pad_top, pad_left = (filter_height - 1) // 2, (filter_width - 1) // 2
    height_after_pad = in_height + filter_height - 1
    width_after_pad = in_width + filter_width - 1
    out_channel = in_channel * channel_multiplier
    out_height, out_width = in_height, in_width
    Input = te.placeholder((batch, in_channel, in_height, in_width), name="Input")
    Filter = te.placeholder((in_channel, channel_multiplier, filter_height, filter_width), name="Filter")
    PaddedInput = te.compute(
        (batch, in_channel, height_after_pad, width_after_pad),
        lambda b, c, i, j: te.select(
            te.all(i >= pad_top, i - pad_top < in_height, j >= pad_left, j - pad_left < in_width),
            Input[b, c, i - pad_top, j - pad_left],
            te.const(0.0),
        ),
        name="PaddedInput",
    )
    di = te.reduce_axis((0, filter_height), name="di")
    dj = te.reduce_axis((0, filter_width), name="dj")
    Output = te.compute(
        (batch, out_channel, out_height, out_width),
        lambda b, c, i, j: te.sum(
            PaddedInput[b, c // channel_multiplier, i * stride_h + di, j * stride_w + dj]
            * Filter[c // channel_multiplier, c % channel_multiplier, di, dj],
            axis=[di, dj],
        ),
        name="DepthwiseConv2d",
    )
    return Input, Filter, PaddedInput, Output


def test_the_seeds_depthwise_conv_is_expressible_as_written():
    Input, Filter, PaddedInput, Output = depthwise_conv2d(1, 4, 8, 8, 2, 3, 3)
    assert Output.shape == (1, 8, 8, 8)
    assert [axis.name for axis in Output.op.reduce_axis] == ["di", "dj"]
    assert set(map(id, Output.op.input_tensors)) == {id(PaddedInput), id(Filter)}
    assert isinstance(PaddedInput.op.body, Select)
    assert isinstance(PaddedInput.op.body.cond, Logical)


def depthwise_reference(x, w):
    batch, channels, height, width = x.shape
    multiplier, filter_height, filter_width = w.shape[1:]
    padded = np.pad(x, ((0, 0), (0, 0), ((filter_height - 1) // 2,) * 2, ((filter_width - 1) // 2,) * 2))
    out = np.zeros((batch, channels * multiplier, height, width), np.float64)
    for c in range(channels * multiplier):
        for p in range(filter_height):
            for q in range(filter_width):
                window = padded[:, c // multiplier, p : p + height, q : q + width]
                out[:, c] += window * w[c // multiplier, c % multiplier, p, q]
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_conv_with_the_seeds_2x2_tiling(target, multiplier):
    """Each inner step computes a 2x2 output tile from a 4x4 input window held in a local cache."""
    Input, Filter, PaddedInput, Output = depthwise_conv2d(1, 32, 32, 32, multiplier, 3, 3)
    s = te.create_schedule(Output.op)
    window = s.cache_read(PaddedInput, "local", [Output])
    s[PaddedInput].compute_inline()
    b, c, i, j = s[Output].op.axis
    di, dj = s[Output].op.reduce_axis
    io, jo, ii, ji = s[Output].tile(i, j, 2, 2)
    s[Output].reorder(b, c, io, jo, di, dj, ii, ji)
    s[Output].unroll(ii)
    s[Output].unroll(ji)
    s[Output].parallel(c)
    s[window].compute_at(s[Output], jo)
    assert s[window].op.shape == PaddedInput.shape
    assert "PaddedInput.local: float32[1, 1, 4, 4] local" in build_tir(s, [Input, Filter, Output])
    x, w = rand(Input.shape), rand(Filter.shape)
    out = run(s, [Input, Filter, Output], [x, w], target)
    np.testing.assert_allclose(out, depthwise_reference(x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_conv_vectorized(target):
    Input, Filter, PaddedInput, Output = depthwise_conv2d(1, 8, 20, 20, 1, 3, 3)
    s = te.create_schedule(Output.op)
    b, c, i, j = s[Output].op.axis
    di, dj = s[Output].op.reduce_axis
    jo, ji = s[Output].split(j, 8)
    s[Output].reorder(b, c, i, jo, di, dj, ji)
    s[Output].vectorize(ji)
    s[PaddedInput].compute_at(s[Output], i)
    x, w = rand(Input.shape), rand(Filter.shape)
    out = run(s, [Input, Filter, Output], [x, w], target)
    np.testing.assert_allclose(out, depthwise_reference(x, w), rtol=1e-4, atol=1e-4)


def build_tir(schedule, args):
    from compiler.tir.lower import lower
    from compiler.tir.printer import format_func

    return format_func(lower(schedule, args, "kernel"))


@pytest.mark.parametrize("target", TARGETS)
def test_float16_elementwise_and_reduction(target):
    a = te.placeholder((16, 24), "float16", name="A")
    k = te.reduce_axis((0, 24), name="k")
    scaled = te.compute((16, 24), lambda i, j: a[i, j] * te.const(0.5, "float16"), name="S")
    total = te.compute((16,), lambda i: te.sum(scaled[i, k], axis=k), name="T")
    s = te.create_schedule(total.op)
    s[scaled].compute_inline()
    x = rand(a.shape, "float16")
    out = run(s, [a, total], [x], target)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, (x.astype(np.float32) * 0.5).sum(axis=1), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("target", TARGETS)
def test_int8_matmul_accumulates_in_int32(target):
    a, b, c, k = matmul(16, 32, 64, dtype="int8", acc="int32")
    s = te.create_schedule(c.op)
    jo, ji = s[c].split(s[c].op.axis[1], 8)
    s[c].reorder(s[c].op.axis[0], jo, k, ji)
    s[c].vectorize(ji)
    x, y = rand(a.shape, "int8"), rand(b.shape, "int8")
    out = run(s, [a, b, c], [x, y], target)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, x.astype(np.int32) @ y.astype(np.int32))


@pytest.mark.parametrize("target", TARGETS)
def test_uint8_and_bool_compare(target):
    a = te.placeholder((40,), "uint8", name="A")
    b = te.compute((40,), lambda i: te.select(a[i] > te.const(100, "uint8"), a[i], te.const(0, "uint8")), name="B")
    s = te.create_schedule(b.op)
    x = RNG.integers(0, 255, size=40, dtype=np.uint8)
    np.testing.assert_array_equal(run(s, [a, b], [x], target), np.where(x > 100, x, 0))


@pytest.mark.parametrize("target", TARGETS)
def test_padding_select_reads_only_inside_the_input(target):
    a = te.placeholder((10,), name="A")
    padded = te.compute((14,), lambda i: te.select(te.all(i >= 2, i < 12), a[i - 2], 0.0), name="P")
    s = te.create_schedule(padded.op)
    outer, inner = s[padded].split(padded.op.axis[0], 7)
    s[padded].vectorize(inner)
    x = rand(a.shape)
    np.testing.assert_allclose(run(s, [a, padded], [x], target), np.pad(x, 2))


def test_schedule_errors_surface_before_building():
    a, b = elementwise()
    s = te.create_schedule(b.op)
    outer, inner = s[b].split(s[b].op.axis[0], 4)
    with pytest.raises(TEError, match="already split into ax0.outer and ax0.inner"):
        s[b].split(s[b].op.axis[0], 2)
    with pytest.raises(TEError, match="output B is not in the arguments"):
        build(s, [a], target="llvm", name="missing_output")
    with pytest.raises(TEError, match="reads placeholder A, which is not in the arguments"):
        build(s, [b], target="llvm", name="missing_input")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("position", range(6))
def test_compute_at_every_loop_of_a_tiled_stencil(target, position):
    """The producer's region is inferred per attach point; tiles of 3x4 do not divide 9x11."""
    a = te.placeholder((11, 13), name="A")
    b = te.compute((11, 13), lambda i, j: a[i, j] * 2.0, name="B")
    r = te.reduce_axis((0, 3), name="r")
    q = te.reduce_axis((0, 3), name="q")
    c = te.compute((9, 11), lambda i, j: te.sum(b[i + r, j + q], axis=[r, q]), name="C")
    s = te.create_schedule(c.op)
    io, jo, ii, ji = s[c].tile(*c.op.axis, 3, 4)
    s[c].reorder(io, jo, r, ii, q, ji)
    s[c].vectorize(ji)
    s[b].compute_at(s[c], s[c].leaf_iter_vars[position])
    s[b].set_scope("local")
    x = rand(a.shape)
    doubled = x * 2
    expected = sum(doubled[p : p + 9, t : t + 11] for p in range(3) for t in range(3))
    np.testing.assert_allclose(run(s, [a, c], [x], target), expected, rtol=1e-5, atol=1e-5)
