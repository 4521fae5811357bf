"""The zoo's own networks (the papers' workloads), as ModelSpecs keyed by name."""

from __future__ import annotations

from . import (alexnet, inception, kmeans, lstm, mobilenet, resnet, squeezenet, stochastic_depth, transformer,
               unet, vgg)
from .tasks import classify_loss, image_inputs, segmentation_inputs, self_loss, sequence_loss, token_inputs
from .workload import ADAM_LR, ModelSpec

IMAGENET_SIZE = 224
IMAGENET_CLASSES = 1000
CIFAR_SIZE = 32
CIFAR_CLASSES = 10
INCEPTION_SIZE = 299
UNET_SIZE = 256
UNET_CLASSES = 2
UNET_BASE = 64
CHAR_VOCAB = 65          # tiny-shakespeare's character set
CHAR_SEQ_LEN = 100
CHAR_EMBED = 128
CHAR_HIDDEN = 512
CHAR_LAYERS = 2
KMEANS_CLUSTERS = 1024
KMEANS_DIM = 128
ENC_VOCAB = 1000         # transformer-encoder: a small language model of nn.TransformerEncoder layers
ENC_SEQ_LEN = 128
ENC_D_MODEL = 256
ENC_HEADS = 4
ENC_LAYERS = 4
ENC_DROPOUT = 0.1
SD_DEPTH = 110           # Huang et al.'s CIFAR ResNet-110
SD_P_LAST = 0.5


def _image(name: str, summary: str, build, *, size: int, classes: int, **defaults) -> ModelSpec:
    return ModelSpec(name=name, summary=summary, build=build, make_inputs=image_inputs, loss=classify_loss,
                     defaults={"num_classes": classes, **defaults}, input_size=size)


def _vgg_resnet() -> list[ModelSpec]:
    specs = []
    for depth in vgg.CONFIGS:
        specs.append(_image(f"vgg{depth}", f"VGG-{depth}, ImageNet 224x224, 1000 classes",
                            vgg.build(depth, False), size=IMAGENET_SIZE, classes=IMAGENET_CLASSES,
                            batch_norm=False, classifier_width=vgg.HIDDEN, base_width=vgg.BASE_WIDTH))
        specs.append(_image(f"vgg{depth}-cifar", f"VGG-{depth} with BatchNorm, CIFAR-10 32x32, 512->10",
                            vgg.build(depth, True), size=CIFAR_SIZE, classes=CIFAR_CLASSES, batch_norm=True,
                            base_width=vgg.BASE_WIDTH))
    for depth in resnet.DEPTHS:
        specs.append(_image(f"resnet{depth}", f"ResNet-{depth}, ImageNet 224x224, 1000 classes",
                            resnet.build(depth, False), size=IMAGENET_SIZE, classes=IMAGENET_CLASSES,
                            base_width=resnet.BASE_WIDTH))
        specs.append(_image(f"resnet{depth}-cifar", f"ResNet-{depth}, CIFAR-10 32x32 (3x3 stem, no max-pool)",
                            resnet.build(depth, True), size=CIFAR_SIZE, classes=CIFAR_CLASSES,
                            base_width=resnet.BASE_WIDTH))
    return specs


def _others() -> list[ModelSpec]:
    return [
        _image("alexnet", "AlexNet, ImageNet 224x224", alexnet.build, size=IMAGENET_SIZE,
               classes=IMAGENET_CLASSES, classifier_width=alexnet.HIDDEN),
        _image("mobilenet_v1", "MobileNet v1 (width 1.0), ImageNet 224x224", mobilenet.build_v1,
               size=IMAGENET_SIZE, classes=IMAGENET_CLASSES),
        _image("mobilenet_v2", "MobileNet v2 (width 1.0), ImageNet 224x224", mobilenet.build_v2,
               size=IMAGENET_SIZE, classes=IMAGENET_CLASSES),
        _image("squeezenet", "SqueezeNet 1.1, ImageNet 224x224", squeezenet.build, size=IMAGENET_SIZE,
               classes=IMAGENET_CLASSES),
        _image("inception_v3", "Inception v3 (no aux head), 299x299", inception.build, size=INCEPTION_SIZE,
               classes=IMAGENET_CLASSES),
        _image("stochastic_depth", "stochastic-depth CIFAR ResNet-110, fixed seeded drop pattern",
               stochastic_depth.build, size=CIFAR_SIZE, classes=CIFAR_CLASSES, depth=SD_DEPTH,
               p_last=SD_P_LAST, drop_seed=0),
        ModelSpec(name="unet", summary="U-Net, 4 levels, 256x256, per-pixel cross-entropy", build=unet.build,
                  make_inputs=segmentation_inputs, loss=classify_loss, input_size=UNET_SIZE,
                  defaults={"num_classes": UNET_CLASSES, "in_channels": 3, "base_channels": UNET_BASE,
                            "batch_norm": True}),
        ModelSpec(name="lstm", summary="char-RNN: embedding, 2-layer LSTM, linear", build=lstm.build,
                  make_inputs=token_inputs, loss=sequence_loss, optimizer="adam", lr=ADAM_LR,
                  defaults={"vocab_size": CHAR_VOCAB, "seq_len": CHAR_SEQ_LEN, "embed_size": CHAR_EMBED,
                            "hidden_size": CHAR_HIDDEN, "num_layers": CHAR_LAYERS, "dropout": 0.0}),
        ModelSpec(name="transformer-encoder", summary="nn.TransformerEncoder LM: 4 pre-norm layers, d=256, causal",
                  build=transformer.build, make_inputs=token_inputs, loss=sequence_loss, optimizer="adam",
                  lr=ADAM_LR, defaults={"vocab_size": ENC_VOCAB, "seq_len": ENC_SEQ_LEN, "d_model": ENC_D_MODEL,
                                        "nhead": ENC_HEADS, "num_layers": ENC_LAYERS, "dropout": ENC_DROPOUT}),
        ModelSpec(name="kmeans", summary="one Lloyd k-means iteration as an SGD step (batch = points)",
                  build=kmeans.build, make_inputs=kmeans.points_inputs, loss=self_loss,
                  optimizer="sgd-plain", lr=kmeans.LLOYD_LR,
                  defaults={"n_clusters": KMEANS_CLUSTERS, "dim": KMEANS_DIM}),
    ]


SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in _vgg_resnet() + _others()}
