"""compiler.from_torch against PyTorch itself as the oracle: torch modules shaped like the zoo's mlp,
dwconv_block and a resnet block are exported (dynamo exporter, weights in an external data file), compiled and
run, natively and in wasm. Skipped, with the reason, where torch is not installed (`pip install tessel[torch]`)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed; `pip install tessel[torch]` runs these tests")
pytest.importorskip("onnxscript", reason="onnxscript (torch's dynamo ONNX exporter) is not installed")

from compiler import TesselError, from_torch  # noqa: E402

nn = torch.nn


class ResidualBlock(nn.Module):
    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(nn.functional.max_pool2d(y, 2), 1), 1))


def _models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    dwconv = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU())
    return {
        "mlp": (mlp, torch.randn(1, 784)),
        "dwconv_block": (dwconv, torch.randn(1, 16, 14, 14)),
        "residual_block": (ResidualBlock(), torch.randn(1, 8, 16, 16)),
    }


@pytest.mark.parametrize(
    "name, target", [("mlp", "llvm"), ("mlp", "wasm"), ("dwconv_block", "llvm"), ("residual_block", "llvm")]
)
def test_from_torch_matches_torch(name, target):
    module, example = _models()[name]
    module.eval()
    for parameter in module.modules():
        if isinstance(parameter, nn.BatchNorm2d):
            parameter.running_mean.uniform_(-0.5, 0.5)
            parameter.running_var.uniform_(0.5, 2.0)
    compiled = from_torch(module, example, target, input_names=["input"], output_names=["output"])
    assert [spec.name for spec in compiled.inputs] == ["input"] and compiled.inputs[0].shape == tuple(example.shape)
    with torch.no_grad():
        expected = module(example).numpy()
    np.testing.assert_allclose(compiled.run({"input": example.numpy()})["output"], expected, rtol=1e-4, atol=1e-5)


def test_the_torchscript_exporter_works_too():
    module, example = _models()["mlp"]
    compiled = from_torch(module.eval(), (example,), "llvm", dynamo=False)
    with torch.no_grad():
        expected = module(example).numpy()
    (output,) = compiled.run({compiled.inputs[0].name: example.numpy()}).values()
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)


def test_what_is_not_a_module_is_refused():
    with pytest.raises(TesselError, match="takes a torch.nn.Module, not function"):
        from_torch(lambda x: x, torch.zeros(1))
