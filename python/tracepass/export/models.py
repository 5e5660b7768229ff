"""The corpus models: each built from code or a config with random init (no downloaded weights).

Every entry is module-level (factories and batch makers must pickle, since DDP exports spawn one
process per rank). A factory builds the model with whatever RNG state it finds; the exporter seeds
torch (seed 0) before calling it, so every call gives the same parameters.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

Batch = tuple["OrderedDict[str, torch.Tensor]", torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """One corpus model: how to build it, feed it and score it."""

    name: str
    factory: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], Batch]
    loss: str = "cross_entropy"
    output: int = 0
    deterministic: bool = True
    description: str = ""
    notes: list[str] = field(default_factory=list)


# ---- nanoGPT (Thunder's own test model) ------------------------------------------------------

NANOGPT_VOCAB, NANOGPT_BLOCK = 128, 16


def make_nanogpt(
    vocab: int = NANOGPT_VOCAB, block: int = NANOGPT_BLOCK, n_layer: int = 2, n_head: int = 4, n_embd: int = 64
) -> nn.Module:
    """The corpus nanoGPT; other sizes (`mid_models`) with the same code."""
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    cfg = GPTConfig(
        block_size=block,
        vocab_size=vocab,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        dropout=0.0,
        bias=True,
    )
    return GPT(cfg)


def batch_tokens(
    gen: torch.Generator, vocab: int = NANOGPT_VOCAB, block: int = NANOGPT_BLOCK, batch: int = 2
) -> Batch:
    idx = torch.randint(0, vocab, (batch, block), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, vocab, (batch, block), generator=gen, dtype=torch.int64)
    return OrderedDict(idx=idx), targets


# ---- CNN: Conv2d + BatchNorm2d (training) + ReLU + MaxPool2d, twice, Linear ------------------


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


def make_cnn() -> nn.Module:
    return Cnn()


def batch_cnn(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 3, 16, 16, generator=gen)
    targets = torch.randint(0, 10, (4,), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x), targets


# ---- MLP: Linear + LayerNorm + SiLU + Dropout, twice, Linear ----------------------------------


class Mlp(nn.Module):
    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm1 = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 64)
        self.norm2 = nn.LayerNorm(64)
        self.fc3 = nn.Linear(64, 10)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(F.silu(self.norm1(self.fc1(x))))
        x = self.drop(F.silu(self.norm2(self.fc2(x))))
        return self.fc3(x)


def make_mlp() -> nn.Module:
    return Mlp(0.1)


def make_mlp_frozen() -> nn.Module:
    """The MLP without dropout (deterministic) and its first block frozen."""
    m = Mlp(0.0)
    m.fc1.requires_grad_(False)
    m.norm1.requires_grad_(False)
    return m


def batch_mlp(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 32, generator=gen)
    targets = torch.randint(0, 10, (4,), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x), targets


# ---- litgpt Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention -----------------------------

LLAMA_VOCAB, LLAMA_BLOCK = 128, 16


def make_llama(
    vocab: int = LLAMA_VOCAB,
    block: int = LLAMA_BLOCK,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_query_groups: int = 2,
    intermediate_size: int = 128,
    name: str = "tiny-llama",
) -> nn.Module:
    """The corpus Llama; other sizes (`mid_models`) with the same code."""
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(
        name=name,
        block_size=block,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_query_groups=n_query_groups,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-5,
        mlp_class_name="LLaMAMLP",
        intermediate_size=intermediate_size,
    )
    return GPT(cfg)


def batch_llama(gen: torch.Generator) -> Batch:
    return batch_tokens(gen, LLAMA_VOCAB, LLAMA_BLOCK)


# ---- HF BertForSequenceClassification ---------------------------------------------------------

BERT_VOCAB, BERT_SEQ, BERT_LABELS = 128, 16, 4


def make_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=BERT_VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        type_vocab_size=2,
        num_labels=BERT_LABELS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        return_dict=False,
    )
    return BertForSequenceClassification(cfg)


def batch_bert(gen: torch.Generator) -> Batch:
    input_ids = torch.randint(0, BERT_VOCAB, (2, BERT_SEQ), generator=gen, dtype=torch.int64)
    # Row 0 is all tokens, row 1 ends in padding: the mask is not trivially all ones.
    pad = int(torch.randint(1, BERT_SEQ // 2, (1,), generator=gen))
    attention_mask = torch.ones(2, BERT_SEQ, dtype=torch.int64)
    attention_mask[1, BERT_SEQ - pad :] = 0
    targets = torch.randint(0, BERT_LABELS, (2,), generator=gen, dtype=torch.int64)
    return OrderedDict(input_ids=input_ids, attention_mask=attention_mask), targets


# ---- small heads for the other losses and dtypes ---------------------------------------------


def make_regress_bf16() -> nn.Module:
    """A bf16 regression MLP (parameters and activations in bfloat16)."""
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 8)).to(torch.bfloat16)


def batch_regress_bf16(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 16, generator=gen).to(torch.bfloat16)
    targets = torch.randn(4, 8, generator=gen).to(torch.bfloat16)
    # nn.Sequential's forward names its argument `input`
    return OrderedDict(input=x), targets


class ResBlockNet(nn.Module):
    """A small ResNet: a residual block (conv, BatchNorm, ReLU, conv, BatchNorm, + skip) and
    global average pooling (`AdaptiveAvgPool2d(1)`) before the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn0(self.stem(x)))
        y = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(x + self.bn2(self.conv2(y)))
        return self.fc(torch.flatten(self.pool(x), 1))


def make_resnet() -> nn.Module:
    return ResBlockNet()


def batch_resnet(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 3, 8, 8, generator=gen)
    targets = torch.randint(0, 10, (4,), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x), targets


class SelfLoss(nn.Module):
    """A classifier that returns its own loss: the forward's output is the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.fc2(torch.relu(self.fc1(x))), labels)


def make_selfloss() -> nn.Module:
    return SelfLoss()


def batch_selfloss(gen: torch.Generator) -> Batch:
    x = torch.randn(6, 16, generator=gen)
    labels = torch.randint(0, 5, (6,), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x, labels=labels), torch.zeros(())


# ---- more architectures, for breadth: each brings ops or structure the others lack -----------

SMALL_VOCAB, SMALL_SEQ = 128, 16


class Logits(nn.Module):
    """Returns `.logits` of an HF model that returns a ModelOutput (ViT's `return_dict=False`
    path fails inside transformers 4.57)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.m(*args).logits


def make_vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return Logits(ViTForImageClassification(cfg))


