"""Mid-size models for `cargo xtask bench mid`: compute-bound sizes, not part of the test corpus.

Their exports are large (tens of MiB of weights) and are never committed: the benchmark makes
them with `python -m tracepass.export --model NAME --out DIR` into a folder outside git.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

import torch
import torch.nn as nn

from .models import Batch, InplaceBlock, ModelSpec, batch_tokens, make_llama, make_nanogpt

MID_VOCAB, MID_BLOCK, MID_BATCH = 512, 128, 4

# the corpus factories at compute-bound sizes (partials of module-level functions pickle, as
# the exporter's rank processes need)
make_nanogpt_mid = partial(make_nanogpt, vocab=MID_VOCAB, block=MID_BLOCK, n_layer=4, n_head=6, n_embd=384)
make_llama_mid = partial(
    make_llama,
    vocab=MID_VOCAB,
    block=MID_BLOCK,
    n_layer=4,
    n_embd=384,
    n_head=6,
    n_query_groups=6,
    intermediate_size=1024,
    name="mid-llama",
)
batch_tokens_mid = partial(batch_tokens, vocab=MID_VOCAB, block=MID_BLOCK, batch=MID_BATCH)


class ResNet18(nn.Module):
    """torchvision's resnet18 layout (torchvision is not in the pinned venv): 7x7 stem, max pool,
    4 stages of 2 BasicBlocks (the corpus's `InplaceBlock`, out of place), 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            blocks = [InplaceBlock(cin, cout, stride, inplace=False), InplaceBlock(cout, cout, 1, inplace=False)]
            stages.append(nn.Sequential(*blocks))
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
