"""Tensor-expression computes of Resize and Upsample (graph/ops/resize.py): nearest, linear and cubic taps,
positions computed in integers where the scale allows."""

from __future__ import annotations

import math
from typing import Any

import compiler.te as te
from compiler.compute import tags
from compiler.compute.support import Inputs, clamp, unsupported
from compiler.graph.ir import TensorType
from compiler.graph.ops.resize import (
    COORDINATE_MODES,
    NEAREST_MODES,
    RESIZE_MODES,
    attr_string,
    resize_plan,
    upsample_attrs,
)
from compiler.graph.registry import set_compute


def _position(mode: str, target, size: int, output: int, scale: float, region):
    """The input coordinate (float64) of output index `target` along one axis, as the reference's
    _source_positions computes it."""
    t = target.astype("float64")
    length = scale * size
    if mode == "align_corners":
        return te.const(0.0, "float64") if length == 1 else t * ((size - 1) / (length - 1))
    if mode == "asymmetric":
        return t / scale
    if mode == "pytorch_half_pixel":
        return te.const(-0.5, "float64") if length == 1 else (t + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - output / length)
        return (t + 0.5) / scale - 0.5 + offset
    if mode == "tf_crop_and_resize":
        start, end = region or (0.0, 1.0)
        if length == 1:
            return te.const((end - start) * (size - 1) / 2 + start * (size - 1), "float64")
        return t * ((end - start) * (size - 1) / (length - 1)) + start * (size - 1)
    return (t + 0.5) / scale - 0.5


def _nearest(position, rounding: str, size: int):
    below = te.floor(position)
    fraction = position - below
    if rounding == "round_prefer_floor":
        chosen = te.select(fraction > 0.5, below + 1.0, below)
    elif rounding == "round_prefer_ceil":
        chosen = te.select(fraction >= 0.5, below + 1.0, below)
    elif rounding == "floor":
        chosen = below
    else:
        chosen = te.ceil(position)
    return clamp(chosen.astype("int32"), 0, size - 1)


def _integer_position(mode: str, target, size: int, output: int, scale: float, region):
    """The input coordinate of output index `target` as (below, numerator, denominator), position = below +
    numerator / denominator with 0 <= numerator < denominator, in int32 arithmetic: for an integer upscale
    (output = size * k) under asymmetric or half-pixel coordinates, where it is exact; else None. Integer index math
    vectorizes where _position's float64 floor per lane does not."""
    factor = round(scale)
    unchanged = region is None or (math.isclose(region[0], 0.0) and math.isclose(region[1], 1.0))
    if factor < 1 or not math.isclose(scale, factor) or output != size * factor or not unchanged:
        return None
    if mode == "asymmetric":
        return target // factor, target % factor, factor
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and output > 1):
        # (t + 0.5) / k - 0.5 = (2t + 1 - k) / 2k
        shifted = target * 2 + (1 - factor)
        return shifted // (2 * factor), shifted % (2 * factor), 2 * factor
    return None


def _integer_nearest(below, numerator, denominator: int, rounding: str, size: int):
    if rounding == "round_prefer_floor":
        below = te.select(numerator * 2 > denominator, below + 1, below)
    elif rounding == "round_prefer_ceil":
        below = te.select(numerator * 2 >= denominator, below + 1, below)
    elif rounding == "ceil":
        below = te.select(numerator > 0, below + 1, below)
    return clamp(below, 0, size - 1)


