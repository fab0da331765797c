"""Real architectures, beside compiler/zoo/'s hand-written graphs: models built from the architecture code of
torchvision, Hugging Face transformers and timm with seeded random weights (there is no model hub here), each in a
"full" size (what a user runs; the benchmark's) and a "small" one (the same code with fewer layers, narrower or at a
lower resolution, for the test suite). `export` writes a model as a user would, with `torch.onnx.export`'s defaults
(the dynamo exporter, weights in external data), into a cache folder, and hands the ONNX path to compile_model.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import TesselError

SIZES = ("full", "small")
FAMILIES = ("text", "audio", "vision", "convnet")
SEED = 0
# What `pip install 'tessel[real]'` brings; torchvision pinned to the release built for the CPU torch wheel.
INSTALL_HINT = (
    "the real-architecture zoo needs torch, torchvision, transformers and timm: `pip install 'tessel[real]'` "
    "(`make test` installs them beside the CPU torch wheel)"
)


@dataclass(frozen=True)
class RealModel:
    """One architecture: `build(size)` makes the torch module in eval mode with seeded weights, `inputs(size)` the
    numpy inputs it is exported and run with, keyed by the ONNX input names (no torch needed for them)."""

    name: str
    family: str
    library: str
    summary: str
    build: Callable[[str], Any]
    inputs: Callable[[str], dict[str, np.ndarray]]


# -- the optional libraries -------------------------------------------------------------------------------------------


_TORCH_STACK: dict[str, Any] = {}


def _libraries() -> dict[str, Any]:
    """torch, torchvision, transformers and timm, imported on first use: they are optional (hundreds of MB, and only
    this module and the benchmarks need them), so importing compiler must not pull them in."""
    if _TORCH_STACK:
        return _TORCH_STACK
    try:
        import torch
    except ImportError:
        raise TesselError(INSTALL_HINT) from None
    _let_torchvision_import(torch)
    try:
        import timm
        import torchvision
        import transformers
    except ImportError as error:
        raise TesselError(f"{INSTALL_HINT}; missing: {error.name}") from None
    transformers.logging.set_verbosity_error()
    _TORCH_STACK.update(torch=torch, torchvision=torchvision, transformers=transformers, timm=timm)
    return _TORCH_STACK


def _let_torchvision_import(torch) -> None:
    """PyPI's torchvision is built against the CUDA torch: beside the CPU wheel its C extension does not load, and
    registering fake kernels for its missing detection ops (torchvision::nms, roi_align...) then fails the import.
    No model here uses those ops, so their registrations become no-ops; transformers and timm import torchvision
    too, so this runs before any of the three."""
    register_fake = torch.library.register_fake
    if getattr(register_fake, "skips_torchvision", False):
        return

    def register_fake_but_torchvision(op, func=None, /, *args, **kwargs):
        if isinstance(op, str) and op.startswith("torchvision::"):
            return func if func is not None else (lambda function: function)
        return register_fake(op, func, *args, **kwargs)

    register_fake_but_torchvision.skips_torchvision = True
    torch.library.register_fake = register_fake_but_torchvision


def _seeded(build: Callable[..., Any]) -> Callable[[str], Any]:
    """`build(size)` with torch seeded first, so every call gives the same weights; the module in eval mode."""

    def seeded(size: str):
        libraries = _libraries()
        libraries["torch"].manual_seed(SEED)
        return build(libraries, size).eval()

    return seeded


def _calibrate_batch_norms(torch, module, shape: tuple[int, ...]):
    """Running statistics measured on random images, as training would leave them. torchvision's fresh statistics
    (mean 0, variance 1) normalise nothing: with random weights, activations grow or shrink layer after layer and
    the batch-norm fold multiplies by 1. Enough images that a norm past the usual 32x downsampling still averages 32
    values a channel: at 32x32 that is one value an image, and statistics of two made MNASNet's logits reach 1e11."""
    norms = [layer for layer in module.modules() if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a plain average over the calibration batch
    generator = torch.Generator().manual_seed(SEED + 1)
    images = max(2, math.ceil(32 * 32 * 32 / (shape[-2] * shape[-1])))
    module.train()
    with torch.no_grad():
        module(torch.randn((images, *shape[1:]), generator=generator))
    return module.eval()


# -- inputs ------------------------------------------------------------------------------------------------------------


def _tokens(count: int, vocabulary: int, padded: int = 0, pad_token: int = 0, mask: bool = True) -> dict:
    """Random token ids (never the pad token but in the `padded` last positions) and, with `mask`, the attention mask
    that is 0 over those positions, so the exported mask path is exercised."""
    rng = np.random.default_rng(SEED)
    ids = rng.integers(pad_token + 1, vocabulary, size=(1, count), dtype=np.int64)
    if padded:
        ids[0, count - padded :] = pad_token
    feeds = {"input_ids": ids}
    if mask:
        attention = np.ones((1, count), np.int64)
        if padded:
            attention[0, count - padded :] = 0
        feeds["attention_mask"] = attention
    return feeds


def _image(name: str, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {name: np.random.default_rng(SEED).standard_normal(shape).astype(np.float32)}


# -- text encoders and decoders (transformers) ---------------------------------------------------------------------


def _bert_config(transformers, size: str, hidden: int, layers: int, heads: int, inner: int):
    if size == "small":
        return transformers.BertConfig(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
        )
    return transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=inner
    )


def _bert_base(libraries, size):
    return libraries["transformers"].BertModel(_bert_config(libraries["transformers"], size, 768, 12, 12, 3072))


def _minilm(libraries, size):
    transformers = libraries["transformers"]
    if size == "small":
        # twelve heads of 8, as MiniLM's twelve heads are narrow (32)
        config = transformers.BertConfig(
            vocab_size=1000,
            hidden_size=96,
            num_hidden_layers=2,
            num_attention_heads=12,
            intermediate_size=192,
            max_position_embeddings=64,
        )
        return transformers.BertModel(config)
    # all-MiniLM-L6-v2's shape: six layers of 384 in twelve heads
    return transformers.BertModel(_bert_config(transformers, size, 384, 6, 12, 1536))


def _distilbert(libraries, size):
    transformers = libraries["transformers"]
    if size == "small":
        config = transformers.DistilBertConfig(
            vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64
        )
    else:
        config = transformers.DistilBertConfig()
    return transformers.DistilBertModel(config)


def _roberta(libraries, size):
    transformers = libraries["transformers"]
    # roberta-base: its positions count from the pad token's id, computed from the ids with a cumulative sum
    shape = {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1}
    if size == "small":
        shape.update(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=66,
        )
    return transformers.RobertaModel(
        transformers.RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, **shape)
    )


