"""The real-architecture set itself (compiler/real_zoo.py): which models it holds, the inputs they are exported with,
the export cache, the torchvision import shim and the error that names what to install."""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from compiler import real_zoo
from compiler.errors import TesselError


def test_the_set_covers_every_family_with_both_sizes():
    assert len(real_zoo.MODELS) >= 22
    expected = {"bert_base_128", "bert_base_384", "distilbert", "roberta_base", "minilm", "gpt2", "llama"}
    expected |= {"whisper_tiny_encoder", "vit_b_16", "vit_base", "deit_small", "swin_t", "convnext_tiny"}
    expected |= {"mobilevit_s", "segformer_b0", "resnet50", "googlenet", "mobilenet_v3_large", "efficientnet_b0"}
    expected |= {"regnet_y_400mf", "densenet121", "mnasnet1_0", "squeezenet1_1", "shufflenet_v2"}
    expected |= {"deeplabv3_mobilenet_v3"}
    assert expected <= set(real_zoo.MODELS)
    assert sorted(name for family in real_zoo.FAMILIES for name in real_zoo.names(family)) == sorted(real_zoo.MODELS)
    assert {entry.library for entry in real_zoo.MODELS.values()} == {"torchvision", "transformers", "timm"}


@pytest.mark.parametrize("name", real_zoo.names())
def test_inputs_are_fixed_and_smaller_in_the_small_size(name):
    full, small = real_zoo.sample_inputs(name, "full"), real_zoo.sample_inputs(name, "small")
    assert list(full) == list(small)
    for key, array in full.items():
        np.testing.assert_array_equal(array, real_zoo.sample_inputs(name, "full")[key])
        assert array.dtype == small[key].dtype
        assert small[key].size < array.size
    family = real_zoo.MODELS[name].family
    if family == "text":
        assert full["input_ids"].dtype == np.int64 and full["attention_mask"].dtype == np.int64
    else:
        assert all(array.dtype == np.float32 for array in full.values())


def test_encoders_pad_and_decoders_run_a_whole_prompt():
    bert = real_zoo.sample_inputs("bert_base_128")
    assert bert["input_ids"].shape == (1, 128) and bert["attention_mask"].sum() == 96
    assert np.all(bert["input_ids"][bert["attention_mask"] == 0] == 0)
    roberta = real_zoo.sample_inputs("roberta_base")
    # RoBERTa's position ids count the tokens that are not its pad token (1): padding must be that token
    assert np.all(roberta["input_ids"][roberta["attention_mask"] == 0] == 1)
    assert np.all(roberta["input_ids"][roberta["attention_mask"] == 1] > 1)
    assert real_zoo.sample_inputs("bert_base_384")["input_ids"].shape == (1, 384)
    assert real_zoo.sample_inputs("gpt2")["attention_mask"].all()
    assert real_zoo.sample_inputs("whisper_tiny_encoder")["input_features"].shape == (1, 80, 3000)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: real_zoo.sample_inputs("bert_huge"), "unknown real model 'bert_huge'; choose one of bert_base_128"),
        (lambda: real_zoo.export("gpt2", "medium"), "unknown size 'medium'; choose one of full, small"),
        (lambda: real_zoo.names("speech"), "unknown family 'speech'"),
    ],
)
def test_unknown_names_are_refused(call, message):
    with pytest.raises(TesselError, match=message):
        call()


def test_a_missing_library_is_named_with_what_to_install(monkeypatch):
    monkeypatch.setattr(real_zoo, "_TORCH_STACK", {})
    monkeypatch.setitem(sys.modules, "timm", None)  # what `import timm` finds when timm is not installed
    with pytest.raises(TesselError, match=r"pip install 'tessel\[real\]'.*missing: timm"):
        real_zoo.build("squeezenet1_1", "small")


def test_the_shim_skips_only_torchvision_registrations():
    calls = []

    def register_fake(op, func=None, /, **kwargs):
        calls.append(op)
        return func

    torch = SimpleNamespace(library=SimpleNamespace(register_fake=register_fake))
    real_zoo._let_torchvision_import(torch)
    real_zoo._let_torchvision_import(torch)  # a second import wraps nothing twice

    def fake(x):
        return x

    assert torch.library.register_fake("torchvision::nms")(fake) is fake
    assert torch.library.register_fake("torchvision::roi_align", fake) is fake
    assert calls == []
    assert torch.library.register_fake("mylib::scale", fake) is fake
    assert calls == ["mylib::scale"]


def test_convnet_batch_norms_are_calibrated():
    module = real_zoo.build("shufflenet_v2", "small")
    norms = [layer for layer in module.modules() if type(layer).__name__ == "BatchNorm2d"]
    assert norms and not module.training
    for norm in norms:
        assert norm.running_mean.abs().max() > 0 and (norm.running_var - 1).abs().max() > 0


def test_an_export_is_cached_beside_its_weights(real_cache, monkeypatch):
    path = real_zoo.export("vit_base", "small", real_cache)
    assert path.name == "model.onnx" and (path.parent / "model.onnx.data").is_file()
    torch = real_zoo._libraries()["torch"]

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    assert real_zoo.export("vit_base", "small", real_cache) == path
    assert not [entry for entry in real_cache.iterdir() if entry.name.startswith(".")]  # no staging folder left
