"""More HF architectures than the corpus holds, exported to check tracepass on models it has
not seen (a sweep, not part of the corpus or CI):

    python -m tracepass.export.hf_zoo --out target/hf-zoo [--models gpt2,t5]
    tracepass verify target/hf-zoo/<model>                      # each export that Thunder jits
    TRACEPASS_CORPUS_DIR=target/hf-zoo cargo test --release -p tracepass-runtime \\
        --test models_train step0                              # losses and gradients vs eager

Tiny random configs (no downloads), eager attention, no KV cache, and transformers 4.57's
vmapped masks built by broadcasting instead (`models._hf_masks_by_broadcasting`). Each model is
exported in a process of its own: a failed Thunder trace can leave torch's vmap state broken for
the next. One JSON line per model: Thunder's and eager's loss, or the exporter's error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import OrderedDict

import torch
import torch.nn as nn

from .models import (
    HF_SEQ,
    HF_VOCAB,
    Logits,
    Seq2SeqLogits,
    _hf_masks_by_broadcasting,
    batch_hf_lm,
    batch_image32,
    batch_t5,
)

V, T = HF_VOCAB, HF_SEQ


def _eager_configs(tf) -> None:
    """Every config built from here on asks for eager attention and no KV cache."""
    if getattr(tf.PretrainedConfig.__init__, "_tracepass", False):
        return
    orig = tf.PretrainedConfig.__init__

    def init(self, *a, **k):
        k.setdefault("attn_implementation", "eager")
        k.setdefault("use_cache", False)
        orig(self, *a, **k)

    init._tracepass = True
    tf.PretrainedConfig.__init__ = init


def cls_batch(gen):
    ids = torch.randint(0, V, (2, T), generator=gen)
    m = torch.ones(2, T, dtype=torch.int64)
    m[1, T - 4 :] = 0
    return OrderedDict(input_ids=ids, attention_mask=m), torch.randint(0, 3, (2,), generator=gen)


# the corpus's HF batches: token ids of HF_VOCAB x HF_SEQ, 3-class 32x32 images, a decoder half
lm_batch, img_batch, seq2seq_batch = batch_hf_lm, batch_image32, batch_t5
Seq2Seq = Seq2SeqLogits


def small(**kw):
    return {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **kw}


def make(name: str):
    import transformers as tf

    _eager_configs(tf)
    _hf_masks_by_broadcasting()
    if name == "gpt2":
        return Logits(tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))), lm_batch
    if name == "gptneox":
        return Logits(tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32, rotary_pct=0.5))), lm_batch
    if name == "opt":
        return Logits(tf.OPTForCausalLM(tf.OPTConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4, max_position_embeddings=32, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0))), lm_batch
    if name == "bloom":
        return Logits(tf.BloomForCausalLM(tf.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0, attention_dropout=0.0))), lm_batch
    if name == "falcon":
        return Logits(tf.FalconForCausalLM(tf.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False, hidden_dropout=0.0, attention_dropout=0.0))), lm_batch
    if name == "mistral":
        return Logits(tf.MistralForCausalLM(tf.MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, sliding_window=8))), lm_batch
    if name == "qwen2":
        return Logits(tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))), lm_batch
    if name == "mixtral":
        return Logits(tf.MixtralForCausalLM(tf.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2))), lm_batch
    if name == "gptj":
        return Logits(tf.GPTJForCausalLM(tf.GPTJConfig(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))), lm_batch
    if name == "distilbert":
        return Logits(tf.DistilBertForSequenceClassification(tf.DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32, num_labels=3, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0))), cls_batch
    if name == "electra":
        return Logits(tf.ElectraForSequenceClassification(tf.ElectraConfig(**small(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32, num_labels=3)))), cls_batch
    if name == "deberta":
        return Logits(tf.DebertaV2ForSequenceClassification(tf.DebertaV2Config(**small(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32, num_labels=3, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"])))), cls_batch
    if name == "t5":
        return Seq2Seq(tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0, decoder_start_token_id=0))), seq2seq_batch
    if name == "bart":
        return Seq2Seq(tf.BartForConditionalGeneration(tf.BartConfig(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))), seq2seq_batch
    if name == "mobilenetv2":
        return Logits(tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=3, classifier_dropout_prob=0.0))), img_batch
    if name == "convnextv2":
        return Logits(tf.ConvNextV2ForImageClassification(tf.ConvNextV2Config(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32, num_labels=3))), img_batch
    if name == "segformer":
        return Logits(tf.SegformerForImageClassification(tf.SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0, classifier_dropout_prob=0.0))), img_batch
    if name == "regnet":
        return Logits(tf.RegNetForImageClassification(tf.RegNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=4, num_labels=3))), img_batch
    if name == "efficientnet":
        return Logits(tf.EfficientNetForImageClassification(tf.EfficientNetConfig(image_size=32, width_coefficient=0.1, depth_coefficient=0.1, num_labels=3, dropout_rate=0.0, drop_connect_rate=0.0))), img_batch
    if name == "poolformer":
        return Logits(tf.PoolFormerForImageClassification(tf.PoolFormerConfig(num_channels=3, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], num_labels=3, drop_path_rate=0.0))), img_batch
    if name == "levit":
        return Logits(tf.LevitForImageClassification(tf.LevitConfig(image_size=32, hidden_sizes=[16, 24, 32], num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=3))), img_batch
    if name == "dinov2":
        return Logits(tf.Dinov2ForImageClassification(tf.Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, num_labels=3, layerscale_value=0.5))), img_batch
    if name == "squeezebert":
        return Logits(tf.SqueezeBertForSequenceClassification(tf.SqueezeBertConfig(vocab_size=V, hidden_size=32, embedding_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32, num_labels=3, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2, intermediate_groups=2, output_groups=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))), cls_batch
    if name == "funnel":
        return Logits(tf.FunnelForSequenceClassification(tf.FunnelConfig(vocab_size=V, block_sizes=[1, 1], d_model=32, n_head=4, d_head=8, d_inner=64, num_labels=3, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))), cls_batch
    if name == "mobilebert":
        return Logits(tf.MobileBertForSequenceClassification(tf.MobileBertConfig(vocab_size=V, hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32, intra_bottleneck_size=16, max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))), cls_batch
    if name in CAUSAL:
        cfg, model, extra = CAUSAL[name]
        base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=32)
        return Logits(getattr(tf, model)(getattr(tf, cfg)(**{**base, **extra}))), lm_batch
    if name in ENCODERS:
        cfg, model, extra = ENCODERS[name]
        base = small(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=40, num_labels=3)
        return Logits(getattr(tf, model)(getattr(tf, cfg)(**{**base, **extra}))), cls_batch
    if name in VISION:
        cfg, model, extra = VISION[name]
        return Logits(getattr(tf, model)(getattr(tf, cfg)(num_labels=3, **extra))), img_batch
    raise KeyError(name)


# decoder LMs built from a shared small config: (config class, model class, overrides)
CAUSAL = {
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, n_positions=32, rotary_dim=4, n_ctx=32)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(n_embd=32, n_layer=2, n_head=4, n_positions=32, multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4, embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, pad_token_id=0)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(num_key_value_heads=2, partial_rotary_factor=0.5)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(num_key_value_heads=2, pad_token_id=0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=2, head_dim=8)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(num_key_value_heads=2)),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", dict()),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(num_key_value_heads=2, pad_token_id=0)),
    "mpt": ("MptConfig", "MptForCausalLM", dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=32)),
    "xglm": ("XGLMConfig", "XGLMForCausalLM", dict(d_model=32, ffn_dim=64, num_layers=2, attention_heads=4, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)),
    "biogpt": ("BioGptConfig", "BioGptForCausalLM", small()),
    "ctrl": ("CTRLConfig", "CTRLLMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, dff=64, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0)),
}

# encoders with a sequence-classification head: (config class, model class, overrides)
ENCODERS = {
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification", dict(pad_token_id=1)),
    "roformer": ("RoFormerConfig", "RoFormerForSequenceClassification", dict(embedding_size=32)),
    "megatron_bert": ("MegatronBertConfig", "MegatronBertForSequenceClassification", dict()),
    "nystromformer": ("NystromformerConfig", "NystromformerForSequenceClassification", dict(num_landmarks=4, segment_means_seq_len=12)),
    "canine": ("CanineConfig", "CanineForSequenceClassification", dict(downsampling_rate=2, num_hash_buckets=64, local_transformer_stride=4)),
    "ibert": ("IBertConfig", "IBertForSequenceClassification", dict(quant_mode=False)),
    "data2vec_text": ("Data2VecTextConfig", "Data2VecTextForSequenceClassification", dict()),
    "layoutlm": ("LayoutLMConfig", "LayoutLMForSequenceClassification", dict()),
}

# image classifiers on 32x32 inputs: (config class, model class, overrides)
VISION = {
    "beit": ("BeitConfig", "BeitForImageClassification", dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, use_relative_position_bias=True)),
    "deit": ("DeiTConfig", "DeiTForImageClassification", dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)),
    "swinv2": ("Swinv2Config", "Swinv2ForImageClassification", dict(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4, drop_path_rate=0.0)),
    "mobilevit": ("MobileViTConfig", "MobileViTForImageClassification", dict(image_size=32, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32], num_attention_heads=2)),
    "bit": ("BitConfig", "BitForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck", global_padding="SAME")),
    "resnet_hf": ("ResNetConfig", "ResNetForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)),
    "vit_hybrid": ("ViTHybridConfig", "ViTHybridForImageClassification", dict(image_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)),
    "efficientformer": ("EfficientFormerConfig", "EfficientFormerForImageClassification", dict(image_size=32, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], num_meta3d_blocks=1, dim=32, key_dim=8, attention_ratio=2, resolution=2)),
    "cvt": ("CvtConfig", "CvtForImageClassification", dict(embed_dim=[8, 16], num_heads=[1, 2], depth=[1, 1], patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], mlp_ratio=[2.0, 2.0], attention_drop_rate=[0.0, 0.0], drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0], qkv_bias=[True, True], cls_token=[False, True], qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3], padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1])),
}


def build(name: str) -> nn.Module:
    m = make(name)[0]
    inner = getattr(m, "m", None)
    if inner is not None and hasattr(inner, "config"):
        inner.config.use_cache = False
    return m


NAMES = [
    "gpt2", "gptneox", "opt", "bloom", "falcon", "mistral", "qwen2", "mixtral", "gptj", "distilbert", "electra",
    "deberta", "t5", "bart", "mobilenetv2", "convnextv2", "segformer", "regnet", "efficientnet", "poolformer",
    "levit", "dinov2", "squeezebert", "funnel", "mobilebert",
]
NAMES += [*CAUSAL, *ENCODERS, *VISION]


def export_one(name: str, out: str) -> dict:
    from .exporter import export

    try:
        _, batch = make(name)
        s = export(lambda: build(name), batch, "cross_entropy", f"{out}/{name}", name=name, steps=2, ranks=2)
        return {"model": name, "eager": s["eager_loss"], "thunder": s["thunder_loss"], "grad_err": s["grad_max_rel_err"]}
    except Exception as e:  # noqa: BLE001 - the error is the datum
        return {"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracepass.export.hf_zoo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for one export per model")
    ap.add_argument("--models", help=f"comma separated (default: all of {', '.join(NAMES)})")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(export_one(a.one, a.out)), flush=True)
        return 0
    names = a.models.split(",") if a.models else NAMES
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(NAMES)}")
    for n in names:
        r = subprocess.run(
            [sys.executable, "-m", "tracepass.export.hf_zoo", "--out", a.out, "--one", n],
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        print(lines[-1] if lines else json.dumps({"model": n, "error": r.stderr.strip()[-300:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
