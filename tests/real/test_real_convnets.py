"""The real zoo's classic convnets (torchvision's ResNet-50, GoogLeNet, MobileNetV3, EfficientNet, RegNetY,
DenseNet, MNASNet, SqueezeNet, ShuffleNetV2 and DeepLabV3) at their small sizes, their batch norms calibrated on
random images: exported by torch.onnx.export's defaults, compiled for llvm and wasm, and matched against
onnxruntime on the same file."""

import pytest

from compiler import real_zoo

# Deep float32 networks add up their layers' rounding. Off float64 torch, the small MNASNet's outputs are 3.2e-5 out
# in onnxruntime and in Tessel alike, 1.3e-5 apart (1.6e-5 in wasm). The small GoogLeNet's are 1.4e-5 out in
# onnxruntime and 5.3e-5 in Tessel, whose 3x3 convs run by Winograd (2.3e-5 without it; docs/real_models.md), 5.2e-5
# apart (3.9e-5 in wasm). The others hold 1e-5.
RANGE_TOLERANCE = {"mnasnet1_0": 5e-5, "googlenet": 1e-4}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", real_zoo.names("convnet"))
def test_matches_onnxruntime(check_small_model, name, target):
    check_small_model(name, target, RANGE_TOLERANCE.get(name, 1e-5))