def _resize_with(x: te.Tensor, attrs: dict[str, Any], shape) -> te.Tensor:
    plan = resize_plan(tuple(x.shape), attrs)
    mode = attr_string(attrs, "mode", "nearest", RESIZE_MODES)
    coordinates = attr_string(attrs, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    rounding = attr_string(attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    if int(attrs.get("antialias", 0)) and mode != "nearest" and any(s < 1 for s in plan.scales):
        raise unsupported("Resize", "with antialias=1 when downscaling")
    if mode != "nearest" and not x.dtype.startswith("float"):
        raise unsupported("Resize", f"in {mode} mode on {x.dtype}")
    cubic_a = float(attrs.get("cubic_coeff_a", -0.75))
    exclude_outside = bool(int(attrs.get("exclude_outside", 0)))
    extrapolation = float(attrs.get("extrapolation_value", 0.0))
    resized = []
    for axis, (size, output, scale) in enumerate(zip(x.shape, plan.output, plan.scales)):
        region = plan.roi[axis] if plan.roi else None
        unchanged = region is None or (math.isclose(region[0], 0.0) and math.isclose(region[1], 1.0))
        if not (output == size and math.isclose(scale, 1.0) and unchanged):
            resized.append((axis, size, output, scale, region))
    # linear weights of integer upscales are multiples of 1 / 2k: a float32 input blends in float32, as onnxruntime
    # does (float64 lanes made the 2x bilinear upsampling of unet_small twice the work); other positions keep float64
    exact = mode == "linear" and all(
        _integer_position(coordinates, 0, size, output, scale, region) is not None
        for _, size, output, scale, region in resized
    )
    blend = x.dtype if exact and x.dtype == "float32" else "float64"

    def body(*index):
        outside = []
        per_axis = {}
        for axis, size, output, scale, region in resized:
            exact = (
                None if mode == "cubic" else _integer_position(coordinates, index[axis], size, output, scale, region)
            )
            if exact is not None:
                below, numerator, denominator = exact
                if mode == "nearest":
                    per_axis[axis] = [(_integer_nearest(below, numerator, denominator, rounding, size), None)]
                else:
                    fraction = numerator.astype(blend) / float(denominator)
                    per_axis[axis] = [
                        (clamp(below, 0, size - 1), 1.0 - fraction),
                        (clamp(below + 1, 0, size - 1), fraction),
                    ]
                continue
            position = _position(coordinates, index[axis], size, output, scale, region)
            if coordinates == "tf_crop_and_resize":
                outside += [position < 0.0, position > float(size - 1)]
            if mode == "nearest":
                per_axis[axis] = [(_nearest(position, rounding, size), None)]
            elif mode == "linear":
                below = te.floor(position)
                fraction = position - below
                first = below.astype("int32")
                per_axis[axis] = [
                    (clamp(first, 0, size - 1), 1.0 - fraction),
                    (clamp(first + 1, 0, size - 1), fraction),
                ]
            else:
                per_axis[axis] = _cubic_taps(position, size, cubic_a, exclude_outside)
        terms = [([], None)]
        for axis, choices in per_axis.items():
            terms = [
                (
                    indices + [(axis, index_expr)],
                    weight if factor is None else factor if weight is None else weight * factor,
                )
                for indices, weight in terms
                for index_expr, factor in choices
            ]
        value = None
        for indices, weight in terms:
            source = list(index)
            for axis, index_expr in indices:
                source[axis] = index_expr
            load = x[tuple(source)]
            term = load if weight is None else load.astype(blend) * weight
            value = term if value is None else value + term
        value = value.astype(x.dtype)
        if outside:
            value = te.select(te.any(*outside), te.const(extrapolation, x.dtype), value)
        return value

    return te.compute(shape, body, name="resize", tag=tags.INJECTIVE)


def _cubic_taps(position, size: int, a: float, exclude_outside: bool) -> list:
    """(input index, weight) of the 4 taps of cubic interpolation at `position` on an axis of `size`: the
    Keys kernel with coefficient a at distances 1 + t, t, 1 - t, 2 - t (t the fractional part), indices clamped
    to the axis (edge pixels repeat), or with exclude_outside the taps past the edges weighted 0 and the rest
    renormalized, as ONNX's reference does."""
    below = te.floor(position)
    fraction = position - below
    first = below.astype("int32")
    taps = []
    for offset, distance in ((-1, fraction + 1.0), (0, fraction), (1, 1.0 - fraction), (2, 2.0 - fraction)):
        if offset in (0, 1):
            weight = ((a + 2) * distance - (a + 3)) * distance * distance + 1.0
        else:
            weight = ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a
        taps.append((first + offset, weight))
    if exclude_outside:
        taps = [(tap, te.select(te.all(tap >= 0, tap < size), weight, 0.0)) for tap, weight in taps]
        total = taps[0][1] + taps[1][1] + taps[2][1] + taps[3][1]
        total = te.select(te.equal(total, 0.0), 1.0, total)
        taps = [(tap, weight / total) for tap, weight in taps]
    return [(clamp(tap, 0, size - 1), weight) for tap, weight in taps]


def resize(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    return [_resize_with(inputs[0], attrs, output_types[0].shape)]


def upsample(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    return [_resize_with(inputs[0], upsample_attrs(attrs), output_types[0].shape)]


set_compute("Resize", resize)
set_compute("Upsample", upsample)