def batch_vit(gen: torch.Generator) -> Batch:
    pixel_values = torch.randn(2, 3, 16, 16, generator=gen)
    return OrderedDict(pixel_values=pixel_values), torch.randint(0, 10, (2,), generator=gen, dtype=torch.int64)


def batch_text_cls(gen: torch.Generator) -> Batch:
    """Two sequences of ids with an attention mask (row 1 padded) and 4-way labels."""
    input_ids = torch.randint(0, SMALL_VOCAB, (2, SMALL_SEQ), generator=gen, dtype=torch.int64)
    attention_mask = torch.ones(2, SMALL_SEQ, dtype=torch.int64)
    attention_mask[1, SMALL_SEQ - 5 :] = 0
    return OrderedDict(input_ids=input_ids, attention_mask=attention_mask), torch.randint(
        0, 4, (2,), generator=gen, dtype=torch.int64
    )


def make_albert() -> nn.Module:
    from transformers import AlbertConfig, AlbertForSequenceClassification

    cfg = AlbertConfig(
        vocab_size=SMALL_VOCAB,
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        num_labels=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
    )
    return Logits(AlbertForSequenceClassification(cfg))


def make_roberta() -> nn.Module:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    cfg = RobertaConfig(
        vocab_size=SMALL_VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=40,
        num_labels=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return Logits(RobertaForSequenceClassification(cfg))


def make_phi() -> nn.Module:
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(
        name="tiny-phi",
        block_size=SMALL_SEQ,
        vocab_size=SMALL_VOCAB,
        padded_vocab_size=SMALL_VOCAB,
        n_layer=2,
        n_embd=64,
        n_head=4,
        rotary_percentage=0.5,
        parallel_residual=True,
        bias=True,
        norm_class_name="LayerNorm",
        mlp_class_name="GptNeoxMLP",
        intermediate_size=128,
        gelu_approximate="tanh",
    )
    return GPT(cfg)


class Conv1dText(nn.Module):
    """Embedding, Conv1d, hardtanh, max_pool1d, LayerNorm, mean over time, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(SMALL_VOCAB, 16)
        self.conv = nn.Conv1d(16, 32, 3, padding=1)
        self.ln = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.conv(self.emb(idx).transpose(1, 2))
        h = F.max_pool1d(F.hardtanh(h), 2)
        return self.fc(self.ln(h.transpose(1, 2)).mean(1))


def make_conv1d() -> nn.Module:
    return Conv1dText()


def batch_ids_cls(gen: torch.Generator) -> Batch:
    idx = torch.randint(0, SMALL_VOCAB, (2, SMALL_SEQ), generator=gen, dtype=torch.int64)
    return OrderedDict(idx=idx), torch.randint(0, 4, (2,), generator=gen, dtype=torch.int64)


class ConvZoo(nn.Module):
    """Conv2d + BatchNorm + leaky_relu, avg_pool2d, strided Conv2d + GroupNorm + elu, adaptive
    average pooling to 3x3 (its backward is not global pooling's), Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.gn = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(F.leaky_relu(self.bn(self.conv1(x)), 0.1), 2)
        x = F.adaptive_avg_pool2d(F.elu(self.gn(self.conv2(x))), 3)
        return self.fc(torch.flatten(x, 1))


def make_convzoo() -> nn.Module:
    return ConvZoo()


def batch_convzoo(gen: torch.Generator) -> Batch:
    x = torch.randn(2, 3, 16, 16, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 10, (2,), generator=gen, dtype=torch.int64)


class SdpaLM(nn.Module):
    """One causal attention layer through `F.scaled_dot_product_attention` (Thunder decomposes it
    on the CPU), and a language-model head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(SMALL_VOCAB, 32)
        self.qkv = nn.Linear(32, 96)
        self.head = nn.Linear(32, SMALL_VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        b, t, c = h.shape
        q, k, v = (x.view(b, t, 4, 8).transpose(1, 2) for x in self.qkv(h).split(32, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(y.transpose(1, 2).reshape(b, t, c))


def make_sdpa() -> nn.Module:
    return SdpaLM()


def batch_sdpa(gen: torch.Generator) -> Batch:
    return batch_tokens(gen, SMALL_VOCAB, SMALL_SEQ)


class UNet(nn.Module):
    """A two-level U-Net: conv + BatchNorm + ReLU encoders, max pooling, `ConvTranspose2d`
    decoders (one with bias, one without), skip connections by concatenation, a 1x1 head.
    Thunder 0.2.6 has no grad rule for `conv_transpose2d`: its backward runs
    `conv_transpose2d_vjp`, the torch-autograd fallback with nested, discarded results."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.mid = nn.Conv2d(16, 16, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.dec2 = nn.Conv2d(32, 8, 3, padding=1)
        self.up1 = nn.ConvTranspose2d(8, 8, 2, stride=2, bias=False)
        self.head = nn.Conv2d(16, 10, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = F.relu(self.mid(F.max_pool2d(e2, 2)))
        d2 = F.relu(self.dec2(torch.cat([self.up2(m), e2], 1)))
        y = self.head(torch.cat([self.up1(d2), e1], 1))
        return y.mean((2, 3))


def make_unet() -> nn.Module:
    return UNet()


def batch_unet(gen: torch.Generator) -> Batch:
    x = torch.randn(2, 3, 16, 16, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 10, (2,), generator=gen, dtype=torch.int64)


class Espcn(nn.Module):
    """ESPCN super-resolution: convolutions to `r * r` channels per output channel, then
    `F.pixel_shuffle(r)` (registered automatically by Thunder: its backward is
    `pixel_shuffle_vjp`)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 5, padding=2)
        self.c2 = nn.Conv2d(16, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 4, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shuffle(self.c3(torch.tanh(self.c2(torch.tanh(self.c1(x))))))


def make_espcn() -> nn.Module:
    return Espcn()


def batch_espcn(gen: torch.Generator) -> Batch:
    x = torch.randn(2, 1, 8, 8, generator=gen)
    return OrderedDict(x=x), torch.randn(2, 1, 16, 16, generator=gen)


class ShiftedWindows(nn.Module):
    """Swin-style cyclic shift (`torch.roll`, registered automatically: `roll_vjp`), then
    attention over the patches with a mask from `torch.triu` built in the forward, the shift
    rolled back, and a classification head."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 4, stride=4)
        self.norm = nn.LayerNorm(32)
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.roll(self.patch(x), shifts=(-1, -1), dims=(2, 3))
        b, c, h, w = p.shape
        t = self.norm(p.flatten(2).transpose(1, 2))
        q, k, v = self.qkv(t).split(c, dim=2)
        mask = torch.triu(torch.ones(h * w, h * w, dtype=torch.bool, device=x.device), diagonal=1)
        a = ((q @ k.transpose(1, 2)) / c**0.5).masked_fill(mask, float("-inf")).softmax(-1)
        y = (t + self.proj(a @ v)).transpose(1, 2).reshape(b, c, h, w)
        y = torch.roll(y, shifts=(1, 1), dims=(2, 3))
        return self.head(y.mean((2, 3)))


def make_shifted() -> nn.Module:
    return ShiftedWindows()


def batch_shifted(gen: torch.Generator) -> Batch:
    x = torch.randn(2, 3, 16, 16, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 10, (2,), generator=gen, dtype=torch.int64)


class InplaceBlock(nn.Module):
    """torchvision's `BasicBlock`, written as it is: `nn.ReLU(inplace=True)` and
    `out += identity`, which Thunder traces as `copy_` writes read on through `update_aliases`.
    With `inplace=False` the same block out of place (`torch.relu`, `+`), as `mid_models`'
    ResNet-18 uses it."""

    def __init__(self, cin: int, cout: int, stride: int, inplace: bool = True) -> None:
        super().__init__()
        self.inplace = inplace
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.inplace:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            skip = x if self.downsample is None else self.downsample(x)
            return torch.relu(y + skip)
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class InplaceResNet(nn.Module):
    """A torchvision-style ResNet in miniature: stem conv + BatchNorm + in-place ReLU,
    max_pool2d(3, 2, 1), two `InplaceBlock`s (the second downsampling), global average pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = InplaceBlock(8, 8, 1)
        self.layer2 = InplaceBlock(8, 16, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_resnet_inplace() -> nn.Module:
    return InplaceResNet()


def batch_resnet_inplace(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 3, 16, 16, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 10, (4,), generator=gen, dtype=torch.int64)


def make_swin() -> nn.Module:
    from transformers import SwinConfig, SwinForImageClassification

    cfg = SwinConfig(
        image_size=32,
        patch_size=4,
        num_channels=3,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )
    return Logits(SwinForImageClassification(cfg))


def batch_swin(gen: torch.Generator) -> Batch:
    return OrderedDict(pixel_values=torch.randn(2, 3, 32, 32, generator=gen)), torch.randint(
        0, 10, (2,), generator=gen, dtype=torch.int64
    )


def make_mpnet() -> nn.Module:
    from transformers import MPNetConfig, MPNetForSequenceClassification

    cfg = MPNetConfig(
        vocab_size=SMALL_VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return Logits(MPNetForSequenceClassification(cfg))


class UnusedBranchBlock(nn.Module):
    """A residual block that returns its skip output and its projection branch separately."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.skip = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.skip(x), self.proj(F.relu(self.fc(x)))


class UnusedParams(nn.Module):
    """Residual blocks whose last block's projection branch (`fc`, `proj`) is computed but feeds
    nothing: only its skip output is used, so eager PyTorch leaves those gradients None and
    Thunder's backward returns none for them."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([UnusedBranchBlock(16) for _ in range(3)])
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            skip, branch = block(x)
            x = torch.tanh(skip if i == last else skip + branch)
        return self.head(x)


def make_unused() -> nn.Module:
    return UnusedParams()


def batch_unused(gen: torch.Generator) -> Batch:
    x = torch.randn(8, 16, generator=gen)
    targets = torch.randint(0, 5, (8,), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x), targets


class EncoderDecoder(nn.Module):
    """A tiny encoder-decoder that returns its encoder state and its logits, as seq2seq models
    do: the loss reads the logits (output 1), so the encoder state's cotangent is zero."""

    def __init__(self, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.encoder = nn.Linear(width, width)
        self.decoder = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = torch.tanh(self.encoder(self.embed(idx)))
        logits = self.head(F.relu(self.decoder(state)) + state)
        return state, logits


def make_encdec() -> nn.Module:
    return EncoderDecoder()


def batch_encdec(gen: torch.Generator) -> Batch:
    idx = torch.randint(0, 32, (4, 8), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, 32, (4, 8), generator=gen, dtype=torch.int64)
    return OrderedDict(idx=idx), targets



# ---- HF models whose traces hold ops Thunder runs through PyTorch ------------------------------


def _hf_masks_by_broadcasting() -> None:
    """transformers 4.57 builds attention masks with `torch.vmap` (`masking_utils`), which
    Thunder 0.2.6 cannot trace; the mask functions are elementwise index arithmetic, so
    broadcasting the indices gives the same mask, as the library's non-vmap path does."""
    import transformers.masking_utils as mu

    def expand(mask_function, bh_indices=True):
        def f(b, h, q, kv):
            if bh_indices:
                out = mask_function(b[:, None, None, None], h[None, :, None, None], q[None, None, :, None], kv[None, None, None, :])
                return out.expand(b.shape[0], h.shape[0], q.shape[0], kv.shape[0])
            return mask_function(None, None, q[:, None], kv[None, :]).expand(q.shape[0], kv.shape[0])

        return f

    mu._vmap_for_bhqkv = expand


class Seq2SeqLogits(nn.Module):
    """`.logits` of an HF encoder-decoder fed `input_ids` and `decoder_input_ids`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


HF_VOCAB, HF_SEQ = 96, 12


def make_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    _hf_masks_by_broadcasting()
    cfg = GPT2Config(
        vocab_size=HF_VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
        use_cache=False,
    )
    m = GPT2LMHeadModel(cfg)
    m.config.use_cache = False
    return Logits(m)


def make_gptj() -> nn.Module:
    from transformers import GPTJConfig, GPTJForCausalLM

    _hf_masks_by_broadcasting()
    cfg = GPTJConfig(
        vocab_size=HF_VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        rotary_dim=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
        use_cache=False,
    )
    m = GPTJForCausalLM(cfg)
    m.config.use_cache = False
    return Logits(m)


def batch_hf_lm(gen: torch.Generator) -> Batch:
    ids = torch.randint(0, HF_VOCAB, (2, HF_SEQ), generator=gen)
    return OrderedDict(input_ids=ids), torch.randint(0, HF_VOCAB, (2, HF_SEQ), generator=gen)


def make_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=HF_VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        attn_implementation="eager",
        use_cache=False,
    )
    m = T5ForConditionalGeneration(cfg)
    m.config.use_cache = False
    return Seq2SeqLogits(m)


def batch_t5(gen: torch.Generator) -> Batch:
    ids = torch.randint(0, HF_VOCAB, (2, HF_SEQ), generator=gen)
    dec = torch.randint(0, HF_VOCAB, (2, HF_SEQ - 4), generator=gen)
    return OrderedDict(input_ids=ids, decoder_input_ids=dec), torch.randint(0, HF_VOCAB, (2, HF_SEQ - 4), generator=gen)


def make_convnextv2() -> nn.Module:
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    cfg = ConvNextV2Config(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32, num_labels=3)
    return Logits(ConvNextV2ForImageClassification(cfg))


def batch_image32(gen: torch.Generator) -> Batch:
    return OrderedDict(pixel_values=torch.randn(2, 3, 32, 32, generator=gen)), torch.randint(
        0, 3, (2,), generator=gen
    )

class LossZoo(nn.Module):
    """Returns its own loss, a sum of five of `torch.nn.functional`'s losses that Thunder keeps
    as single symbols (`kl_div`, `smooth_l1_loss`, `binary_cross_entropy_with_logits`,
    `cross_entropy`, `huber_loss`), over a Linear of the input plus a bag of embeddings
    (Embedding, mean over each row's ids). The sum is continued over lines with `\`, as
    written: Thunder copies the first line, backslash and all, into a source comment."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 5)
        self.emb = nn.Embedding(20, 8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.fc(x + self.emb(ids).mean(1))
        lp = F.log_softmax(h, -1)
        soft = torch.softmax(h.detach() * 0.5, -1)
        classes = torch.remainder(torch.arange(h.shape[0]), 5)
        return F.kl_div(lp, soft, reduction="batchmean") + F.smooth_l1_loss(h, torch.ones_like(h)) \
            + F.binary_cross_entropy_with_logits(h, (h.detach() > 0).float()) \
            + F.cross_entropy(h, classes) + F.huber_loss(h, h.detach() * 0.9, delta=0.5)


def batch_loss_zoo(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 8, generator=gen)
    ids = torch.randint(0, 20, (4, 3), generator=gen, dtype=torch.int64)
    return OrderedDict(x=x, ids=ids), None


class OpZoo(nn.Module):
    """Many ops on one [2, 6, 8] activation: cumsum, roll, std, logsumexp, addcmul, atan2, a
    padded Conv1d, a Conv3d, baddbmm, max with indices feeding gather, repeat_interleave,
    prod, clamp between tensors, avg_pool1d, topk and sort."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Parameter(torch.randn(6, 8) * 0.1)
        self.c = nn.Conv1d(6, 6, 3, padding=1)
        self.d = nn.Conv3d(1, 2, 3, padding=1)
        self.e = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y = y + torch.cumsum(y, -1) * 0.1 + torch.roll(y, 2, 1) - y.std(-1, keepdim=True)
        y = y + torch.logsumexp(y, -1, keepdim=True)
        y = y * 0.7 + self.b * 0.3 + torch.addcmul(y, y, self.b, value=0.5) + torch.atan2(y, self.b + 2)
        y = self.c(y) + F.pad(y, (1, 1))[..., 2:]
        y = y + self.d(y[:, None, None]).mean(1).squeeze(1)
        y = y + torch.baddbmm(y, y, (self.a.weight * 0.1).expand(2, 8, 8))
        v, i = y.max(-1, keepdim=True)
        y = y * torch.sigmoid(v) + torch.gather(y, 2, torch.remainder(i + 1, 8))
        y = y + torch.repeat_interleave(y[..., ::2], 2, dim=-1) + y.prod(-1, keepdim=True).clamp(-1, 1)
        y = y + F.avg_pool1d(y, 3, 1, 1) + torch.clamp(y, min=-self.b.abs(), max=self.b.abs())
        top, _ = torch.topk(y, 3, dim=-1)
        ordered, _ = torch.sort(y, -1)
        return (self.e(y + ordered * 0.1) + top.sum(-1, keepdim=True)).mean(1)


def make_op_zoo() -> nn.Module:
    return OpZoo()


def batch_op_zoo(gen: torch.Generator) -> Batch:
    x = torch.randn(2, 6, 8, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 5, (2,), generator=gen, dtype=torch.int64)


def make_gemma2() -> nn.Module:
    from litgpt.config import Config
    from litgpt.model import GPT

    cfg = Config(
        name="Gemma-2-tiny",  # litgpt gives RMSNorm its unit offset by this name
        block_size=12,
        vocab_size=64,
        padded_vocab_size=64,
        n_layer=2,
        n_embd=32,
        n_head=4,
        head_size=8,
        n_query_groups=2,
        norm_class_name="RMSNorm",
        mlp_class_name="GemmaMLP",
        intermediate_size=64,
        bias=False,
        scale_embeddings=True,
        gelu_approximate="tanh",
        parallel_residual=False,
        attention_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        post_attention_norm=True,
        post_mlp_norm=True,
        sliding_window_size=4,
        sliding_window_indices=[1, 0],
        attention_scores_scalar=8,
    )
    return GPT(cfg)


def batch_gemma2(gen: torch.Generator) -> Batch:
    idx = torch.randint(0, 64, (2, 13), generator=gen, dtype=torch.int64)
    return OrderedDict(idx=idx[:, :-1]), idx[:, 1:]


class ConvNeXtNet(nn.Module):
    """A ConvNeXt stage in miniature: 4x4 stride-4 stem, LayerNorm over channels (permuted to
    channels-last and back), a block of depthwise 7x7 Conv2d, LayerNorm, Linear 4x, exact
    GELU, Linear, layer scale and the residual, global mean, Linear head."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, stride=4)
        self.stem_norm = nn.LayerNorm(c, eps=1e-6)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.up = nn.Linear(c, 4 * c)
        self.down = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(0.1 * torch.ones(c))
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = self.down(F.gelu(self.up(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        x = x + (self.gamma * y).permute(0, 3, 1, 2)
        return self.head(x.mean([-2, -1]))


def make_convnext() -> nn.Module:
    return ConvNeXtNet()


class DenseNet(nn.Module):
    """A DenseNet block: each BatchNorm + ReLU + Conv2d layer reads the concatenation of all
    earlier feature maps; then avg_pool2d, nearest upsampling back and a spatial max."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(4 + 4 * i), nn.ReLU(), nn.Conv2d(4 + 4 * i, 4, 3, padding=1))
            for i in range(3)
        )
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.stem(x)
        b = self.layers[0](a)
        c = self.layers[1](torch.cat([a, b], 1))
        d = self.layers[2](torch.cat([a, b, c], 1))
        x = F.avg_pool2d(torch.cat([a, b, c, d], 1), 2)
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.fc(x.amax((2, 3)))


def make_densenet() -> nn.Module:
    return DenseNet()


def batch_image16(gen: torch.Generator) -> Batch:
    x = torch.randn(2, 3, 16, 16, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 10, (2,), generator=gen, dtype=torch.int64)


class MhaBlocks(nn.Module):
    """Two pre-norm transformer blocks on `nn.MultiheadAttention`, which Thunder 0.2.6 runs
    through its torch fallback (`multi_head_attention_forward`, backward
    `multi_head_attention_forward_vjp`): self-attention with `batch_first=True`, then
    attention of the tokens to their embeddings with `batch_first=False`. No masks: Thunder
    refuses both kinds (a bool mask fails PyTorch's dtype check on a proxy, a float one is a
    keyword operand that needs a gradient)."""

    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm1 = nn.LayerNorm(width)
        self.attn1 = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.attn2 = nn.MultiheadAttention(width, heads // 2)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        e = self.embed(idx)
        h = self.norm1(e)
        x = e + self.attn1(h, h, h)[0]
        q = self.norm2(x).transpose(0, 1)
        kv = e.transpose(0, 1)
        x = x + self.attn2(q, kv, kv)[0].transpose(0, 1)
        return self.head(x + self.mlp(x))


def make_mha() -> nn.Module:
    return MhaBlocks()


def batch_mha(gen: torch.Generator) -> Batch:
    idx = torch.randint(0, 64, (4, 8), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, 64, (4, 8), generator=gen, dtype=torch.int64)
    return OrderedDict(idx=idx), targets


class SliceAssign(nn.Module):
    """Writes into tensors the forward made, as Python does (`y[key] = value`, Thunder's
    `copy_with_setitem`): a slice from another slice, a column set to a number through `...`,
    columns chosen by an index tensor, a boolean mask, a stepped slice of a fresh buffer, a row
    by an int, and `Tensor.__setitem__` called by name."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 24)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inp(x)
        y = z.clone()
        y[:, :8] = z[:, 8:16] * 2.0
        y[..., 0] = 0.0
        cols = torch.arange(3, 7, 2, device=x.device)
        y[:, cols] = z[:, 20:22]
        y[y > 1.0] = 1.0
        buf = torch.zeros(x.shape[0], 32, device=x.device)
        buf[:, 4:28] = torch.tanh(y)
        buf[:, ::3] = 0.5
        buf[0] = buf[1] * 0.5
        buf.__setitem__((slice(None), slice(28, 32)), z[:, :4])
        return self.head(buf)


def make_slice_assign() -> nn.Module:
    return SliceAssign()


def batch_slice_assign(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 16, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 10, (4,), generator=gen, dtype=torch.int64)


class AdaptiveMaxPools(nn.Module):
    """Adaptive max pooling through Thunder's torch fallback (`adaptive_max_pool2d_vjp`,
    `adaptive_max_pool1d_vjp`): a 7x7 map pooled to 3x5 (uneven, overlapping windows), and each
    row of it interleaved with its detached copy (`[y0.detach(), y0, y1.detach(), ...]`, every
    maximum a tie) pooled to 4, so the gradient reaches `y` only where PyTorch's first-maximum
    rule sends it to the live copy."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 3 * 5 + 4 * 7 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        a = F.adaptive_max_pool2d(y, (3, 5))
        t = torch.stack([y.detach(), y], -1).flatten(-2).flatten(1, 2)
        b = F.adaptive_max_pool1d(t, 4)
        return self.head(torch.cat([a.flatten(1), b.flatten(1)], 1))


def make_adaptive_max_pools() -> nn.Module:
    return AdaptiveMaxPools()


def batch_adaptive_max_pools(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 3, 7, 7, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 5, (4,), generator=gen, dtype=torch.int64)


class BilinearNet(nn.Module):
    """`nn.Bilinear` through Thunder's torch fallback (`bilinear_vjp`: gradients of both inputs,
    the weight and the bias), fed a linear map of the input and a nonlinear one."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(6, 5)
        self.bilinear = nn.Bilinear(5, 6, 4)
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.bilinear(self.left(x), torch.sin(x))))


def make_bilinear() -> nn.Module:
    return BilinearNet()


def batch_bilinear(gen: torch.Generator) -> Batch:
    x = torch.randn(3, 4, 6, generator=gen)
    return OrderedDict(x=x), torch.randn(3, 4, 5, generator=gen)


class ShuffleUnit(nn.Module):
    """A ShuffleNet unit in miniature, through Thunder's torch fallbacks (`channel_shuffle_vjp`,
    `clamp_min_vjp`, `clamp_max_vjp`): grouped 1x1 conv, channel shuffle, depthwise 3x3 conv,
    grouped 1x1 conv, residual; activations bounded by `clamp_min`/`clamp_max` (a ReLU6 spelled
    out)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, padding=1)
        self.squeeze = nn.Conv2d(12, 12, 1, groups=3)
        self.depthwise = nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.expand = nn.Conv2d(12, 12, 1, groups=3)
        self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.clamp_min(self.stem(x), 0.0)
        z = F.channel_shuffle(self.squeeze(y).clamp_max(1.5), 3)
        z = self.expand(torch.clamp_max(torch.clamp_min(self.depthwise(z), -0.25), 6.0))
        return self.head((y + z).mean((2, 3)))


def make_shuffle_unit() -> nn.Module:
    return ShuffleUnit()


def batch_shuffle_unit(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 3, 8, 8, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 5, (4,), generator=gen, dtype=torch.int64)


class CosineHead(nn.Module):
    """A prototype classifier through Thunder's torch fallback (`cosine_similarity_vjp`): the
    logits are the cosine similarities of each embedded row with 5 learned prototypes (both
    operands broadcast, `dim=-1`), scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.prototypes = nn.Parameter(torch.randn(5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x)).unsqueeze(1)
        return 4.0 * F.cosine_similarity(h, self.prototypes, dim=-1)


def make_cosine_head() -> nn.Module:
    return CosineHead()


def batch_cosine_head(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 6, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 5, (4,), generator=gen, dtype=torch.int64)


class Im2ColConv(nn.Module):
    """A convolution written as im2col, through Thunder's torch fallbacks (`unfold_vjp`,
    `fold_vjp`): `F.unfold` (3x3, padding 1, stride 2) of a 1x1 conv's output times a weight matrix, then the
    columns of a learned 2x2 kernel folded back (`F.fold`, overlapping windows summed)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 3, 1)
        self.weight = nn.Parameter(torch.randn(6, 3 * 9) * 0.2)
        self.spread = nn.Parameter(torch.randn(4 * 4, 6) * 0.3)
        self.head = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = F.unfold(self.stem(x), 3, padding=1, stride=2)
        y = torch.tanh(self.weight @ cols)
        z = F.fold(self.spread @ y, output_size=(8, 8), kernel_size=2, dilation=2, padding=1, stride=2)
        return self.head(z.flatten(1))


def make_im2col() -> nn.Module:
    return Im2ColConv()


def batch_im2col(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 3, 8, 8, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 5, (4,), generator=gen, dtype=torch.int64)


class PointwiseLosses(nn.Module):
    """Returns its own loss through Thunder's torch fallbacks for the pointwise losses (backward
    `binary_cross_entropy_with_logits_vjp`, `binary_cross_entropy_vjp`, `l1_loss_vjp`,
    `smooth_l1_loss_vjp`, `huber_loss_vjp`, `kl_div_vjp`): one shared Linear(6,8) + tanh, a
    Linear(8,4) head per loss against float targets that are data."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.heads = nn.ModuleList(nn.Linear(8, 4) for _ in range(6))

    def forward(self, x: torch.Tensor, p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        z = [head(h) for head in self.heads]
        return (
            F.binary_cross_entropy_with_logits(z[0], p)
            + F.binary_cross_entropy(torch.sigmoid(z[1]), p, reduction="sum") / 16.0
            + F.l1_loss(z[2], r)
            + F.smooth_l1_loss(z[3], r, beta=0.5)
            + F.huber_loss(z[4], r, reduction="sum", delta=0.5) / 16.0
            + F.kl_div(F.log_softmax(z[5], -1), F.softmax(r, -1), reduction="batchmean")
        )


def make_pointwise_losses() -> nn.Module:
    return PointwiseLosses()


def batch_pointwise_losses(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 6, generator=gen)
    p = torch.rand(4, 4, generator=gen)
    r = torch.randn(4, 4, generator=gen)
    return OrderedDict(x=x, p=p, r=r), torch.zeros(())


class SoftMaxNorm(nn.Module):
    """Thunder's torch fallbacks `logaddexp_vjp` and `hypot_vjp`: a smooth maximum
    (`torch.logaddexp`) of two Linear(6,8) branches and the length (`torch.hypot`) of a branch
    and a learned row (broadcast), Linear(8,5)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(6, 8)
        self.row = nn.Parameter(torch.randn(1, 8))
        self.out = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a(x), self.b(x)
        return self.out(torch.logaddexp(a, b) - torch.hypot(b, self.row))


def make_softmax_norm() -> nn.Module:
    return SoftMaxNorm()


def batch_softmax_norm(gen: torch.Generator) -> Batch:
    x = torch.randn(4, 6, generator=gen)
    return OrderedDict(x=x), torch.randint(0, 5, (4,), generator=gen, dtype=torch.int64)


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec(
            "nanogpt",
            make_nanogpt,
            batch_tokens,
            description="GPT from Thunder's test suite: vocab 128, block 16, 2 layers, 4 heads, n_embd 64, bias, dropout 0",
            notes=["`lm_head.weight` tied to `transformer.wte.weight`"],
        ),
        ModelSpec(
            "cnn",
            make_cnn,
            batch_cnn,
            description="Conv2d(3,8,3) + BatchNorm2d (training) + ReLU + MaxPool2d(2), twice, Linear(256,10)",
            notes=["BatchNorm running stats are buffers the forward updates"],
        ),
        ModelSpec(
            "mlp",
            make_mlp,
            batch_mlp,
            deterministic=False,
            description="Linear(32,64) + LayerNorm + SiLU + Dropout(0.1), twice, Linear(64,10)",
            notes=["dropout: not deterministic, eager and Thunder draw different masks"],
        ),
        ModelSpec(
            "mlp-frozen",
            make_mlp_frozen,
            batch_mlp,
            description="the MLP with Dropout(0.0) and `fc1`, `norm1` frozen (`requires_grad_(False)`)",
            notes=["frozen parameters: `check_tensor_metadata(..., False)`, no gradient"],
        ),
        ModelSpec(
            "llama",
            make_llama,
            batch_llama,
            description="litgpt GPT, Llama config: vocab 128, block 16, 2 layers, n_embd 64, 4 heads, 2 query groups, "
            "RMSNorm, RoPE, LLaMAMLP (SwiGLU, 128), no bias",
            notes=["RoPE `cos`/`sin` are buffers"],
        ),
        ModelSpec(
            "bert",
            make_bert,
            batch_bert,
            description="HF BertForSequenceClassification: vocab 128, hidden 64, 2 layers, 4 heads, intermediate 128, "
            "4 labels, dropout 0, `return_dict=False`",
            notes=["data `input_ids` and `attention_mask` (i64, row 1 padded); output is a tuple"],
        ),
        ModelSpec(
            "resnet",
            make_resnet,
            batch_resnet,
            description="a residual block (conv + BatchNorm + ReLU, twice, + skip) after a conv stem, global average pooling, Linear(8,10)",
            notes=["`AdaptiveAvgPool2d(1)`; BatchNorm running stats are buffers"],
        ),
        ModelSpec(
            "unused",
            make_unused,
            batch_unused,
            description="three residual blocks (skip Linear + projection branch Linear, ReLU, Linear), tanh, Linear(16,5); "
            "the last block's projection branch is never used",
            notes=["`blocks.2.fc.*` and `blocks.2.proj.*` get no gradient (None in eager PyTorch, none in Thunder's backward)"],
        ),
        ModelSpec(
            "regress-bf16",
            make_regress_bf16,
            batch_regress_bf16,
            loss="mse",
            description="bf16 Linear(16,32) + tanh GELU + Linear(32,8), MSE against bf16 targets",
            notes=["parameters, data and targets in bfloat16"],
        ),
        ModelSpec(
            "selfloss",
            make_selfloss,
            batch_selfloss,
            loss="output",
            description="Linear(16,32) + ReLU + Linear(32,5) returning its own cross-entropy (labels are data)",
            notes=["the forward's output is the loss; the targets tensor is unused"],
        ),
        ModelSpec(
            "vit",
            make_vit,
            batch_vit,
            description="HF ViTForImageClassification: 16x16 images, patch 4, hidden 64, 2 layers, 4 heads, 10 labels, dropout 0",
            notes=["patch embedding is a strided Conv2d; a CLS token is concatenated; `.logits` of a ModelOutput"],
        ),
        ModelSpec(
            "albert",
            make_albert,
            batch_text_cls,
            description="HF AlbertForSequenceClassification: vocab 128, embedding 32, hidden 64, 2 layers, 4 heads, 4 labels, dropout 0",
            notes=["one transformer layer's parameters shared by both layers (gradients add up)"],
        ),
        ModelSpec(
            "roberta",
            make_roberta,
            batch_text_cls,
            description="HF RobertaForSequenceClassification: vocab 128, hidden 64, 2 layers, 4 heads, 4 labels, dropout 0",
            notes=["position ids from `cumsum` of the padding mask, through `Tensor.int()` (a torch call Thunder prints as is)"],
        ),
        ModelSpec(
            "phi",
            make_phi,
            batch_llama,
            description="litgpt GPT, Phi-like config: vocab 128, block 16, 2 layers, n_embd 64, 4 heads, parallel residual, "
            "rotary on half the head, LayerNorm, GptNeoxMLP (tanh GELU), bias",
            notes=["RoPE `cos`/`sin` are buffers"],
        ),
        ModelSpec(
            "conv1d",
            make_conv1d,
            batch_ids_cls,
            description="Embedding(128,16), Conv1d(16,32,3), hardtanh, max_pool1d(2), LayerNorm, mean over time, Linear(32,4)",
            notes=["Thunder declares two views in its amax gradient as b8 (torch gives i64)"],
        ),
        ModelSpec(
            "convzoo",
            make_convzoo,
            batch_convzoo,
            description="Conv2d + BatchNorm2d + leaky_relu(0.1), avg_pool2d(2), strided Conv2d + GroupNorm(2) + elu, "
            "adaptive_avg_pool2d(3) of 3x3, Linear(72,10)",
            notes=["BatchNorm running stats are buffers the forward updates"],
        ),
        ModelSpec(
            "sdpa",
            make_sdpa,
            batch_sdpa,
            description="Embedding(128,32), one causal `F.scaled_dot_product_attention` layer (4 heads), Linear(32,128)",
            notes=["Thunder decomposes SDPA on the CPU"],
        ),
        ModelSpec(
            "unet",
            make_unet,
            batch_unet,
            description="U-Net, two levels: Conv2d + BatchNorm2d + ReLU encoders, max_pool2d(2), ConvTranspose2d(2, stride 2) "
            "decoders (the last without bias), skips by cat, 1x1 Conv2d head, spatial mean",
            notes=[
                "backward: `conv_transpose2d_vjp`, Thunder's torch-autograd fallback (nested `_` results)",
                "BatchNorm running stats are buffers the forward updates",
            ],
        ),
        ModelSpec(
            "espcn",
            make_espcn,
            batch_espcn,
            loss="mse",
            description="ESPCN super-resolution: Conv2d(1,16,5) + tanh + Conv2d(16,8,3) + tanh + Conv2d(8,4,3), "
            "PixelShuffle(2), MSE against 16x16 targets",
            notes=["backward: `pixel_shuffle_vjp`, Thunder's torch-autograd fallback"],
        ),
        ModelSpec(
            "shifted",
            make_shifted,
            batch_shifted,
            description="Swin-style: patch Conv2d(3,32,4,stride 4), cyclic shift by `torch.roll`, LayerNorm, attention "
            "masked by `torch.triu` of a mask built in the forward, shift rolled back, mean, Linear(32,10)",
            notes=["backward: `roll_vjp`, Thunder's torch-autograd fallback"],
        ),
        ModelSpec(
            "swin",
            make_swin,
            batch_swin,
            description="HF SwinForImageClassification: 32x32 images, patch 4, embed 16, depths [1, 1], heads [2, 2], "
            "window 4, 10 labels, dropout 0",
            notes=[
                "shifted windows by `torch.roll`, the window mask by `torch.where` of numbers, pooling by "
                "`nn.AdaptiveAvgPool1d` (backward: `roll_vjp`, `adaptive_avg_pool1d_vjp`)",
            ],
        ),
        ModelSpec(
            "mpnet",
            make_mpnet,
            batch_text_cls,
            description="HF MPNetForSequenceClassification: vocab 128, hidden 64, 2 layers, 4 heads, 4 labels, dropout 0",
            notes=["relative-position buckets: `torch.min` of i64 tensors and `torch.neg` of i64"],
        ),
        ModelSpec(
            "resnet-inplace",
            make_resnet_inplace,
            batch_resnet_inplace,
            description="torchvision-style ResNet in miniature: stem conv + BatchNorm2d + ReLU(inplace=True), "
            "max_pool2d(3,2,1), two BasicBlocks (`out += identity`, in-place ReLU; the second with a 1x1 "
            "downsample), global average pooling, Linear(16,10)",
            notes=[
                "in-place ops: `copy_` into activations, read on through `update_aliases`",
                "BatchNorm running stats are buffers the forward updates",
            ],
        ),
        ModelSpec(
            "encdec",
            make_encdec,
            batch_encdec,
            output=1,
            description="Embedding(32,16), encoder Linear(16,16) + tanh, decoder Linear(16,16) + ReLU + skip, "
            "Linear(16,32); returns (encoder state, logits), the loss on the logits",
            notes=["two model outputs: `\"output\": 1`; the backward takes a cotangent for each (zeros for the state)"],
        ),
        ModelSpec(
            "mha",
            make_mha,
            batch_mha,
            description="Embedding(64,32), two pre-norm blocks on nn.MultiheadAttention(32, 4 heads, batch_first; then 2 "
            "heads, sequence first, query the tokens, key/value the embeddings), GELU MLP, Linear(32,64)",
            notes=[
                "`torch.nn.functional.multi_head_attention_forward` through Thunder's torch fallback "
                "(backward: `multi_head_attention_forward_vjp`); attention weights returned and unused",
            ],
        ),
        ModelSpec(
            "slice-assign",
            make_slice_assign,
            batch_slice_assign,
            description="Linear(16,24), writes into its clone (slice, `...` column, index-tensor columns, bool mask) "
            "and into a fresh zeros buffer (slice, stepped slice, int row, `__setitem__`), Linear(32,10)",
            notes=["Python-level writes: `copy_with_setitem_impl` + `copy_`; backward `Tensor.__getitem__` by a tensor"],
        ),
        ModelSpec(
            "adaptive-max-pools",
            make_adaptive_max_pools,
            batch_adaptive_max_pools,
            description="Conv2d(3,4,3,pad 1) on 7x7, adaptive_max_pool2d to 3x5, adaptive_max_pool1d to 4 of the rows "
            "interleaved with their detached copies (ties everywhere), Linear(172,5)",
            notes=["torch fallbacks: backward `adaptive_max_pool2d_vjp`, `adaptive_max_pool1d_vjp`"],
        ),
        ModelSpec(
            "bilinear",
            make_bilinear,
            batch_bilinear,
            loss="mse",
            description="Linear(6,5), nn.Bilinear(5,6,4) of it and sin(x) on [3,4,*] inputs, tanh, Linear(4,5)",
            notes=["torch fallback: backward `bilinear_vjp` (both inputs, weight, bias)"],
        ),
        ModelSpec(
            "shuffle-unit",
            make_shuffle_unit,
            batch_shuffle_unit,
            description="ShuffleNet-style unit: Conv2d(3,12,3) + clamp_min(0), grouped 1x1 Conv2d(12,12,g=3) + "
            "clamp_max(1.5), channel_shuffle(3), depthwise 3x3 + clamp_min(-0.25) + clamp_max(6), grouped 1x1, "
            "residual, mean, Linear(12,5)",
            notes=["torch fallbacks: backward `channel_shuffle_vjp`, `clamp_min_vjp`, `clamp_max_vjp`"],
        ),
        ModelSpec(
            "cosine-head",
            make_cosine_head,
            batch_cosine_head,
            description="Linear(6,8) + tanh, logits 4 * cosine_similarity with 5 learned prototypes (broadcast, dim -1)",
            notes=["torch fallback: backward `cosine_similarity_vjp` (both operands, the prototypes' summed over the batch)"],
        ),
        ModelSpec(
            "logaddexp-hypot",
            make_softmax_norm,
            batch_softmax_norm,
            description="two Linear(6,8) branches, logaddexp of them minus hypot of one with a learned [1, 8] row, Linear(8,5)",
            notes=["torch fallbacks: backward `logaddexp_vjp`, `hypot_vjp` (the row's gradient summed over the batch)"],
        ),
        ModelSpec(
            "pointwise-losses",
            make_pointwise_losses,
            batch_pointwise_losses,
            loss="output",
            description="Linear(6,8) + tanh, six Linear(8,4) heads; returns BCE-with-logits + BCE (sum) + L1 + "
            "smooth L1 (beta 0.5) + Huber (delta 0.5, sum) + KL divergence (batchmean) against float data targets",
            notes=[
                "torch fallbacks: backward `binary_cross_entropy_with_logits_vjp`, `binary_cross_entropy_vjp`, "
                "`l1_loss_vjp`, `smooth_l1_loss_vjp`, `huber_loss_vjp`, `kl_div_vjp`; the output is the loss"
            ],
        ),
        ModelSpec(
            "im2col",
            make_im2col,
            batch_im2col,
            description="1x1 Conv2d(3,3), F.unfold(3x3, pad 1, stride 2) of 8x8, matmul + tanh, matmul, F.fold to 8x8 (2x2 kernel, "
            "dilation 2, pad 1, stride 2: overlapping), Linear(256,5)",
            notes=["torch fallbacks: backward `unfold_vjp`, `fold_vjp`"],
        ),
        ModelSpec(
            "loss-zoo",
            LossZoo,
            batch_loss_zoo,
            loss="output",
            description="Linear(8,5) of the input plus a mean-pooled Embedding(20,8) bag; returns kl_div + smooth_l1 + "
            "BCE-with-logits + cross_entropy + huber (Thunder keeps each as one symbol)",
            notes=[
                "the model returns its own loss (`\"loss\": \"output\"`)",
                "the loss sum is continued over lines with `\\`, which Thunder copies into a source comment",
            ],
        ),
        ModelSpec(
            "op-zoo",
            make_op_zoo,
            batch_op_zoo,
            description="Linear(8,8), then cumsum, roll, std, logsumexp, addcmul, atan2, Conv1d(6,6,3), Conv3d(1,2,3), "
            "baddbmm, max + gather, repeat_interleave, prod, clamp between tensors, avg_pool1d, topk, sort; Linear(8,5)",
        ),
        ModelSpec(
            "gemma2",
            make_gemma2,
            batch_gemma2,
            description="litgpt Gemma-2 style: vocab 64, 2 layers, n_embd 32, 4 heads of 8, 2 query groups, RMSNorm "
            "(unit offset), GeGLU (tanh), scaled embeddings, post-attention and post-MLP norms, attention and final "
            "logit softcapping, a sliding window of 4 on layer 0",
        ),
        ModelSpec(
            "convnext",
            make_convnext,
            batch_image16,
            description="ConvNeXt block: Conv2d(3,16,4,stride 4), channels-last LayerNorm, depthwise Conv2d(16,16,7), "
            "LayerNorm, Linear(16,64), GELU, Linear(64,16), layer scale, residual, mean, Linear(16,10)",
        ),
        ModelSpec(
            "gpt2",
            make_gpt2,
            batch_hf_lm,
            description="HF GPT2LMHeadModel, 2 layers, n_embd 32, 4 heads, vocab 96: `Conv1D` layers as `torch.addmm`, "
            "causal and padding masks through `torch.diff` and `Tensor.new_ones`",
            notes=["masks built by broadcasting instead of torch.vmap, which Thunder cannot trace"],
        ),
        ModelSpec(
            "gptj",
            make_gptj,
            batch_hf_lm,
            description="HF GPTJForCausalLM, 2 layers, n_embd 32, rotary dim 4: its rotary table `embed_positions` and "
            "`scale_attn` are plain tensor attributes (neither parameters nor buffers), saved as constants",
            notes=["masks built by broadcasting instead of torch.vmap, which Thunder cannot trace"],
        ),
        ModelSpec(
            "t5",
            make_t5,
            batch_t5,
            description="HF T5ForConditionalGeneration, 2 + 2 layers, d_model 32: relative position buckets, T5 "
            "LayerNorm (RMS), the shared embedding tied to the encoder's and decoder's",
        ),
        ModelSpec(
            "convnextv2",
            make_convnextv2,
            batch_image32,
            description="HF ConvNextV2ForImageClassification, two stages of 8 and 16 channels: global response "
            "normalization through `torch.linalg.vector_norm`",
        ),
        ModelSpec(
            "densenet",
            make_densenet,
            batch_image16,
            description="Conv2d(3,4,3), three BatchNorm + ReLU + Conv2d layers each on the cat of all earlier maps, "
            "avg_pool2d(2), nearest interpolate x2, amax over space, Linear(16,10)",
            notes=["BatchNorm running stats are buffers the forward updates"],
        ),
    ]
}
