"""Tensor-expression computes of the data-movement and shape ops (compiler/graph/ops/transform.py).

Every output element is one read of an input at a computed index (no arithmetic on the data), so each
stage is tagged "injective" and a schedule inlines it into its reader. Shape rules come from the graph
layer's own helpers, so the computes and the references can never disagree about a shape.
"""

from __future__ import annotations

import math

import numpy as np

from compiler import te
from compiler.compute import tags
from compiler.compute.elementwise import broadcast_read, constant
from compiler.graph.ops import transform as graph_transform
from compiler.graph.ops.common import normalize_axis
from compiler.graph.registry import set_compute
from compiler.te.expr import Compare, Const, Expr
from compiler.te.tensor import identity_element


def _int(value: int) -> Const:
    return Const(int(value), "int32")


def clamp(index: Expr, low: int, high: int) -> Expr:
    """`index` held in [low, high]: every arm of a select then reads in bounds, so the select stays a
    plain (vectorizable) select instead of a branch."""
    return te.maximum(te.minimum(index, high), low)


def _strides(shape) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return list(reversed(strides))


def _reshape_groups(source, target) -> list[tuple[int, int, int, int]] | None:
    """A reshape as independent merges and splits: runs (source start, end, target start, end) of equal products,
    each as short as can be, or None where none tile both shapes (never for a valid reshape). A dim of 1 on one side
    only is a group of its own (an Unsqueeze's new axis), so it never joins a symbolic dim to its neighbours."""
    groups, i, j = [], 0, 0
    while i < len(source) or j < len(target):
        unit_source = i < len(source) and _is_one(source[i])
        unit_target = j < len(target) and _is_one(target[j])
        if unit_source != unit_target:
            groups.append((i, i + unit_source, j, j + unit_target))
            i, j = i + unit_source, j + unit_target
            continue
        start_i, start_j = i, j
        left = source[i] if i < len(source) else 1
        right = target[j] if j < len(target) else 1
        i, j = min(i + 1, len(source)), min(j + 1, len(target))
        while left != right:
            if not (isinstance(left, int) and isinstance(right, int)):
                # a symbolic product is matched by growing the side whose last dim is the smaller static one
                grow_left = j >= len(target) or (i < len(source) and isinstance(source[i], int))
            else:
                grow_left = left < right
            if grow_left and i < len(source):
                left, i = left * source[i], i + 1
            elif j < len(target):
                right, j = right * target[j], j + 1
            else:
                return None
        groups.append((start_i, i, start_j, j))
    return groups


def _is_one(dim) -> bool:
    return isinstance(dim, int) and dim == 1


def _reshaped(x: te.Tensor, shape, name: str) -> te.Tensor:
    """`x` read in row-major order into `shape`: the output position's flat offset, unravelled. A reshape of a
    symbolic shape does that per group of dims that it merges or splits (_reshape_groups): a dim kept as it is (the
    sequence of a head split) then reads straight through, where a whole-tensor offset divided by a run's size."""
    groups = None
    if not all(isinstance(d, int) for d in (*x.shape, *shape)):
        groups = _reshape_groups(tuple(x.shape), tuple(shape))
    if groups is not None:

        def grouped(*index):
            source = []
            for start_i, end_i, start_j, end_j in groups:
                part = _reshaped_index(index[start_j:end_j], shape[start_j:end_j], x.shape[start_i:end_i])
                source.extend(part)
            return x[tuple(source)]

        return te.compute(shape, grouped, name=name, tag=tags.INJECTIVE)

    def body(*index):
        return x[tuple(_unravelled(_flat_index(index, shape), x.shape))]

    return te.compute(shape, body, name=name, tag=tags.INJECTIVE)


def _flat_index(index, shape):
    """The row-major offset of `index` in `shape`."""
    flat = _int(0)
    for position, stride in zip(index, _strides(shape), strict=True):
        flat = flat + position * stride if stride != 1 else flat + position
    return flat


def _unravelled(flat, shape) -> list:
    """The index in `shape` of the row-major offset `flat`."""
    source = []
    for dim, stride in zip(shape, _strides(shape), strict=True):
        part = flat // stride if stride != 1 else flat
        source.append(part % dim if dim != 1 else _int(0))
    return source


def _reshaped_index(index, shape, source_shape) -> list:
    """The indices into `source_shape` of the element at `index` of `shape`, two shapes of one size (a group)."""
    if tuple(shape) == tuple(source_shape):
        return list(index)
    return _unravelled(_flat_index(index, shape), source_shape)