def _gpt2(libraries, size):
    transformers = libraries["transformers"]
    shape = {"n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000} if size == "small" else {}
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False, **shape))


def _llama(libraries, size):
    transformers = libraries["transformers"]
    if size == "small":
        shape = {
            "vocab_size": 1000,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
        }
    else:
        # SmolLM2-135M's shape: 135 M parameters, 9 query heads sharing 3 key-value heads
        shape = {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 2048,
            "rope_theta": 100000.0,
        }
    config = transformers.LlamaConfig(tie_word_embeddings=True, use_cache=False, **shape)
    return transformers.LlamaForCausalLM(config)


def _whisper_encoder(libraries, size):
    transformers = libraries["transformers"]
    if size == "small":
        shape = {"d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_source_positions": 50}
        shape.update(encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4)
        shape.update(max_target_positions=64)
    else:
        # whisper-tiny: 4 layers of 384 in 6 heads, 30 s of 80-bin log-mel frames
        shape = {"d_model": 384, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "max_source_positions": 1500}
        shape.update(encoder_layers=4, decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6)
    return transformers.WhisperModel(transformers.WhisperConfig(num_mel_bins=80, **shape)).get_encoder()


# -- vision transformers and modern vision nets ---------------------------------------------------------------------


def _vit_b_16(libraries, size):
    models = libraries["torchvision"].models
    if size == "small":
        module = models.VisionTransformer(
            image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128
        )
    else:
        module = models.vit_b_16(weights=None)
    # torchvision starts the classifier at zero (for fine-tuning): left so, every output would be its bias, whatever
    # the encoder computed, and no comparison of outputs could fail
    libraries["torch"].nn.init.normal_(module.heads.head.weight, std=0.02)
    return module


def _vit_base(libraries, size):
    transformers = libraries["transformers"]
    if size == "small":
        config = transformers.ViTConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=64
        )
    else:
        config = transformers.ViTConfig()
    return transformers.ViTModel(config)


def _deit_small(libraries, size):
    shape = {"img_size": 64, "depth": 2, "embed_dim": 64, "num_heads": 4} if size == "small" else {}
    return libraries["timm"].create_model("deit_small_patch16_224", pretrained=False, **shape)


