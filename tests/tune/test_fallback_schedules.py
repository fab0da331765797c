"""Without tuning records every template builds its fallback config, and the fallback is what the templates built
before they declared spaces: the loop IR of every zoo model, per vector width, against digests recorded from the
code before the conversion (commit 5eab84c, DEFAULTS and VECTOR_DEFAULTS read as plain knob values)."""

import hashlib
import json

import pytest

from compiler import zoo
from compiler.frontend.onnx import load_onnx
from compiler.ops import group_to_te
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import schedule_group
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tir.printer import format_func
from compiler.tune.space import ConfigSpace

# sha256 of the loop IR below, by (model, the target's vector width in bytes): the loop IR depends on the target
# through its vector width alone (AArch64's equals wasm's)
DIGESTS = {
    ("mlp", 64): "545a58f46f0df20cc1acf7ee12f63bfcff479f1337e19a0086a3023bec6b565e",
    ("mobilenet_v2", 64): "8a006899ce20f0fba00a2c98de302e02d4d2be1e73756d488355697ad19ccf56",
    ("resnet18", 64): "67884fb5e2d708f15f66b9279115e2199b7aab8cdf542ebb7a71b7a6fef7f6d6",
    ("dwconv_block", 64): "38f62251fb572635e6c91b8d560be1ff4409fd31cf541ec704a647a3a767588f",
    ("digits", 64): "2ba72536a69b4bbead9573b9377fbfa1331fe004a930c6c5958006997d8ca702",
    ("mlp", 32): "485adc074e3efe8118d9816c84fbe30d16282113371e709ef63a4315aca26b6a",
    ("mobilenet_v2", 32): "0bb58e2403a30d7feb02f766273ab6f6f508a0afa125e9c3b7dca489880e86eb",
    ("resnet18", 32): "d3bf794b12d1259777b17d48c6585f3259299cee8586882f5c1c3d9e7d8d79a1",
    ("dwconv_block", 32): "b219d6ee844ffe41c419cd2d8d1a4a3bca5744d6bde7824302ac6ec22bc205d0",
    ("digits", 32): "0f4426e12e2619a0e35ef8593678c029f59702eca5c56b279e700c5585ab3eb7",
    ("mlp", 16): "47b4121be258f5cec3c2e524406581e03610ff2cc6b22392c10c7b6dc732b4ea",
    ("mobilenet_v2", 16): "2b2ae72574721d0237a419d0fce5e3b8136baa7296e94a48d31ebbafffacc692",
    ("resnet18", 16): "b71092a901787b9e334d24d6a16827a121e1ddb590bd1a23ba477df5c3d0473f",
    ("dwconv_block", 16): "3aefc186db198e6cdabb069cff33f7cd041994b69162b9e08b09a48a39f13cdc",
    ("digits", 16): "873c584d5b2048c5dba045560b76489368533d67c4960c6ed2e7074a098c544f",
}
TARGETS = ["llvm", "llvm -mattr=-avx512f", "wasm"]


def loop_ir(name: str, target: Target, config=None) -> str:
    """Every group's kernel as loop IR, in graph order; `config(cfg)` gives the knob values of a group whose
    template declared `cfg`, or None for the fallback."""
    texts = []
    for node in optimize(load_onnx(zoo.build_model(name)), target=target).nodes:
        group = group_to_te(node)
        space = ConfigSpace()
        schedule = schedule_group(group, target, space)
        if config is not None:
            schedule = schedule_group(group, target, ConfigSpace(config(space)))
        texts.append(format_func(lower(schedule, [*group.inputs, *group.outputs], "kernel")))
    return "\n\n".join(texts)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_fallback_builds_what_the_defaults_built(name, target):
    target = Target.parse(target)
    key = (name, target.vector_bytes)
    if key not in DIGESTS:
        pytest.skip(f"no digest recorded for {target.vector_bytes}-byte vectors")
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
