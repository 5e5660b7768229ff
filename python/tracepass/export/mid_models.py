"""Mid-size models for `cargo xtask bench mid`: compute-bound sizes, not part of the test corpus.

Their exports are large (tens of MiB of weights) and are never committed: the benchmark makes
them with `python -m tracepass.export --model NAME --out DIR` into a folder outside git.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

from .models import Batch, ModelSpec

MID_VOCAB, MID_BLOCK, MID_BATCH = 512, 128, 4


def make_nanogpt_mid() -> nn.Module:
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    cfg = GPTConfig(
        block_size=MID_BLOCK,
        vocab_size=MID_VOCAB,
        n_layer=4,
        n_head=6,
        n_embd=384,
        dropout=0.0,
        bias=True,
    )
    return GPT(cfg)


def batch_tokens_mid(gen: torch.Generator) -> Batch:
    idx = torch.randint(0, MID_VOCAB, (MID_BATCH, MID_BLOCK), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, MID_VOCAB, (MID_BATCH, MID_BLOCK), generator=gen, dtype=torch.int64)
    return OrderedDict(idx=idx), targets


def make_llama_mid() -> nn.Module:
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(
        name="mid-llama",
        block_size=MID_BLOCK,
        vocab_size=MID_VOCAB,
        padded_vocab_size=MID_VOCAB,
        n_layer=4,
        n_embd=384,
        n_head=6,
        n_query_groups=6,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-5,
        mlp_class_name="LLaMAMLP",
        intermediate_size=1024,
    )
    return GPT(cfg)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock (torchvision is not in the pinned venv)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.downsample is None else self.downsample(x)
        return torch.relu(y + skip)


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: 7x7 stem, max pool, 4 stages of 2 BasicBlocks, 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_resnet18_64() -> nn.Module:
    return ResNet18()


def batch_images_64(gen: torch.Generator) -> Batch:
    x = torch.randn(8, 3, 64, 64, generator=gen)
    targets = torch.randint(0, 10, (8,), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x), targets


MID_MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec(
            "nanogpt-mid",
            make_nanogpt_mid,
            batch_tokens_mid,
            description="nanoGPT: vocab 512, block 128, 4 layers, 6 heads, n_embd 384, bias, dropout 0; batch 4",
        ),
        ModelSpec(
            "llama-mid",
            make_llama_mid,
            batch_tokens_mid,
            description="litgpt Llama: vocab 512, block 128, 4 layers, n_embd 384, 6 heads, SwiGLU 1024; batch 4",
        ),
        ModelSpec(
            "resnet18-64",
            make_resnet18_64,
            batch_images_64,
            description="torchvision ResNet-18 (10 classes) on 64x64 images, batch 8",
        ),
    ]
}