def _swin_t(libraries, size):
    models = libraries["torchvision"].models
    if size == "small":
        # 64x64 in windows of 4: two stages of shifted windows, one that fits a window, one padded up to it
        return models.SwinTransformer(
            patch_size=[4, 4], embed_dim=32, depths=[2, 2, 1, 1], num_heads=[2, 2, 4, 4], window_size=[4, 4]
        )
    return models.swin_t(weights=None)


def _convnext_tiny(libraries, size):
    models = libraries["torchvision"].models
    if size == "small":
        stages = [(16, 32), (32, 64), (64, 128), (128, None)]
        return models.ConvNeXt([models.convnext.CNBlockConfig(width, after, 1) for width, after in stages])
    return models.convnext_tiny(weights=None)


def _mobilevit(libraries, size):
    name = "mobilevit_xxs" if size == "small" else "mobilevit_s"
    return libraries["timm"].create_model(name, pretrained=False)


def _segformer_b0(libraries, size):
    transformers = libraries["transformers"]
    if size == "small":
        config = transformers.SegformerConfig(
            depths=[1, 1, 1, 1],
            hidden_sizes=[16, 32, 48, 64],
            num_attention_heads=[1, 2, 2, 4],
            decoder_hidden_size=32,
            num_labels=8,
        )
    else:
        config = transformers.SegformerConfig(num_labels=150)  # B0's widths; ADE20k's classes
    return transformers.SegformerForSemanticSegmentation(config)


# -- classic convnets (torchvision) ---------------------------------------------------------------------------------


def _convnet(full: Callable[[Any], Any], small: Callable[[Any], Any] | None, shapes: dict[str, tuple[int, ...]]):
    """A torchvision convnet: `full(models)` at full size, `small(models)` (or the same) at the small size, its
    batch norms calibrated at the size's input shape."""

    def build(libraries, size):
        models = libraries["torchvision"].models
        module = (small or full)(models) if size == "small" else full(models)
        return _calibrate_batch_norms(libraries["torch"], module, shapes[size])

    return build


