"""Resize and Upsample: the modes, coordinate transforms and nearest rounding of ONNX's Resize, planned once
per op (resize_plan) for the shape rule, the numpy reference and the compute."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import ShapeError
from compiler.graph.ir import TensorType
from compiler.graph.ops.checks import op_inputs
from compiler.graph.ops.common import normalize_axis
from compiler.graph.registry import Pattern, register_op

RESIZE_MODES = ("nearest", "linear", "cubic")


COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)


NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class ResizePlan:
    """Per axis of the input: the output size, the scale that maps output coordinates back to the input, and the
    region of interest (start, end) that tf_crop_and_resize crops, as fractions of the axis."""

    output: tuple[int, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[float, float], ...] | None


def _given(value) -> tuple | None:
    """A const input as a tuple, or None when it is absent or empty (ONNX's way to leave one out)."""
    if value is None:
        return None
    values = tuple(np.asarray(value).reshape(-1).tolist())
    return values or None


ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def attr_string(attrs: dict[str, Any], name: str, default: str, allowed: tuple[str, ...], op: str = "Resize") -> str:
    value = attrs.get(name, default)
    value = value.decode() if isinstance(value, bytes) else str(value)
    if value not in allowed:
        raise ShapeError(f"{op} {name}={value!r} is not supported; use one of {', '.join(allowed)}")
    return value


def resize_plan(shape: tuple[int, ...], attrs: dict[str, Any]) -> ResizePlan:
    rank = len(shape)
    axes = attrs.get("axes")
    axes = tuple(range(rank)) if axes is None or len(axes) == 0 else tuple(normalize_axis(a, rank) for a in axes)
    scales, sizes, roi = _given(attrs.get("scales")), _given(attrs.get("sizes")), _given(attrs.get("roi"))
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize needs exactly one of scales and sizes, given as constant inputs")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ShapeError(
            f"Resize {'scales' if scales else 'sizes'} {list(given)} needs {len(axes)} values, one per axis"
        )
    if sizes is not None:
        output = list(shape)
        for axis, size in zip(axes, sizes):
            output[axis] = int(size)
        factors = [output[a] / shape[a] if shape[a] else 1.0 for a in range(rank)]
        policy = attr_string(attrs, "keep_aspect_ratio_policy", "stretch", ASPECT_POLICIES)
        if policy != "stretch":
            chosen = (min if policy == "not_larger" else max)(factors[a] for a in axes)
            factors = [chosen if a in axes else 1.0 for a in range(rank)]
            output = [int(chosen * shape[a] + 0.5) if a in axes else shape[a] for a in range(rank)]
    else:
        factors = [1.0] * rank
        for axis, scale in zip(axes, scales):
            if scale <= 0:
                raise ShapeError(f"Resize scales {list(scales)} must be positive")
            factors[axis] = float(scale)
        output = [int(factor * size) for factor, size in zip(factors, shape)]
    regions = None
    if roi is not None:
        if len(roi) != 2 * len(axes):
            raise ShapeError(f"Resize roi {list(roi)} needs {2 * len(axes)} values (all starts, then all ends)")
        starts, ends = [0.0] * rank, [1.0] * rank
        for index, axis in enumerate(axes):
            starts[axis], ends[axis] = float(roi[index]), float(roi[len(axes) + index])
        regions = tuple(zip(starts, ends))
    return ResizePlan(tuple(output), tuple(factors), regions)