def _reshape_like(name: str):
    def compute(inputs, attrs, output_types):
        return [_reshaped(inputs[0], output_types[0].shape, name)]

    return compute


for _op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
    set_compute(_op, _reshape_like(_op.lower()))


def _transpose(inputs, attrs, output_types):
    (x,) = inputs
    perm = graph_transform.permutation(len(x.shape), **attrs)

    def body(*index):
        source = [None] * len(perm)
        for position, axis in zip(index, perm, strict=True):
            source[axis] = position
        return x[tuple(source)]

    return [te.compute(output_types[0].shape, body, name="transpose", tag=tags.INJECTIVE)]


set_compute("Transpose", _transpose)


def _concat(inputs, attrs, output_types):
    parts = [tensor for tensor in inputs if tensor is not None]
    axis = normalize_axis(attrs["axis"], len(parts[0].shape), "Concat axis")
    offsets = np.cumsum([0] + [part.shape[axis] for part in parts]).tolist()
    # a part of a symbolic size (a cache that may be empty) stays: at a run where it is empty, no index selects it
    present = [k for k, part in enumerate(parts) if not (isinstance(part.shape[axis], int) and part.shape[axis] == 0)]

    def body(*index):
        def read(k):
            shifted = list(index)
            shifted[axis] = clamp(index[axis] - offsets[k], 0, parts[k].shape[axis] - 1)
            return parts[k][tuple(shifted)]

        result = read(present[-1])
        for k in reversed(present[:-1]):
            result = te.select(index[axis] < offsets[k + 1], read(k), result)
        return result

    return [te.compute(output_types[0].shape, body, name="concat", tag=tags.INJECTIVE)]


set_compute("Concat", _concat)


def _split(inputs, attrs, output_types):
    x = inputs[0]
    axis, sizes = graph_transform.split_sizes(x.shape, _outputs=len(output_types), **attrs)
    outputs, offset = [], 0
    for k, output in enumerate(output_types):

        def body(*index, offset=offset):
            source = list(index)
            source[axis] = index[axis] + offset
            return x[tuple(source)]

        outputs.append(te.compute(output.shape, body, name=f"split{k}", tag=tags.INJECTIVE))
        offset += sizes[k]
    return outputs


def _split_attrs(attrs):
    return {key: value for key, value in attrs.items() if key != "_outputs"}


set_compute("Split", lambda inputs, attrs, output_types: _split(inputs, _split_attrs(attrs), output_types))


def _slice(inputs, attrs, output_types):
    x = inputs[0]
    slices, shape = graph_transform.slice_plan(x.shape, **attrs)

    def body(*index):
        source = []
        for position, piece in zip(index, slices, strict=True):
            # slice_plan's starts are clamped already (and may be symbolic sizes); an axis it leaves whole has none
            start = 0 if piece.start is None else piece.start
            step = 1 if piece.step is None else piece.step
            source.append(position * step + start if (start, step) != (0, 1) else position)
        return x[tuple(source)]

    return [te.compute(shape, body, name="slice", tag=tags.INJECTIVE)]


set_compute("Slice", _slice)


def _pad(inputs, attrs, output_types):
    x = inputs[0]
    mode = attrs.get("mode", "constant")
    widths = graph_transform.pad_widths(x.shape, **attrs)
    fill = attrs.get("constant_value")
    fill = fill if fill is not None else attrs.get("value")
    fill = constant(0 if fill is None else np.asarray(fill).reshape(-1)[0], x.dtype)

    def body(*index):
        source, inside = [], []
        for position, dim, (begin, end) in zip(index, x.shape, widths, strict=True):
            # the reference crops by negative pads first, then pads what is left
            crop = max(-begin, 0)
            kept = dim - crop - max(-end, 0)
            offset = position - max(begin, 0) if begin > 0 else position
            if (begin, end) == (0, 0):
                source.append(position)
            elif mode == "constant":
                inside += [offset >= 0, offset < kept]
                source.append(clamp(offset, 0, kept - 1) + crop if crop else clamp(offset, 0, kept - 1))
            else:
                source.append(_fold_into(offset, kept, mode) + crop if crop else _fold_into(offset, kept, mode))
        value = x[tuple(source)]
        return te.select(te.all(*inside), value, fill) if inside else value

    return [te.compute(output_types[0].shape, body, name="pad", tag=tags.INJECTIVE)]


