"""Data-movement ops (reshape, transpose, slice, pad, gather...) and shape producers (Shape, Size,
ConstantOfShape, Range): their shape rules, INJECTIVE pattern and numpy references.

Shape-deciding inputs arrive as attributes (the frontend moves the constants there), so every output
shape here is known statically; the fusion pass fuses these ops with their neighbours.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.errors import ModelError, RunError, ShapeError, UnsupportedOpError
from compiler.graph.ir import DTYPES, TensorType
from compiler.graph.ops.common import broadcast_shapes, normalize_axes, normalize_axis
from compiler.graph.registry import Pattern, register_op
from compiler.graph.sym import Sym, SymbolicSizeError


def _ints(values, what: str) -> tuple[int, ...]:
    """A const input or attribute as a tuple of ints (a lone scalar counts as one)."""
    if values is None:
        raise ModelError(f"{what} is missing; give it as a constant input or attribute")
    if np.ndim(values) == 0:
        return (_int(values),)
    return tuple(_int(value) for value in np.asarray(values, dtype=object).reshape(-1))


def _int(value):
    """An int, or the Sym of a size known at run time (compiler/graph/sym.py)."""
    return value if isinstance(value, Sym) else int(value)


def _register(name: str, infer, reference, const_inputs=()) -> None:
    """Register an INJECTIVE op whose `infer(types, **attrs)` takes its attributes as keywords."""

    def infer_types(types, attrs):
        return infer(types, **attrs)

    register_op(name, infer=infer_types, pattern=Pattern.INJECTIVE, reference=reference, const_inputs=const_inputs)


def _register_same_dtype(name: str, shape_of, reference=None, const_inputs=()) -> None:
    """Register an op with one tensor input whose output keeps its dtype and has the shape
    `shape_of(input_shape, **attrs)`; the reference defaults to a reshape to that shape."""

    def infer(types, **attrs):
        return [TensorType(shape_of(types[0].shape, **attrs), types[0].dtype)]

    def reshape(x, **attrs):
        return x.reshape(shape_of(x.shape, **attrs)).copy()

    _register(name, infer, reference or reshape, const_inputs)


# -- Flatten, Reshape, Transpose, Squeeze, Unsqueeze ------------------------------------------------


def _flatten_shape(shape, axis=1, **_):
    # axis may equal the rank (everything in the first dimension), so only negatives are shifted
    axis = normalize_axis(axis, len(shape) + 1, "Flatten axis") if axis >= 0 else normalize_axis(axis, len(shape))
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


_register_same_dtype("Flatten", _flatten_shape)


def _reshape_shape(input_shape, shape=None, allowzero=0, **_):
    target = list(_ints(shape, "Reshape shape"))
    for position, dim in enumerate(target):
        if dim == 0 and not allowzero:
            if position >= len(input_shape):
                raise ShapeError(
                    f"Reshape shape {target} copies dimension {position} that the input {list(input_shape)} lacks"
                )
            target[position] = input_shape[position]
    size = math.prod(input_shape)
    unknown = [position for position, dim in enumerate(target) if dim == -1]
    known = math.prod(dim for dim in target if dim != -1)
    if len(unknown) > 1 or any(dim < -1 for dim in target):
        raise ShapeError(f"Reshape shape {target} may hold one -1 and no other negative dimension")
    if unknown:
        if known == 0 or size % known:
            raise ShapeError(f"Reshape cannot infer the -1 in {target} for an input of shape {list(input_shape)}")
        target[unknown[0]] = size // known
    elif known != size:
        raise ShapeError(
            f"Reshape to {target} needs {known} elements, the input of shape {list(input_shape)} has {size}"
        )
    return tuple(target)


_register_same_dtype("Reshape", _reshape_shape, const_inputs=((1, "shape"),))


def permutation(rank, perm=None, **_) -> tuple[int, ...]:
    if perm is None:
        return tuple(reversed(range(rank)))
    perm = normalize_axes(perm, rank)
    if len(perm) != rank:
        raise ShapeError(f"Transpose perm {list(perm)} must name each of the {rank} axes once")
    return perm


_register_same_dtype(
    "Transpose",
    lambda shape, **attrs: tuple(shape[axis] for axis in permutation(len(shape), **attrs)),
    lambda x, **attrs: np.ascontiguousarray(np.transpose(x, permutation(x.ndim, **attrs))),
)


def _squeeze_shape(shape, axes=None, **_):
    if axes is None or not _ints(axes, "Squeeze axes"):
        return tuple(dim for dim in shape if dim != 1)
    axes = normalize_axes(_ints(axes, "Squeeze axes"), len(shape))
    for axis in axes:
        if shape[axis] != 1:
            raise ShapeError(f"Squeeze axis {axis} of shape {list(shape)} has size {shape[axis]}, not 1")
    return tuple(dim for axis, dim in enumerate(shape) if axis not in axes)


_register_same_dtype("Squeeze", _squeeze_shape, const_inputs=((1, "axes"),))


def _unsqueeze_shape(shape, axes=None, **_):
    axes = _ints(axes, "Unsqueeze axes")
    rank = len(shape) + len(axes)
    axes = normalize_axes(axes, rank)
    rest = iter(shape)
    return tuple(1 if axis in axes else next(rest) for axis in range(rank))


_register_same_dtype("Unsqueeze", _unsqueeze_shape, const_inputs=((1, "axes"),))


# -- Concat, Split -----------------------------------------------------------------------------


def _infer_concat(types, axis=None, **_):
    if axis is None:
        raise ModelError("Concat needs an axis attribute")
    first = types[0]
    axis = normalize_axis(axis, len(first.shape), "Concat axis")
    for other in types[1:]:
        if other.dtype != first.dtype:
            raise ModelError(f"Concat inputs differ in dtype ({first.dtype}, {other.dtype}); insert a Cast")
        if len(other.shape) != len(first.shape) or any(
            a != b for position, (a, b) in enumerate(zip(first.shape, other.shape)) if position != axis
        ):
            raise ShapeError(
                f"Concat along axis {axis} needs inputs that agree elsewhere, got {list(first.shape)} and "
                f"{list(other.shape)}"
            )
    total = sum(t.shape[axis] for t in types)
    return [TensorType(first.shape[:axis] + (total,) + first.shape[axis + 1 :], first.dtype)]


_register(
    "Concat",
    _infer_concat,
    lambda *arrays, axis, **_: np.concatenate(arrays, axis=normalize_axis(axis, arrays[0].ndim, "Concat axis")),
)


def split_sizes(shape, axis=0, split=None, num_outputs=None, _outputs=1, **_):
    axis = normalize_axis(axis, len(shape), "Split axis")
    dim = shape[axis]
    if split is not None and np.size(split):
        sizes = _ints(split, "Split split")
        if sum(sizes) != dim or any(size < 0 for size in sizes):
            raise ShapeError(f"Split sizes {list(sizes)} do not add up to dimension {axis} of shape {list(shape)}")
        return axis, sizes
    parts = num_outputs if num_outputs is not None else _outputs
    # opset 18: every part but the last has ceil(dim / parts); before it, parts must divide evenly
    chunk = -(-dim // parts)
    if num_outputs is None and dim % parts:
        raise ShapeError(f"Split cannot cut dimension {axis} of shape {list(shape)} into {parts} equal parts")
    if chunk * (parts - 1) > dim:
        raise ShapeError(f"Split cannot cut dimension {axis} of shape {list(shape)} into {parts} parts")
    return axis, (chunk,) * (parts - 1) + (dim - chunk * (parts - 1),)


def _infer_split(types, **attrs):
    shape = types[0].shape
    axis, sizes = split_sizes(shape, **attrs)
    return [TensorType(shape[:axis] + (size,) + shape[axis + 1 :], types[0].dtype) for size in sizes]


def _split(x, **attrs):
    axis, sizes = split_sizes(x.shape, **attrs)
    return [part.copy() for part in np.split(x, np.cumsum(sizes)[:-1], axis=axis)]


_register("Split", _infer_split, _split, const_inputs=((1, "split"),))


# -- Slice -------------------------------------------------------------------------------------


def slice_plan(shape, starts=None, ends=None, axes=None, steps=None, **_) -> tuple[tuple[slice, ...], tuple[int, ...]]:
    """Python slices and the resulting shape for an ONNX Slice (clamped starts/ends, any step sign)."""
    starts, ends = _ints(starts, "Slice starts"), _ints(ends, "Slice ends")
    rank = len(shape)
    axes = normalize_axes(_ints(axes, "Slice axes"), rank) if axes is not None else tuple(range(len(starts)))
    steps = _ints(steps, "Slice steps") if steps is not None else (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("Slice starts, ends, axes and steps must have the same length")
    slices = [slice(None)] * rank
    out_shape = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis]
        if step == 0:
            raise ShapeError(f"Slice step on axis {axis} is 0; use a non-zero step")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            length = max(0, -(-(end - start) // step))
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            length = max(0, -(-(start - end) // -step))
        # a negative-step end of -1 means "through index 0", which a Python slice spells None
        slices[axis] = slice(start, None if end < 0 else end, step)
        out_shape[axis] = length
    return tuple(slices), tuple(out_shape)


_register_same_dtype(
    "Slice",
    lambda shape, **attrs: slice_plan(shape, **attrs)[1],
    lambda x, **attrs: x[slice_plan(x.shape, **attrs)[0]].copy(),
    const_inputs=((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")),
)


# -- Pad ---------------------------------------------------------------------------------------

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad_widths(shape, pads=None, axes=None, **_) -> list[tuple[int, int]]:
    pads = _ints(pads, "Pad pads")
    rank = len(shape)
    axes = normalize_axes(_ints(axes, "Pad axes"), rank) if axes is not None else tuple(range(rank))
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad pads {list(pads)} must hold a begin and an end for each of {len(axes)} axes")
    widths = [(0, 0)] * rank
    for position, axis in enumerate(axes):
        widths[axis] = (pads[position], pads[position + len(axes)])
    for axis, (begin, end) in enumerate(widths):
        if shape[axis] + begin + end < 0:
            raise ShapeError(f"Pad pads {list(pads)} remove more than dimension {axis} of shape {list(shape)} holds")
    return widths


def _infer_pad(types, mode="constant", **attrs):
    if mode not in _PAD_MODES:
        raise UnsupportedOpError(f"Pad mode {mode!r} is not supported; use one of {', '.join(_PAD_MODES)}")
    shape = types[0].shape
    widths = pad_widths(shape, **attrs)
    return [TensorType(tuple(dim + begin + end for dim, (begin, end) in zip(shape, widths)), types[0].dtype)]


def _pad(x, mode="constant", constant_value=None, value=None, **attrs):
    widths = pad_widths(x.shape, **attrs)
    # negative pads crop first; the positive ones then pad what is left
    crop = tuple(slice(-min(begin, 0), x.shape[axis] + min(end, 0)) for axis, (begin, end) in enumerate(widths))
    cropped = x[crop]
    grow = [(max(begin, 0), max(end, 0)) for begin, end in widths]
    if mode == "constant":
        fill = constant_value if constant_value is not None else value if value is not None else 0
        return np.pad(cropped, grow, mode="constant", constant_values=np.asarray(fill).astype(x.dtype))
    return np.pad(cropped, grow, mode=_PAD_MODES[mode])


_register("Pad", _infer_pad, _pad, const_inputs=((1, "pads"), (2, "constant_value"), (3, "axes")))


# -- Gather, GatherElements, GatherND --------------------------------------------------------------


def _infer_gather(types, axis=0, **_):
    data, indices = types
    axis = normalize_axis(axis, len(data.shape), "Gather axis")
    return [TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1 :], data.dtype)]


def _in_range(indices: np.ndarray, dim: int, op: str) -> np.ndarray:
    """`indices` with negatives counted from the end, after checking each lies in [-dim, dim) as onnxruntime
    does (a compiled kernel's te.index_check makes the run fail the same way)."""
    indices = indices.astype(np.int64)
    outside = (indices < -dim) | (indices >= dim)
    if outside.any():
        raise RunError(f"{op} index {int(indices[outside][0])} is out of range for an axis of {dim} elements")
    return np.where(indices < 0, indices + dim, indices)


def _gather(data, indices, axis=0, **_):
    axis = normalize_axis(axis, data.ndim, "Gather axis")
    return np.take(data, _in_range(indices, data.shape[axis], "Gather"), axis=axis)


_register("Gather", _infer_gather, _gather)


def _infer_gather_elements(types, axis=0, **_):
    data, indices = types
    normalize_axis(axis, len(data.shape), "GatherElements axis")
    if len(indices.shape) != len(data.shape):
        raise ShapeError(f"GatherElements indices of shape {list(indices.shape)} must have the rank of the data")
    return [TensorType(indices.shape, data.dtype)]


def _gather_elements(data, indices, axis=0, **_):
    axis = normalize_axis(axis, data.ndim, "GatherElements axis")
    return np.take_along_axis(data, _in_range(indices, data.shape[axis], "GatherElements"), axis=axis)


_register("GatherElements", _infer_gather_elements, _gather_elements)


def _infer_gather_nd(types, batch_dims=0, **_):
    data, indices = types
    depth = indices.shape[-1] if indices.shape else 0
    if indices.dtype != "int64" or not 0 <= batch_dims < len(indices.shape):
        raise ShapeError(f"GatherND takes int64 indices of rank above batch_dims={batch_dims}, got {indices}")
    if not 1 <= depth <= len(data.shape) - batch_dims or data.shape[:batch_dims] != indices.shape[:batch_dims]:
        raise ShapeError(
            f"GatherND indices of shape {list(indices.shape)} do not index data of shape {list(data.shape)} "
            f"with batch_dims={batch_dims}"
        )
    return [TensorType(indices.shape[:-1] + data.shape[batch_dims + depth :], data.dtype)]


def _gather_nd(data, indices, batch_dims=0, **_):
    depth = indices.shape[-1]
    batch = data.shape[:batch_dims]
    rows = []
    for position in np.ndindex(*batch):
        block, chosen = data[position], indices[position]
        columns = [_in_range(chosen[..., axis], block.shape[axis], "GatherND") for axis in range(depth)]
        rows.append(block[tuple(columns)])
    shape = indices.shape[:-1] + data.shape[batch_dims + depth :]
    return np.stack(rows).reshape(shape) if rows else np.zeros(shape, data.dtype)


_register("GatherND", _infer_gather_nd, _gather_nd)


def _scatter_nd_parts(data_shape, indices_shape, updates_shape, reduction="none"):
    if reduction != "none":
        raise UnsupportedOpError(f"ScatterND with reduction={reduction!r} is not supported", {"ScatterND": []})
    depth = indices_shape[-1] if indices_shape else 0
    if not 1 <= depth <= len(data_shape) or tuple(updates_shape) != (*indices_shape[:-1], *data_shape[depth:]):
        raise ShapeError(
            f"ScatterND indices of shape {list(indices_shape)} and updates of shape {list(updates_shape)} do not "
            f"address data of shape {list(data_shape)}"
        )
    return depth


def _infer_scatter_nd(types, reduction="none", **_):
    data, indices, updates = types
    if indices.dtype != "int64" or updates.dtype != data.dtype:
        raise ShapeError(f"ScatterND takes int64 indices and updates of the data's dtype, got {indices}, {updates}")
    _scatter_nd_parts(data.shape, indices.shape, updates.shape, reduction)
    return [TensorType(data.shape, data.dtype)]


def _scatter_nd(data, indices, updates, reduction="none", **_):
    depth = _scatter_nd_parts(data.shape, indices.shape, updates.shape, reduction)
    columns = [_in_range(indices[..., axis], data.shape[axis], "ScatterND") for axis in range(depth)]
    result = data.copy()
    # in update order, so where two updates address one element the later one stays (the compute does the same)
    for row in np.ndindex(*indices.shape[:-1]):
        result[tuple(int(column[row]) for column in columns)] = updates[row]
    return result


register_op(
    "ScatterND",
    infer=lambda types, attrs: _infer_scatter_nd(types, **attrs),
    pattern=Pattern.REDUCE,
    reference=_scatter_nd,
)


SCATTER_REDUCTIONS = ("none", "add", "max", "min")


def scatter_elements_axis(data_shape, indices_shape, updates_shape, axis=0, reduction="none") -> int:
    """ScatterElements' axis, normalised, after checking its reduction and that the indices and updates (one shape,
    the data's rank, no longer than the data off the axis) address the data."""
    if reduction not in SCATTER_REDUCTIONS:
        raise UnsupportedOpError(
            f"ScatterElements with reduction={reduction!r} is not supported; Tessel has {', '.join(SCATTER_REDUCTIONS)}",
            {"ScatterElements": []},
        )
    axis = normalize_axis(axis, len(data_shape), "ScatterElements axis")
    fits = all(extent <= data_shape[position] for position, extent in enumerate(indices_shape) if position != axis)
    if tuple(indices_shape) != tuple(updates_shape) or len(indices_shape) != len(data_shape) or not fits:
        raise ShapeError(
            f"ScatterElements indices of shape {list(indices_shape)} and updates of shape {list(updates_shape)} do "
            f"not address data of shape {list(data_shape)} along axis {axis}"
        )
    return axis


def _infer_scatter_elements(types, axis=0, reduction="none", **_):
    data, indices, updates = types
    if indices.dtype not in ("int32", "int64") or updates.dtype != data.dtype:
        raise ShapeError(
            f"ScatterElements takes int32 or int64 indices and updates of the data's dtype, got {indices}, {updates}"
        )
    scatter_elements_axis(data.shape, indices.shape, updates.shape, axis, reduction)
    return [TensorType(data.shape, data.dtype)]


def _scatter_elements(data, indices, updates, axis=0, reduction="none", **_):
    """Each update written at its own position with the axis's coordinate replaced by its index: where several name
    one element, the last in row-major order stays (reduction none), or all are combined with the data's."""
    axis = scatter_elements_axis(data.shape, indices.shape, updates.shape, axis, reduction)
    target = list(np.indices(indices.shape, sparse=True))
    target[axis] = _in_range(indices, data.shape[axis], "ScatterElements")
    result = data.copy()
    if reduction == "none":
        # numpy's assignment through repeated indices keeps the last value, as the compute does
        result[tuple(target)] = updates
    else:
        {"add": np.add, "max": np.maximum, "min": np.minimum}[reduction].at(result, tuple(target), updates)
    return result


register_op(
    "ScatterElements",
    infer=lambda types, attrs: _infer_scatter_elements(types, **attrs),
    pattern=Pattern.REDUCE,
    reference=_scatter_elements,
)


def one_hot_depth(depth) -> int:
    """OneHot's depth input (a scalar or one element, of any numeric type) as a count of classes."""
    values = np.asarray(depth).reshape(-1)
    if values.size != 1 or not np.isfinite(values[0]) or values[0] < 1:
        raise ShapeError(f"OneHot depth must be one number of at least 1, got {values.tolist()}")
    return int(values[0])


def _infer_one_hot(types, depth=None, axis=-1, **_):
    indices, values = types
    if values.shape not in ((2,), (1, 2)) and int(np.prod(values.shape)) != 2:
        raise ShapeError(f"OneHot values must hold two elements (off, on), got shape {list(values.shape)}")
    axis = normalize_axis(axis, len(indices.shape) + 1, "OneHot axis")
    shape = list(indices.shape)
    shape.insert(axis, one_hot_depth(depth))
    return [TensorType(tuple(shape), values.dtype)]


def _one_hot(indices, values, depth=None, axis=-1, **_):
    count = one_hot_depth(depth)
    axis = normalize_axis(axis, indices.ndim + 1, "OneHot axis")
    positions = indices.astype(np.int64)
    positions = np.where(positions < 0, positions + count, positions)
    classes = np.arange(count).reshape([count if dim == axis else 1 for dim in range(indices.ndim + 1)])
    off, on = values.reshape(-1)
    # an index outside [-depth, depth) matches no class: its row is all off, as ONNX and onnxruntime have it
    return np.where(np.expand_dims(positions, axis) == classes, on, off).astype(values.dtype)


_register("OneHot", _infer_one_hot, _one_hot, const_inputs=((1, "depth"),))


# -- Expand, Tile ------------------------------------------------------------------------------


def _expand_shape(input_shape, shape=None, **_):
    return broadcast_shapes(input_shape, _ints(shape, "Expand shape"))


_register_same_dtype(
    "Expand",
    _expand_shape,
    lambda x, **attrs: np.broadcast_to(x, _expand_shape(x.shape, **attrs)).copy(),
    const_inputs=((1, "shape"),),
)


def _repeats(rank, repeats=None, **_):
    repeats = _ints(repeats, "Tile repeats")
    if len(repeats) != rank or any(count < 0 for count in repeats):
        raise ShapeError(f"Tile repeats {list(repeats)} must give a non-negative count for each of {rank} axes")
    return repeats


_register_same_dtype(
    "Tile",
    lambda shape, **attrs: tuple(dim * count for dim, count in zip(shape, _repeats(len(shape), **attrs))),
    lambda x, **attrs: np.tile(x, _repeats(x.ndim, **attrs)),
    const_inputs=((1, "repeats"),),
)


# -- DepthToSpace, SpaceToDepth ------------------------------------------------------------------


def _depth_to_space_shape(shape, blocksize=None, mode="DCR", **_):
    if len(shape) != 4 or blocksize is None or shape[1] % (blocksize * blocksize):
        raise ShapeError(f"DepthToSpace needs an NCHW input with channels divisible by blocksize², got {list(shape)}")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError(f"DepthToSpace mode {mode!r} is not supported; use 'DCR' or 'CRD'")
    batch, channels, height, width = shape
    return (batch, channels // blocksize**2, height * blocksize, width * blocksize)


def _depth_to_space(x, blocksize, mode="DCR", **_):
    batch, channels, height, width = _depth_to_space_shape(x.shape, blocksize, mode)
    if mode == "DCR":
        blocks = x.reshape(batch, blocksize, blocksize, channels, x.shape[2], x.shape[3]).transpose(0, 3, 4, 1, 5, 2)
    else:
        blocks = x.reshape(batch, channels, blocksize, blocksize, x.shape[2], x.shape[3]).transpose(0, 1, 4, 2, 5, 3)
    return blocks.reshape(batch, channels, height, width)


_register_same_dtype("DepthToSpace", _depth_to_space_shape, _depth_to_space)


def _space_to_depth_shape(shape, blocksize=None, mode="DCR", **_):
    if len(shape) != 4 or blocksize is None or shape[2] % blocksize or shape[3] % blocksize:
        raise ShapeError(f"SpaceToDepth needs an NCHW input with H and W divisible by blocksize, got {list(shape)}")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError(f"SpaceToDepth mode {mode!r} is not supported; use 'DCR' or 'CRD'")
    batch, channels, height, width = shape
    return (batch, channels * blocksize**2, height // blocksize, width // blocksize)


def _space_to_depth(x, blocksize, mode="DCR", **_):
    shape = _space_to_depth_shape(x.shape, blocksize, mode)
    batch, channels, height, width = x.shape
    blocks = x.reshape(batch, channels, height // blocksize, blocksize, width // blocksize, blocksize)
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return blocks.transpose(order).reshape(shape)


_register_same_dtype("SpaceToDepth", _space_to_depth_shape, _space_to_depth)


# -- Shape, Size, ConstantOfShape, Range ---------------------------------------------------------


def shape_range(rank, start=0, end=None, **_) -> slice:
    end = rank if end is None else end
    start, end = (min(max(bound + rank if bound < 0 else bound, 0), rank) for bound in (start, end))
    return slice(start, max(start, end))


_register(
    "Shape",
    lambda types, **attrs: [TensorType((len(types[0].shape[shape_range(len(types[0].shape), **attrs)]),), "int64")],
    lambda x, **attrs: np.array(x.shape[shape_range(x.ndim, **attrs)], dtype=np.int64),
)


def _size_values(values, shape):
    if any(isinstance(value, Sym) for value in values):
        raise SymbolicSizeError(f"the sizes {list(values)} are known only when the model runs; give their values")
    return np.array(values, dtype=np.int64).reshape(shape)


# Sizes a run is given, as an int64 tensor: shape arithmetic over symbolic sizes that a node reads at run time (the
# frontend makes these; its kernel computes each element from the sizes)
_register("SizeValues", lambda types, values, shape: [TensorType(shape, "int64")], _size_values)
_register(
    "Size",
    lambda types, **_: [TensorType((), "int64")],
    lambda x, **_: np.array(x.size, dtype=np.int64),
)


def fill_value(value=None) -> np.ndarray:
    if value is None:
        return np.zeros((), np.float32)
    value = np.asarray(value)
    if value.size != 1 or str(value.dtype) not in DTYPES:
        raise UnsupportedOpError(f"ConstantOfShape value must be one element of a dtype in {', '.join(DTYPES)}")
    return value.reshape(())


def _constant_shape(input=None, **_):
    shape = _ints(input, "ConstantOfShape input") if input is not None and np.size(input) else ()
    if any(dim < 0 for dim in shape):
        raise ShapeError(f"ConstantOfShape shape {list(shape)} has a negative dimension")
    return shape


_register(
    "ConstantOfShape",
    lambda types, value=None, **attrs: [TensorType(_constant_shape(**attrs), str(fill_value(value).dtype))],
    lambda value=None, **attrs: np.full(_constant_shape(**attrs), fill_value(value)),
    const_inputs=((0, "input"),),
)


def constant_array(**attrs) -> np.ndarray:
    """The tensor a Constant node holds, from whichever of its value attributes is set."""
    for name, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64)):
        if name in attrs:
            return np.array(attrs[name], dtype=dtype)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64)
    if "value" in attrs or "sparse_value" in attrs:
        return np.asarray(attrs.get("value", attrs.get("sparse_value")))
    if "value_string" in attrs or "value_strings" in attrs:
        raise UnsupportedOpError("Constant holds strings, which Tessel does not support; remove it from the model")
    raise ModelError("Constant has no value attribute; export the model again")


def _type_of(array: np.ndarray) -> TensorType:
    return TensorType(array.shape, str(array.dtype))


# Constant takes no inputs, so constant folding always turns it into a param before kernels are made.
_register(
    "Constant",
    lambda types, **attrs: [_type_of(constant_array(**attrs))],
    lambda **attrs: constant_array(**attrs),
)


def _range_dtype(*bounds) -> np.dtype:
    """The dtype of Range's bounds: numpy scalars keep theirs; plain Python numbers (how the frontend
    hands over 0-d constants) read as int64 or float32, the dtypes exporters emit for Range."""
    for bound in bounds:
        if isinstance(bound, np.generic | np.ndarray) and np.asarray(bound).dtype != object:
            return np.asarray(bound).dtype
    return np.dtype(np.float32 if any(isinstance(bound, float) for bound in bounds) else np.int64)


def _range_length(start, limit, delta):
    if delta == 0:
        raise ShapeError("Range delta is 0; use a non-zero step")
    if any(isinstance(bound, Sym) for bound in (start, limit, delta)):
        # a symbolic bound: the length is a polynomial in the sizes when the step is 1 or -1
        if isinstance(delta, Sym) or int(delta) not in (1, -1):
            raise SymbolicSizeError(f"a Range from {start} to {limit} by {delta} has no whole-polynomial length")
        return max((limit - start) * int(delta), 0)
    return max(int(np.ceil((limit - start) / delta)), 0)


def _infer_range(types, start=None, limit=None, delta=None, **_):
    dtype = str(_range_dtype(start, limit, delta))
    return [TensorType((_range_length(start, limit, delta),), dtype)]


def _range(start=None, limit=None, delta=None, **_):
    dtype = _range_dtype(start, limit, delta)
    start, delta = np.asarray(start).astype(dtype), np.asarray(delta).astype(dtype)
    # ONNX defines element i as start + i * delta, computed in the output dtype
    return (start + np.arange(_range_length(start, limit, delta)).astype(dtype) * delta).astype(dtype)


_register("Range", _infer_range, _range, const_inputs=((0, "start"), (1, "limit"), (2, "delta")))


def _trilu_shape(shape, **_):
    if len(shape) < 2:
        raise ShapeError(f"Trilu needs a tensor of rank 2 or more, got shape {list(shape)}")
    return shape


def _trilu(x, k=0, upper=1, **_):
    # numpy's triu/tril keep the triangle of the last two axes, as ONNX's Trilu does
    return np.triu(x, int(k)) if upper else np.tril(x, int(k))


_register_same_dtype("Trilu", _trilu_shape, _trilu, const_inputs=((1, "k"),))
