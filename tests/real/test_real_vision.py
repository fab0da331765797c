"""The real zoo's vision transformers and modern vision nets (ViT-B/16, transformers' ViT, DeiT, Swin-T, ConvNeXt,
MobileViT, SegFormer) at their small sizes: exported by torch.onnx.export's defaults from torchvision's,
transformers' and timm's code, compiled for llvm and wasm, and matched against onnxruntime on the same file."""

import pytest

from compiler import real_zoo


@pytest.mark.slow
@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", real_zoo.names("vision"))
def test_matches_onnxruntime(check_small_model, name, target):
    check_small_model(name, target)
