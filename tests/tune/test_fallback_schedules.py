"""Without tuning records every template builds its fallback config, and the fallback is what the templates built
before they declared spaces: the loop IR of every model the zoo had then, per vector width, against digests recorded
from the code before the conversion (commit 5eab84c, DEFAULTS and VECTOR_DEFAULTS read as plain knob values). The
models added after it have no such "before" to compare with."""

import hashlib
import json

import pytest

from compiler import zoo
from compiler.compute import group_to_te
from compiler.frontend.onnx import load_onnx
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import schedule_group
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tir.printer import format_func

# sha256 of the loop IR below, by (model, the target's vector width in bytes): the loop IR depends on the target
# through its vector width alone (AArch64's equals wasm's). mobilenet_v2, resnet18 and digits re-recorded with the
# layout rules (the image's conversion read by the first conv, global pools blocked, digits' convs linked through
# its pool, conversions back to NCHW in their own loop order, its softmax rows in whole vectors and a tail);
# mobilenet_v2, resnet18 and digits on AVX-512 again for its blocked convs' 2 x 8 tile with the kernel window
# inside the input channels, and digits on AVX2 for its 4 x 4 conv taking more filter blocks (a row shorter than the
# column tile does while they fit the registers); mobilenet_v2, resnet18 and digits in wasm for the kernel window
# inside the input channels, and again for blocks sized for V8's registers (blocked convs 2 x 7, 1 x 1 convs 1 x 4
# with a shorter last tile, dense 4 x 8); digits in wasm again for its softmax's max and sum over 10 classes in
# vectors of 4 partials (row reductions, two vectors or more); mobilenet_v2, resnet18 and digits on AVX2 for its
# blocked convs' 2 x 6 tile with the columns unrolled outside the blocks; resnet18 on every width for its strided
# 1 x 1 convs reading their input in place (no cropped copy of it); mobilenet_v2 and resnet18 natively (64 and 32
# bytes) and digits on AVX2 for the blocked convs' prefetch of their next filter tile (the same digests as before
# with `prefetch` 0); mobilenet_v2, resnet18 and digits natively for the dense blocked convs reading their padding in
# place (the same digests as before with `padding` "copy"); mobilenet_v2 and resnet18 natively for the prefetch no
# longer naming lines past the next filter tile; mobilenet_v2, resnet18 and digits on AVX2 for its dense convs
# copying their padding again (digits' digest is the one before in-place padding); resnet18 and digits on AVX2 for
# the taps inside the input channels on short rows (`small_row_taps`; the same digests as before with it None)
DIGESTS = {
    ("mlp", 64): "545a58f46f0df20cc1acf7ee12f63bfcff479f1337e19a0086a3023bec6b565e",
    ("mobilenet_v2", 64): "e23d2832e061dd79ed7068360f1d2e0cd180ef0f8f8bfde26d4ac0bc243b0fe5",
    ("resnet18", 64): "fe32fc0170586c8def6c27d0deafb938bfe5609f7eaac8e21d4ee280b9fd7509",
    ("dwconv_block", 64): "38f62251fb572635e6c91b8d560be1ff4409fd31cf541ec704a647a3a767588f",
    ("digits", 64): "a6e350bd072fdca5aa054eedadeeb4f259260496f418dce092549ff2fb712525",
    ("mlp", 32): "485adc074e3efe8118d9816c84fbe30d16282113371e709ef63a4315aca26b6a",
    ("mobilenet_v2", 32): "b784c0c924e123c201e6039b774895120c910c204bf8366847c078368a03e7a5",
    ("resnet18", 32): "2ac34f1bfec479a54d90d535a760a8830c6c5b55f888e1051ffa8b0e7927f85a",
    ("dwconv_block", 32): "b219d6ee844ffe41c419cd2d8d1a4a3bca5744d6bde7824302ac6ec22bc205d0",
    ("digits", 32): "dc05215efac43377a7775ec9623585d2787ae98db43fff9d02c2ed09ebe32ab4",
    ("mlp", 16): "47b4121be258f5cec3c2e524406581e03610ff2cc6b22392c10c7b6dc732b4ea",
    ("mobilenet_v2", 16): "ee65c29943dc547a24507a2690f06124472bb77f9e4ba3c13591a92d774e3371",
    ("resnet18", 16): "c65ba2ab17a98d23e67306cf8d93bb7d21860b69b435fb64f49b821508fb9e6c",
    ("dwconv_block", 16): "3aefc186db198e6cdabb069cff33f7cd041994b69162b9e08b09a48a39f13cdc",
    ("digits", 16): "16648595ac7bcabb935ba9662725d581319d7a403a70aa727a8d270bebe24881",
}
TARGETS = ["llvm", "llvm -mattr=-avx512f", "wasm"]
DIGESTED = sorted({name for name, _ in DIGESTS})


def loop_ir(name: str, target: Target, config=None) -> str:
    """Every group's kernel as loop IR, in graph order; `config(cfg)` gives the knob values of a group whose
    template declared `cfg`, or None for the fallback."""
    texts = []
    for node in optimize(load_onnx(zoo.build_model(name)), target=Target.parse(target)).nodes:
        group = group_to_te(node)
        space = ConfigSpace()
        schedule = schedule_group(group, Target.parse(target), space)
        if config is not None:
            schedule = schedule_group(group, Target.parse(target), ConfigSpace(config(space)))
        texts.append(format_func(lower(schedule, [*group.inputs, *group.outputs], "kernel")))
    return "\n\n".join(texts)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", DIGESTED)
def test_fallback_builds_what_the_defaults_built(name, target):
    target = Target.parse(target)
    key = (name, target.vector_bytes)
    digest = hashlib.sha256(loop_ir(name, target).encode()).hexdigest()
    assert digest == DIGESTS[key], (
        f"{name} for {target} no longer builds the loop IR its fallback schedules built ({digest}); if a template's "
        "fallback changed on purpose, record the new digest here"
    )


@pytest.mark.parametrize("name", ["mobilenet_v2", "mlp"])
def test_a_record_of_the_fallback_builds_the_fallback(name):
    """Every group's fallback config, written as a record (JSON) and read back, builds the same kernels."""
    target = Target.parse("wasm")
    as_record = lambda space: json.loads(json.dumps(space.fallback.to_json()))  # noqa: E731
    assert loop_ir(name, target, as_record) == loop_ir(name, target)


@pytest.mark.parametrize("target", TARGETS)
def test_every_zoo_fallback_fits_the_register_filters(target):
    """The measured defaults hold register tiles that fit: a tuner searching the filtered space can reach them."""
    target = Target.parse(target)
    for name in zoo.MODELS:
        for node in optimize(load_onnx(zoo.build_model(name)), target=target).nodes:
            space = ConfigSpace()
            schedule_group(group_to_te(node), target, space)
            assert space.fallback.valid, (name, node.name, space.template, space.fallback.to_json())