def _fold_into(offset: Expr, dim: int, mode: str) -> Expr:
    """A position outside [0, dim) mapped back inside as numpy's reflect, edge or wrap padding does."""
    if mode == "edge":
        return te.minimum(te.maximum(offset, 0), dim - 1)
    if mode == "wrap":
        return offset % dim
    if dim == 1:
        return _int(0)
    period = 2 * (dim - 1)
    folded = offset % period
    return te.select(folded < dim, folded, period - folded)


set_compute("Pad", _pad)


def _checked(index: Expr, dim: int) -> Expr:
    """A runtime index into an axis of `dim`, negatives counted from the end as ONNX reads them, checked in
    the index's own width (an int64 2**32 + 1 must not wrap to 1) and narrowed to int32 once it is in range,
    unless the axis itself is longer than int32 counts; one out of range makes the run fail (te.index_check)
    and reads element 0 meanwhile."""
    if index.dtype not in ("int32", "int64"):
        index = index.astype("int64")
    wrapped = te.select(index < 0, index + dim, index)
    checked = te.index_check(wrapped, dim)
    return checked if checked.dtype == "int32" or dim > np.iinfo(np.int32).max else checked.astype("int32")


def _gather(inputs, attrs, output_types):
    data, indices = inputs
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape), "Gather axis")
    rank = len(indices.shape)

    def body(*index):
        position = _checked(indices[tuple(index[axis : axis + rank])], data.shape[axis])
        return data[(*index[:axis], position, *index[axis + rank :])]

    return [te.compute(output_types[0].shape, body, name="gather", tag=tags.INJECTIVE)]


set_compute("Gather", _gather)


def _gather_elements(inputs, attrs, output_types):
    data, indices = inputs
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape), "GatherElements axis")

    def body(*index):
        source = list(index)
        source[axis] = _checked(indices[index], data.shape[axis])
        return data[tuple(source)]

    return [te.compute(output_types[0].shape, body, name="gather_elements", tag=tags.INJECTIVE)]


set_compute("GatherElements", _gather_elements)


def _gather_nd(inputs, attrs, output_types):
    data, indices = inputs
    batch = attrs.get("batch_dims", 0)
    depth, middle = indices.shape[-1], len(indices.shape) - 1 - batch

    def body(*index):
        leading = index[: batch + middle]
        source = [_checked(indices[(*leading, _int(axis))], data.shape[batch + axis]) for axis in range(depth)]
        return data[(*index[:batch], *source, *index[batch + middle :])]

    return [te.compute(output_types[0].shape, body, name="gather_nd", tag=tags.INJECTIVE)]


set_compute("GatherND", _gather_nd)