def _infer_resize(types, attrs):
    (x,) = op_inputs("Resize", types, 1, 1)
    attr_string(attrs, "mode", "nearest", RESIZE_MODES)
    attr_string(attrs, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    attr_string(attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    return [TensorType(resize_plan(x.shape, attrs).output, x.dtype)]


def _source_positions(
    mode: str, size: int, output: int, scale: float, region: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each output index's coordinate in the input (float64), and for tf_crop_and_resize which fall outside it.
    Like ONNX, the modes that special-case a length-1 output compare the unrounded length scale * size."""
    target = np.arange(output, dtype=np.float64)
    length = scale * size
    if mode == "align_corners":
        return (np.zeros(output) if length == 1 else target * (size - 1) / (length - 1)), None
    if mode == "asymmetric":
        return target / scale, None
    if mode == "pytorch_half_pixel":
        return (np.full(output, -0.5) if length == 1 else (target + 0.5) / scale - 0.5), None
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - output / length)
        return offset + (target + 0.5) / scale - 0.5, None
    if mode == "tf_crop_and_resize":
        start, end = region or (0.0, 1.0)
        if length == 1:
            positions = np.full(output, (end - start) * (size - 1) / 2)
        else:
            positions = target * (end - start) * (size - 1) / (length - 1)
        positions = positions + start * (size - 1)
        return positions, (positions < 0) | (positions > size - 1)
    return (target + 0.5) / scale - 0.5, None


def _nearest_indices(positions: np.ndarray, rounding: str, size: int) -> np.ndarray:
    below = np.floor(positions)
    fraction = positions - below
    if rounding == "round_prefer_floor":
        chosen = below + (fraction > 0.5)
    elif rounding == "round_prefer_ceil":
        chosen = below + (fraction >= 0.5)
    elif rounding == "floor":
        chosen = below
    else:
        chosen = np.ceil(positions)
    return np.clip(chosen, 0, size - 1).astype(np.intp)


def _cubic_kernel(distance: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _interpolation_taps(
    positions: np.ndarray, size: int, scale: float, mode: str, attrs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """The input indices (clamped to the axis) and weights that make each output of linear/cubic interpolation.
    With antialias a downscale stretches the kernel by 1/scale so every input pixel contributes."""
    support = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if int(attrs.get("antialias", 0)) else 1.0
    first = math.floor(-support / stretch) + 1
    taps = np.floor(positions).astype(np.int64)[:, None] + np.arange(first, 2 - first)[None, :]
    distances = (taps - positions[:, None]) * stretch
    if mode == "linear":
        weights = np.clip(1 - np.abs(distances), 0, 1)
    else:
        weights = _cubic_kernel(distances, float(attrs.get("cubic_coeff_a", -0.75)))
    if stretch != 1.0:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if int(attrs.get("exclude_outside", 0)):
        weights = np.where((taps < 0) | (taps >= size), 0.0, weights)
        totals = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(totals == 0, 1.0, totals)
    return np.clip(taps, 0, size - 1).astype(np.intp), weights


def _resize(x, *_, **attrs):
    plan = resize_plan(x.shape, attrs)
    mode = attr_string(attrs, "mode", "nearest", RESIZE_MODES)
    coordinates = attr_string(attrs, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    rounding = attr_string(attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    extrapolation = float(attrs.get("extrapolation_value", 0.0))
    result = x if mode == "nearest" else x.astype(np.float64)
    for axis, (size, output, scale) in enumerate(zip(x.shape, plan.output, plan.scales)):
        region = plan.roi[axis] if plan.roi else None
        unchanged_region = region is None or (math.isclose(region[0], 0.0) and math.isclose(region[1], 1.0))
        if output == size and math.isclose(scale, 1.0) and unchanged_region:
            continue
        positions, outside = _source_positions(coordinates, size, output, scale, region)
        if mode == "nearest":
            result = np.take(result, _nearest_indices(positions, rounding, size), axis=axis)
        else:
            taps, weights = _interpolation_taps(positions, size, scale, mode, attrs)
            gathered = np.take(result, taps, axis=axis)
            result = (gathered * weights.reshape(weights.shape + (1,) * (x.ndim - axis - 1))).sum(axis=axis + 1)
        if outside is not None and outside.any():
            mask = outside.reshape(outside.shape + (1,) * (x.ndim - axis - 1))
            result = np.where(mask, np.asarray(extrapolation, result.dtype), result)
    if result.dtype == x.dtype:
        return np.ascontiguousarray(result)
    if x.dtype.kind in "iu":
        limits = np.iinfo(x.dtype)
        result = np.clip(np.round(result), limits.min, limits.max)
    return result.astype(x.dtype)


register_op(
    "Resize",
    infer=_infer_resize,
    pattern=Pattern.INJECTIVE,
    reference=_resize,
    const_inputs=((1, "roi"), (2, "scales"), (3, "sizes")),
)


def upsample_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Upsample (opset 7-9) is Resize with asymmetric coordinates, nearest rounding down, and scales only."""
    mode = attr_string(attrs, "mode", "nearest", ("nearest", "linear", "bilinear"), "Upsample")
    return {
        "scales": attrs.get("scales"),
        "mode": "linear" if mode == "bilinear" else mode,
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    }


def _infer_upsample(types, attrs):
    if _given(attrs.get("scales")) is None:
        raise ShapeError("Upsample needs its scales, as a constant input or attribute")
    return _infer_resize(types[:1], upsample_attrs(attrs))


def _upsample(x, *_, **attrs):
    return _resize(x, **upsample_attrs(attrs))


register_op(
    "Upsample", infer=_infer_upsample, pattern=Pattern.INJECTIVE, reference=_upsample, const_inputs=((1, "scales"),)
)