def _efficientnet_b0_shallow(models):
    """EfficientNet-B0's stages (expansion, kernel, stride, channels in and out, blocks) with one block each."""
    stages = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3)]
    stages += [(6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    config = models.efficientnet.MBConvConfig
    return models.EfficientNet([config(*stage, width_mult=1.0, depth_mult=0.25) for stage in stages], dropout=0.2)


def _regnet_y_400mf_shallow(models):
    """RegNetY-400MF's width rule (w_0 48, w_a 27.89, w_m 2.09, groups of 8, squeeze-excite 1/4) over 6 blocks."""
    blocks = models.regnet.BlockParams.from_init_params(
        depth=6, w_0=48, w_a=27.89, w_m=2.09, group_width=8, se_ratio=0.25
    )
    return models.RegNet(blocks)


def _deeplab(models):
    return models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=21)


# -- the set ----------------------------------------------------------------------------------------------------------


def _text(tokens: dict[str, int], vocabulary: dict[str, int], pad_token: int = 0, decoder: bool = False):
    """Inputs of a text model: encoders get a quarter of their tokens as padding (masked out); decoders run one
    whole prompt, unpadded."""

    def inputs(size, count=None):
        count = tokens[size] if count is None else count
        return _tokens(count, vocabulary[size], padded=0 if decoder else count // 4, pad_token=pad_token)

    return inputs


def _pixels(name: str, shapes: dict[str, tuple[int, ...]]):
    return lambda size: _image(name, shapes[size])


_IMAGENET = {"full": (1, 3, 224, 224), "small": (1, 3, 64, 64)}
# where 64x64 costs a model's tests much more compile time: each of its distinct convs is a kernel of its own, compiled
# for llvm and for wasm (GoogLeNet's 57: 50 s at 64x64, 23 s at 32x32; MobileViT-XXS 22 s and 9 s)
_SMALL_32 = {"full": (1, 3, 224, 224), "small": (1, 3, 32, 32)}
_BERT_VOCABULARY = {"full": 30522, "small": 1000}

_ENTRIES = [
    RealModel(
        "bert_base_128",
        "text",
        "transformers",
        "BERT-base (12 x 768), 128 tokens",
        _seeded(_bert_base),
        _text({"full": 128, "small": 16}, _BERT_VOCABULARY),
    ),
    RealModel(
        "bert_base_384",
        "text",
        "transformers",
        "BERT-base (12 x 768), 384 tokens",
        _seeded(_bert_base),
        _text({"full": 384, "small": 32}, _BERT_VOCABULARY),
    ),
    RealModel(
        "distilbert",
        "text",
        "transformers",
        "DistilBERT (6 x 768), 128 tokens",
        _seeded(_distilbert),
        _text({"full": 128, "small": 16}, _BERT_VOCABULARY),
    ),
    RealModel(
        "roberta_base",
        "text",
        "transformers",
        "RoBERTa-base (12 x 768), 128 tokens",
        _seeded(_roberta),
        _text({"full": 128, "small": 16}, {"full": 50265, "small": 1000}, pad_token=1),
    ),
    RealModel(
        "minilm",
        "text",
        "transformers",
        "MiniLM-sized BERT (6 x 384, all-MiniLM-L6-v2's shape), 128 tokens",
        _seeded(_minilm),
        _text({"full": 128, "small": 16}, _BERT_VOCABULARY),
    ),
    RealModel(
        "gpt2",
        "text",
        "transformers",
        "GPT-2 (124 M) with its LM head, a 64-token prompt, no cache",
        _seeded(_gpt2),
        _text({"full": 64, "small": 16}, {"full": 50257, "small": 1000}, decoder=True),
    ),
    RealModel(
        "llama",
        "text",
        "transformers",
        "Llama-class decoder (SmolLM2-135M's shape: RoPE, RMSNorm, SiLU MLP, 9 query / 3 key-value heads) with its "
        "LM head, a 128-token prompt, no cache",
        _seeded(_llama),
        _text({"full": 128, "small": 16}, {"full": 49152, "small": 1000}, decoder=True),
    ),
    RealModel(
        "whisper_tiny_encoder",
        "audio",
        "transformers",
        "Whisper-tiny-sized encoder (4 x 384), 3000 log-mel frames (30 s)",
        _seeded(_whisper_encoder),
        _pixels("input_features", {"full": (1, 80, 3000), "small": (1, 80, 100)}),
    ),
    RealModel(
        "vit_b_16",
        "vision",
        "torchvision",
        "ViT-B/16, 224x224",
        _seeded(_vit_b_16),
        _pixels("x", _IMAGENET),
    ),
    RealModel(
        "vit_base",
        "vision",
        "transformers",
        "ViT-base (transformers' ViTModel), 224x224",
        _seeded(_vit_base),
        _pixels("pixel_values", _IMAGENET),
    ),
    RealModel(
        "deit_small",
        "vision",
        "timm",
        "DeiT-S/16, 224x224",
        _seeded(_deit_small),
        _pixels("x", _IMAGENET),
    ),
    RealModel(
        "swin_t",
        "vision",
        "torchvision",
        "Swin-T, 224x224",
        _seeded(_swin_t),
        _pixels("x", _IMAGENET),
    ),
    RealModel(
        "convnext_tiny",
        "vision",
        "torchvision",
        "ConvNeXt-Tiny, 224x224",
        _seeded(_convnext_tiny),
        _pixels("x", _IMAGENET),
    ),
    RealModel(
        "mobilevit_s",
        "vision",
        "timm",
        "MobileViT-S, 256x256 (small: MobileViT-XXS at 32x32)",
        _seeded(_mobilevit),
        _pixels("x", {"full": (1, 3, 256, 256), "small": (1, 3, 32, 32)}),
    ),
    RealModel(
        "segformer_b0",
        "vision",
        "transformers",
        "SegFormer-B0, 150 classes, 256x256",
        _seeded(_segformer_b0),
        _pixels("pixel_values", {"full": (1, 3, 256, 256), "small": (1, 3, 64, 64)}),
    ),
    *(
        RealModel(name, "convnet", "torchvision", summary, _seeded(_convnet(full, small, shapes)), _pixels("x", shapes))
        for name, summary, full, small, shapes in [
            (
                "resnet50",
                "ResNet-50, 224x224 (small: one bottleneck a stage, 32x32)",
                lambda models: models.resnet50(weights=None),
                lambda models: models.ResNet(models.resnet.Bottleneck, [1, 1, 1, 1]),
                _SMALL_32,
            ),
            (
                "googlenet",
                "GoogLeNet (no auxiliary heads), 224x224 (small: 32x32)",
                lambda models: models.googlenet(weights=None, aux_logits=False, init_weights=True),
                None,
                _SMALL_32,
            ),
            (
                "mobilenet_v3_large",
                "MobileNetV3-Large, 224x224 (small: 32x32)",
                lambda models: models.mobilenet_v3_large(),
                None,
                _SMALL_32,
            ),
            (
                "efficientnet_b0",
                "EfficientNet-B0, 224x224 (small: one block a stage)",
                lambda models: models.efficientnet_b0(),
                _efficientnet_b0_shallow,
                _IMAGENET,
            ),
            (
                "regnet_y_400mf",
                "RegNetY-400MF, 224x224 (small: 6 blocks of its 16)",
                lambda models: models.regnet_y_400mf(),
                _regnet_y_400mf_shallow,
                _IMAGENET,
            ),
            (
                "densenet121",
                "DenseNet-121, 224x224 (small: growth 8, two layers a block)",
                lambda models: models.densenet121(),
                lambda models: models.DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16),
                _IMAGENET,
            ),
            (
                "mnasnet1_0",
                "MNASNet 1.0, 224x224 (small: MNASNet 0.5 at 32x32)",
                lambda models: models.mnasnet1_0(),
                lambda models: models.MNASNet(0.5),
                _SMALL_32,
            ),
            ("squeezenet1_1", "SqueezeNet 1.1, 224x224", lambda models: models.squeezenet1_1(), None, _IMAGENET),
            (
                "shufflenet_v2",
                "ShuffleNetV2 x1.0, 224x224 (small: x0.5 channels, 1-2-1 blocks)",
                lambda models: models.shufflenet_v2_x1_0(),
                lambda models: models.ShuffleNetV2([1, 2, 1], [24, 48, 96, 192, 512]),
                _IMAGENET,
            ),
            (
                "deeplabv3_mobilenet_v3",
                "DeepLabV3 on MobileNetV3-Large, 21 classes, 256x256 (small: 32x32)",
                _deeplab,
                None,
                {"full": (1, 3, 256, 256), "small": (1, 3, 32, 32)},
            ),
        ]
    ),
]
MODELS: dict[str, RealModel] = {entry.name: entry for entry in _ENTRIES}


def _model(name: str, size: str) -> RealModel:
    if name not in MODELS:
        raise TesselError(f"unknown real model {name!r}; choose one of {', '.join(MODELS)}")
    if size not in SIZES:
        raise TesselError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    return MODELS[name]


def names(family: str | None = None) -> list[str]:
    """The models of `family` (every model when None), in the set's order."""
    if family is not None and family not in FAMILIES:
        raise TesselError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    return [name for name, entry in MODELS.items() if family in (None, entry.family)]


def sample_inputs(name: str, size: str = "full", tokens: int | None = None) -> dict[str, np.ndarray]:
    """The inputs `name` is exported with at `size`, by ONNX input name: token ids and masks as int64, images and
    log-mel frames as float32 from a standard normal. The same arrays on every call. `tokens`: a text model's inputs
    with that many tokens instead (for an export with a symbolic sequence: export's `tokens`)."""
    entry = _model(name, size)
    if tokens is None:
        return entry.inputs(size)
    if entry.family != "text":
        raise TesselError(f"{name} is not a text model; only those take a number of tokens")
    return entry.inputs(size, tokens)


def build(name: str, size: str = "full"):
    """The torch module of `name` at `size`, in eval mode, with the same seeded weights on every call."""
    return _model(name, size).build(size)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tessel" / "real"


def _cache_key(name: str, size: str, tokens: tuple[int, int] | None = None) -> str:
    """This file and the libraries' versions decide the export: a change to either gives a new key."""
    libraries = _libraries()
    versions = " ".join(f"{key}={module.__version__}" for key, module in sorted(libraries.items()))
    digest = hashlib.sha256(Path(__file__).read_bytes() + versions.encode()).hexdigest()[:16]
    symbolic = f"-seq{tokens[0]}-{tokens[1]}" if tokens else ""
    return f"{name}-{size}{symbolic}-{digest}"


# The name of the symbolic sequence axis of a text model exported with `tokens` (what `--dim` then names)
SEQUENCE = "seq"


# The decoders that export_with_cache writes with their KV cache
DECODERS = ("gpt2", "llama")


def decoder_dims(tokens: int) -> dict:
    """The dims to compile an export_with_cache export with, for prompts and caches of up to `tokens` tokens."""
    return {"past": (0, tokens - 1), SEQUENCE: (1, tokens), "total": f"past+{SEQUENCE}"}


def export_with_cache(name: str, size: str = "full", cache_dir: str | Path | None = None, tokens: int = 64) -> Path:
    """A decoder exported with its KV cache, as optimum and torch.onnx.export write one for generation: inputs
    input_ids [1, seq], attention_mask [1, total] and past_key_values.<layer>.<key|value> [1, kv heads, past, depth],
    outputs logits and present.<layer>.<key|value> [1, kv heads, past + seq, depth]; seq in 1..tokens, past in
    0..tokens - 1 (compile it with decoder_dims(tokens)). Cached as export is."""
    if name not in DECODERS:
        raise TesselError(f"{name} is not a decoder; export_with_cache takes {', '.join(DECODERS)}")
    _model(name, size)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = folder / (_cache_key(name, size, (1, tokens)) + "-cache")
    path = final / "model.onnx"
    if path.is_file():
        return path
    torch = _libraries()["torch"]
    cache_utils = importlib.import_module("transformers.cache_utils")
    model = build(name, size)
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    depth = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    class WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            cache = cache_utils.DynamicCache(config=config)
            for layer in range(layers):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            present = [tensor for layer in out.past_key_values.layers for tensor in (layer.keys, layer.values)]
            return (out.logits, *present)

    past_names = [f"past_key_values.{layer}.{kind}" for layer in range(layers) for kind in ("key", "value")]
    outputs = ["logits", *(f"present.{layer}.{kind}" for layer in range(layers) for kind in ("key", "value"))]
    generator = torch.Generator().manual_seed(SEED)
    ids = torch.randint(1, config.vocab_size, (1, 3), generator=generator)
    mask = torch.ones((1, 8), dtype=torch.int64)
    past = [torch.randn((1, heads, 5, depth), generator=generator) for _ in past_names]
    sequence = torch.export.Dim(SEQUENCE, min=1, max=tokens)
    cached = torch.export.Dim("past", min=0, max=tokens - 1)
    total = torch.export.Dim("total", min=1, max=2 * tokens - 1)
    dynamic = {"input_ids": {1: sequence}, "attention_mask": {1: total}, "past": tuple({2: cached} for _ in past_names)}
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-cache-", dir=folder))
    try:
        with torch.no_grad():
            torch.onnx.export(
                WithCache().eval(),
                (ids, mask, *past),
                str(staging / "model.onnx"),
                input_names=["input_ids", "attention_mask", *past_names],
                output_names=outputs,
                dynamic_shapes=dynamic,
            )
        try:
            staging.rename(final)
        except OSError:
            if not path.is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def export(
    name: str, size: str = "full", cache_dir: str | Path | None = None, tokens: tuple[int, int] | None = None
) -> Path:
    """Export `name` at `size` with `torch.onnx.export(model, (), path, kwargs=inputs)` and its defaults, into
    `cache_dir` (default_cache_dir() when None), and return the .onnx path; its weights lie beside it in
    `model.onnx.data`. An export already in the cache for the same code and library versions is reused. `tokens`
    (low, high), for a text model: its inputs' sequence axis exported symbolic, named SEQUENCE, in that range (torch's
    dynamic_shapes), as a model for generation or varying prompts is."""
    entry = _model(name, size)
    if tokens is not None and entry.family != "text":
        raise TesselError(f"{name} is not a text model; only those export a symbolic sequence")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = folder / _cache_key(name, size, tokens)
    path = final / "model.onnx"
    if path.is_file():
        return path
    torch = _libraries()["torch"]
    module = entry.build(size)
    arguments = {key: torch.from_numpy(value) for key, value in entry.inputs(size).items()}
    folder.mkdir(parents=True, exist_ok=True)
    # exported into a fresh folder and renamed into place, so a concurrent or interrupted export leaves no half file
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder))
    try:
        dynamic = None
        if tokens is not None:
            sequence = torch.export.Dim(SEQUENCE, min=tokens[0], max=tokens[1])
            dynamic = {key: {1: sequence} for key in arguments}
        with torch.no_grad():
            torch.onnx.export(module, (), str(staging / "model.onnx"), kwargs=arguments, dynamic_shapes=dynamic)
        try:
            staging.rename(final)
        except OSError:
            if not path.is_file():  # another process renamed its export first: keep that one
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
