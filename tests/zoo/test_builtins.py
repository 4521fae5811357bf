"""The zoo's own networks: published sizes, real and fake training steps, determinism, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from memplan.errors import MemplanError, UnknownNameError
from memplan.tracing.fake import new_fake_mode
from memplan.zoo import get_workload, known_models

BUILTIN = known_models(include_hf=False)

# Published parameter counts (torchvision's model cards; U-Net: milesial/Pytorch-UNet with
# BatchNorm, 3 in / 2 out channels; Inception v3: torchvision's 27,161,264 minus its aux head;
# stochastic depth: Huang et al.'s ResNet-110, 1.7M; CIFAR forms: kuangliu/pytorch-cifar).
PUBLISHED_PARAMS = {
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032, "resnet101": 44_549_160,
    "resnet152": 60_192_808, "vgg11": 132_863_336, "vgg13": 133_047_848, "vgg16": 138_357_544,
    "vgg19": 143_667_240, "alexnet": 61_100_840, "mobilenet_v2": 3_504_872, "squeezenet": 1_235_496,
    "inception_v3": 27_161_264 - 3_326_696, "unet": 31_037_698, "mobilenet_v1": 4_231_976,
    "stochastic_depth": 1_700_000, "resnet18-cifar": 11_173_962, "vgg16-cifar": 14_728_266,
}
# Rounded published figures ("1.7M", "4.2M") are matched to this relative tolerance.
ROUNDED_TOLERANCE = 0.02
ROUNDED = ("stochastic_depth",)

# Tiny real-step settings; the ImageNet forms keep their architecture, only widths/sizes shrink.
TINY = {
    "alexnet": dict(input_size=64, num_classes=10, classifier_width=32),
    "inception_v3": dict(input_size=75, num_classes=10),
    "unet": dict(input_size=32, base_channels=4),
    "lstm": dict(seq_len=8, hidden_size=16, embed_size=8, vocab_size=11),
    "transformer-encoder": dict(seq_len=8, d_model=16, nhead=2, num_layers=2, vocab_size=11),
    "kmeans": dict(n_clusters=5, dim=3),
    "stochastic_depth": dict(depth=20),
}
TINY_BATCH = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models run fastest on one thread


def tiny_config(name: str) -> dict:
    if name in TINY:
        return dict(TINY[name])
    config = dict(input_size=64 if "cifar" not in name else 32, num_classes=10)
    if name.startswith(("vgg", "resnet")):
        config["base_width"] = 8  # same depth and topology, 1/8 of the channels
    if name.startswith("vgg") and "cifar" not in name:
        config["classifier_width"] = 32
    return config


def fake_workload(name: str, batch: int = 2, **config):
    mode = new_fake_mode()  # memplan's: copies of fake tensors (nn.TransformerEncoder's layers) share it
    with mode:
        workload = get_workload(name, batch, **config)
    return mode, workload


def test_every_paper_workload_is_known():
    expected = {f"vgg{d}" for d in (11, 13, 16, 19)} | {f"resnet{d}" for d in (18, 34, 50, 101, 152)}
    expected |= {f"{n}-cifar" for n in expected}
    expected |= {"alexnet", "mobilenet_v1", "mobilenet_v2", "squeezenet", "inception_v3", "unet", "lstm",
                 "kmeans", "stochastic_depth"}
    assert expected <= set(BUILTIN)
    assert {"hf:bert-base", "hf:gpt2", "hf:vit-base", "hf:convnext-tiny"} <= set(known_models())


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_counts_match_published(name):
    _, workload = fake_workload(name)
    expected = PUBLISHED_PARAMS[name]
    if name in ROUNDED:
        assert abs(workload.num_parameters - expected) <= ROUNDED_TOLERANCE * expected
    else:
        assert workload.num_parameters == expected


@pytest.mark.parametrize("name", BUILTIN)
def test_real_tiny_step_changes_every_trained_parameter(name):
    workload = get_workload(name, TINY_BATCH, **tiny_config(name))
    before = [p.detach().clone() for p in workload.model.parameters()]
    loss = workload.step()
    assert loss.shape == () and not loss.requires_grad and math.isfinite(float(loss))
    for (pname, p), old in zip(workload.model.named_parameters(), before):
        if p.grad is None:  # only a dropped stochastic-depth block may be untouched
            assert name == "stochastic_depth", pname
            assert torch.equal(p, old)
        else:
            assert not torch.equal(p, old), pname


@pytest.mark.parametrize("name", BUILTIN)
def test_fake_step_at_default_size(name):
    mode, workload = fake_workload(name)
    with mode:
        loss = workload.step()
        out = workload.model(workload.inputs[0]) if name != "kmeans" else None
    assert isinstance(loss, FakeTensor) and loss.shape == ()
    assert all(isinstance(p, FakeTensor) for p in workload.model.parameters())
    assert all(isinstance(x, FakeTensor) for x in workload.inputs)
    size = workload.input_size
    if name == "unet":
        assert out.shape == (2, 2, size, size)
    elif name == "lstm":
        assert out.shape == (2, 100, 65)
    elif name == "transformer-encoder":
        assert out.shape == (2, 128, 1000)
    elif name != "kmeans":
        assert out.shape == (2, 10 if ("cifar" in name or name == "stochastic_depth") else 1000)


def test_default_input_sizes():
    sizes = {name: fake_workload(name)[1].inputs[0].shape for name in ("resnet50", "vgg16-cifar",
                                                                      "inception_v3", "lstm", "kmeans")}
    assert sizes == {"resnet50": (2, 3, 224, 224), "vgg16-cifar": (2, 3, 32, 32),
                     "inception_v3": (2, 3, 299, 299), "lstm": (2, 100), "kmeans": (2, 128)}


def test_optimizers_follow_the_papers():
    _, cnn = fake_workload("resnet18")
    _, lstm = fake_workload("lstm")
    assert isinstance(cnn.optimizer, torch.optim.SGD) and cnn.optimizer.defaults["momentum"] == 0.9
    assert isinstance(lstm.optimizer, torch.optim.Adam)


def _state(workload):
    return [t.detach().clone() for t in workload.model.state_dict().values()]


def test_same_seed_same_weights_inputs_and_step():
    a = get_workload("resnet18-cifar", 2, seed=7)
    b = get_workload("resnet18-cifar", 2, seed=7)
    assert all(torch.equal(x, y) for x, y in zip(_state(a), _state(b)))
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    assert torch.equal(a.step(), b.step())
    assert all(torch.equal(x, y) for x, y in zip(_state(a), _state(b)))
    c = get_workload("resnet18-cifar", 2, seed=8)
    assert not torch.equal(a.inputs[0], c.inputs[0])
    assert not torch.equal(next(get_workload("resnet18-cifar", 2, seed=7).model.parameters()),
                           next(c.model.parameters()))


def test_building_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    get_workload("squeezenet", 2, input_size=64)
    assert torch.equal(torch.rand(3), expected)


def test_make_inputs_is_deterministic_and_sized():
    workload = get_workload("lstm", 2, seq_len=5, hidden_size=8, embed_size=4)
    tokens, targets = workload.make_inputs(6)
    assert tokens.shape == targets.shape == (6, 5) and tokens.dtype == torch.long
    assert int(tokens.max()) < 65 and int(tokens.min()) >= 0
    assert torch.equal(workload.make_inputs(6)[0], tokens)
    assert torch.equal(workload.make_inputs(2)[0], workload.inputs[0])
    assert not torch.equal(workload.make_inputs(6, seed=1)[0], tokens)


def test_step_zeroes_gradients_instead_of_accumulating():
    clean = get_workload("mobilenet_v1", 4, input_size=32, num_classes=10)
    dirty = get_workload("mobilenet_v1", 4, input_size=32, num_classes=10)
    for p in dirty.model.parameters():
        p.grad = torch.full_like(p, 1e3)  # would blow up the update if accumulated
    clean.step()
    dirty.step()
    assert all(torch.equal(x, y) for x, y in zip(_state(clean), _state(dirty)))


def test_kmeans_step_is_one_lloyd_iteration():
    workload = get_workload("kmeans", 40, n_clusters=4, dim=2)
    centroids = workload.model.centroids.detach().numpy().astype(np.float64).copy()
    points = workload.inputs[0].numpy().astype(np.float64)
    # Oracle: plain numpy Lloyd update (empty clusters keep their centroid).
    nearest = ((points[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    expected = centroids.copy()
    for k in range(len(centroids)):
        if (nearest == k).any():
            expected[k] = points[nearest == k].mean(0)
    workload.step()
    np.testing.assert_allclose(workload.model.centroids.detach().numpy(), expected, rtol=1e-4, atol=1e-5)


def test_stochastic_depth_drops_the_same_blocks_every_iteration():
    workload = get_workload("stochastic_depth", 2, depth=56)
    survives = workload.model.survives
    assert len(survives) == 27 and not all(survives) and any(survives)
    called = []
    hooks = [b.register_forward_hook(lambda m, i, o, k=k: called.append(k))
             for k, b in enumerate(workload.model.blocks)]
    workload.step()
    workload.step()
    for h in hooks:
        h.remove()
    alive = [k for k, s in enumerate(survives) if s]
    assert called == alive + alive
    assert get_workload("stochastic_depth", 2, depth=56, seed=5).model.survives == survives
    assert get_workload("stochastic_depth", 2, depth=56, drop_seed=1).model.survives != survives


def test_stochastic_depth_survival_decays_linearly():
    from memplan.zoo.stochastic_depth import survival_pattern

    n, trials = 54, 2000
    patterns = np.array([survival_pattern(n, 0.5, seed) for seed in range(trials)], dtype=float)
    rates = patterns.mean(0)
    expected = 1 - np.arange(1, n + 1) / n * 0.5
    assert np.abs(rates - expected).max() < 0.05


def test_unet_segments_every_pixel():
    workload = get_workload("unet", 2, input_size=32, base_channels=4, num_classes=3)
    images, mask = workload.inputs
    assert workload.model(images).shape == (2, 3, 32, 32) and mask.shape == (2, 32, 32)
    with pytest.raises(MemplanError, match="multiple of 16"):
        get_workload("unet", 2, input_size=40)


def test_meta_device_is_respected():
    workload = get_workload("resnet18-cifar", 2, device="meta")
    assert all(p.device.type == "meta" for p in workload.model.parameters())
    assert all(x.device.type == "meta" for x in workload.inputs)


@pytest.mark.parametrize("bad", [dict(nonsense=1), dict(depth="deep"), dict(num_classes=2.5),
                                 dict(optimizer="lbfgs")])
def test_bad_config_is_a_memplan_error(bad):
    with pytest.raises(MemplanError):
        get_workload("resnet18", 2, **bad)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownNameError, match="resnet50"):
        get_workload("resnet51", 2)


@pytest.mark.parametrize("batch", [0, -1, 2.0, True])
def test_bad_batch(batch):
    with pytest.raises(MemplanError, match="batch"):
        get_workload("resnet18", batch)


def test_input_size_only_for_images():
    with pytest.raises(MemplanError, match="seq_len"):
        get_workload("lstm", 2, input_size=32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_build_matches_cpu_weights_and_steps():
    cpu = get_workload("resnet18-cifar", 2, seed=3)
    gpu = get_workload("resnet18-cifar", 2, seed=3, device="cuda")
    assert all(torch.equal(x, y.cpu()) for x, y in zip(_state(cpu), _state(gpu)))
    assert gpu.inputs[0].is_cuda and torch.isfinite(gpu.step()).item()


def test_stochastic_depth_needs_6n_plus_2():
    with pytest.raises(MemplanError, match="6n\\+2"):
        get_workload("stochastic_depth", 2, depth=21)


def test_config_types_are_coerced_losslessly():
    workload = get_workload("kmeans", 3, n_clusters=2, dim=2, lr=1)  # an int lr is a fine float
    assert workload.config["lr"] == 1.0 and isinstance(workload.config["lr"], float)
    assert workload.optimizer.defaults["lr"] == 1.0


def test_describe_reports_defaults():
    from memplan.zoo import describe

    info = describe("resnet50-cifar")
    assert info["input_size"] == 32 and info["config"]["num_classes"] == 10 and info["optimizer"] == "sgd"
    assert describe("lstm")["config"]["seq_len"] == 100