def _scatter_nd(inputs, attrs, output_types):
    """For each element the data addresses, the last update row whose (checked) indices name it, found by a max
    reduction over the update rows; then that row's value, or the data where none names it. Every row's indices
    are checked, whichever element they name, and the work is the number of addressed elements times the rows."""
    data, indices, updates = inputs
    depth, rows = indices.shape[-1], indices.shape[:-1]
    strides = _strides(rows)

    def last_body(*position):
        axes = [te.reduce_axis((0, extent), name=f"u{number}") for number, extent in enumerate(rows)]
        flat = _int(0)
        for axis, stride in zip(axes, strides):
            flat = flat + axis * stride if stride != 1 else flat + axis
        named = te.all(
            *(
                Compare("eq", _checked(indices[(*axes, _int(column))], data.shape[column]), place)
                for column, place in enumerate(position)
            )
        )
        return te.max(te.select(named, flat, _int(-1)), axis=axes) if axes else te.select(named, flat, _int(-1))

    last = te.compute(data.shape[:depth], last_body, name="scatter_nd_last", tag=tags.REDUCE)

    def body(*index):
        row = last[index[:depth]]
        safe = te.maximum(row, 0)
        source = [safe // stride % extent if stride != 1 else safe % extent for stride, extent in zip(strides, rows)]
        return te.select(row >= 0, updates[(*source, *index[depth:])], data[index])

    return [te.compute(data.shape, body, name="scatter_nd", tag=tags.INJECTIVE)]


set_compute("ScatterND", _scatter_nd)


def _scatter_elements(inputs, attrs, output_types):
    """For each data element, the updates on its line along the axis whose (checked) index names it: the last of them
    (a max reduction over the line's positions) with reduction none, else all of them summed, or their max or min,
    then combined with the data. Positions past the indices' extent off the axis take the data as it is. The work is
    the data's size times the indices' extent along the axis."""
    data, indices, updates = inputs
    reduction = attrs.get("reduction", "none")
    axis = graph_transform.scatter_elements_axis(
        data.shape, indices.shape, updates.shape, attrs.get("axis", 0), reduction
    )
    line, dim = indices.shape[axis], data.shape[axis]
    shorter = [position for position in range(len(data.shape)) if indices.shape[position] < data.shape[position]]

    def source(index, k) -> tuple:
        # clamped so that every read is in bounds; `covered` says whether the position has updates at all
        held = [
            clamp(place, 0, indices.shape[position] - 1) if position in shorter else place
            for position, place in enumerate(index)
        ]
        held[axis] = k
        return tuple(held)

    def named(index, k) -> Expr:
        hit = Compare("eq", _checked(indices[source(index, k)], dim), index[axis])
        covered = [index[position] < indices.shape[position] for position in shorter if position != axis]
        return te.all(hit, *covered) if covered else hit

    def last_body(*index):
        k = te.reduce_axis((0, line), name="k")
        return te.max(te.select(named(index, k), k, _int(-1)), axis=k)

    if reduction == "none":
        last = te.compute(data.shape, last_body, name="scatter_elements_last", tag=tags.REDUCE)

        def body(*index):
            row = last[index]
            return te.select(row >= 0, updates[source(index, te.maximum(row, 0))], data[index])

        return [te.compute(data.shape, body, name="scatter_elements", tag=tags.INJECTIVE)]

    combiner = {"add": "sum", "max": "max", "min": "min"}[reduction]
    empty = identity_element(combiner, data.dtype)

    def combined_body(*index):
        k = te.reduce_axis((0, line), name="k")
        value = te.select(named(index, k), updates[source(index, k)], empty)
        return {"sum": te.sum, "max": te.max, "min": te.min}[combiner](value, axis=k)

    combined = te.compute(data.shape, combined_body, name="scatter_elements_updates", tag=tags.REDUCE)
    if combiner == "sum":
        return [
            te.compute(
                data.shape, lambda *index: data[index] + combined[index], name="scatter_elements", tag=tags.INJECTIVE
            )
        ]
    # the max (min) of no updates is the dtype's lowest (highest) value, which must leave the data as it is
    last = te.compute(data.shape, last_body, name="scatter_elements_last", tag=tags.REDUCE)
    merge = te.maximum if combiner == "max" else te.minimum

    def merged_body(*index):
        return te.select(last[index] >= 0, merge(data[index], combined[index]), data[index])

    return [te.compute(data.shape, merged_body, name="scatter_elements", tag=tags.INJECTIVE)]


set_compute("ScatterElements", _scatter_elements)


def _one_hot(inputs, attrs, output_types):
    """Reads nothing at its indices (each output element compares its class with one index), so an index out of
    range needs no check: it matches no class and its row is all off, as onnxruntime gives."""
    indices, values = inputs
    count = graph_transform.one_hot_depth(attrs["depth"])
    axis = normalize_axis(attrs.get("axis", -1), len(indices.shape) + 1, "OneHot axis")
    off, on = (values[tuple(_int(part) for part in np.unravel_index(k, values.shape))] for k in (0, 1))

    def body(*index):
        position = indices[(*index[:axis], *index[axis + 1 :])]
        if position.dtype != "int64":
            position = position.astype("int64")
        wrapped = te.select(position < 0, position + count, position)
        return te.select(Compare("eq", wrapped, index[axis].astype("int64")), on, off)

    return [te.compute(output_types[0].shape, body, name="one_hot", tag=tags.INJECTIVE)]


set_compute("OneHot", _one_hot)


def _expand(inputs, attrs, output_types):
    x = inputs[0]
    return [
        te.compute(output_types[0].shape, lambda *index: broadcast_read(x, index), name="expand", tag=tags.BROADCAST)
    ]


set_compute("Expand", _expand)


def _tile(inputs, attrs, output_types):
    x = inputs[0]

    def body(*index):
        return x[tuple(position % dim if dim != 1 else _int(0) for position, dim in zip(index, x.shape, strict=True))]

    return [te.compute(output_types[0].shape, body, name="tile", tag=tags.INJECTIVE)]


set_compute("Tile", _tile)


def _depth_to_space(inputs, attrs, output_types):
    x = inputs[0]
    block, mode = attrs["blocksize"], attrs.get("mode", "DCR")
    channels = output_types[0].shape[1]

    def body(n, c, h, w):
        row, column = h % block, w % block
        if mode == "DCR":
            depth = (row * block + column) * channels + c
        else:
            depth = c * block * block + row * block + column
        return x[n, depth, h // block, w // block]

    return [te.compute(output_types[0].shape, body, name="depth_to_space", tag=tags.INJECTIVE)]


set_compute("DepthToSpace", _depth_to_space)


def _space_to_depth(inputs, attrs, output_types):
    x = inputs[0]
    block, mode = attrs["blocksize"], attrs.get("mode", "DCR")
    channels = x.shape[1]

    def body(n, c, h, w):
        if mode == "DCR":
            offset, source_channel = c // channels, c % channels
        else:
            offset, source_channel = c % (block * block), c // (block * block)
        return x[n, source_channel, h * block + offset // block, w * block + offset % block]

    return [te.compute(output_types[0].shape, body, name="space_to_depth", tag=tags.INJECTIVE)]


set_compute("SpaceToDepth", _space_to_depth)


def _trilu(inputs, attrs, output_types):
    x = inputs[0]
    k, upper = int(attrs.get("k", 0)), attrs.get("upper", 1)
    zero = constant(0, x.dtype)

    def body(*index):
        row, column = index[-2], index[-1]
        keep = column - row >= k if upper else column - row <= k
        return te.select(keep, x[index], zero)

    return [te.compute(output_types[0].shape, body, name="trilu", tag=tags.INJECTIVE)]


set_compute("Trilu", _trilu)


# -- shape producers: constant folding usually removes these; the computes cover what remains -------------


def _table(values: np.ndarray, output_type, name: str) -> te.Tensor:
    """A stage holding a small constant vector (or scalar) of known values."""
    flat = values.reshape(-1)

    def body(*index):
        if not flat.size:
            return constant(0, output_type.dtype)
        position = index[0] if index else _int(0)
        result = constant(flat[-1], output_type.dtype)
        for k in reversed(range(flat.size - 1)):
            result = te.select(position < k + 1, constant(flat[k], output_type.dtype), result)
        return result

    return te.compute(output_type.shape, body, name=name, tag=tags.INJECTIVE)


def _shape(inputs, attrs, output_types):
    x = inputs[0]
    dims = np.array(x.shape[graph_transform.shape_range(len(x.shape), **attrs)], dtype=np.int64)
    return [_table(dims, output_types[0], "shape")]


set_compute("Shape", _shape)
set_compute(
    "Size",
    lambda inputs, attrs, output_types: [
        _table(np.array(math.prod(inputs[0].shape), np.int64), output_types[0], "size")
    ],
)


def _constant_of_shape(inputs, attrs, output_types):
    value = constant(graph_transform.fill_value(attrs.get("value")).item(), output_types[0].dtype)
    return [te.compute(output_types[0].shape, lambda *index: value, name="constant_of_shape", tag=tags.INJECTIVE)]


set_compute("ConstantOfShape", _constant_of_shape)


def _range(inputs, attrs, output_types):
    dtype = output_types[0].dtype
    start = constant(np.asarray(attrs["start"]).astype(dtype), dtype)
    delta = constant(np.asarray(attrs["delta"]).astype(dtype), dtype)
    return [
        te.compute(output_types[0].shape, lambda i: start + i.astype(dtype) * delta, name="range", tag=tags.INJECTIVE)
    ]


set_compute("Range", _range)


def _size_values(inputs, attrs, output_types):
    """The sizes a run is given, as int64 elements: each one's expression of the size vars, chosen by its flat index."""
    values = [
        te.as_expr(value, "int32").astype("int64") if not isinstance(value, int) else value for value in attrs["values"]
    ]
    shape = tuple(attrs["shape"])

    def body(*index):
        flat = _flat_index(index, shape)
        result = te.const(values[-1], "int64") if isinstance(values[-1], int) else values[-1]
        for k in range(len(values) - 2, -1, -1):
            value = te.const(values[k], "int64") if isinstance(values[k], int) else values[k]
            result = te.select(flat == k, value, result)
        return result

    return [te.compute(shape, body, name="size_values", tag=tags.INJECTIVE)]


set_compute("SizeValues", _size_values)
