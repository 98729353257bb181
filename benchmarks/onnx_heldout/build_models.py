"""Held-out ONNX models from tiny random-weight transformers configs (no downloads)."""

import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers as tf

warnings.filterwarnings("ignore")
torch.manual_seed(0)
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/onnx_heldout/models")
OUT.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)


class Wrap(torch.nn.Module):
    def __init__(self, m, key, out="logits"):
        super().__init__()
        self.m, self.key, self.out = m, key, out

    def forward(self, *args):
        r = self.m(**dict(zip(self.key, args, strict=False)))
        return getattr(r, self.out) if isinstance(self.out, str) else tuple(getattr(r, o) for o in self.out)


def export(name, model, feeds, dyn, outs=("logits",), opset=17, external=False, dynamo=False):
    model.eval()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    wrap = Wrap(model, list(feeds), outs[0] if len(outs) == 1 else outs)
    path = OUT / f"{name}.onnx"
    kw = dict(input_names=list(feeds), output_names=list(outs), opset_version=opset, dynamic_axes=dyn)
    with torch.no_grad():
        if dynamo:
            torch.onnx.export(wrap, args, str(path), dynamo=True, **kw)
        else:
            torch.onnx.export(wrap, args, str(path), dynamo=False, **kw)
    if external:
        import onnx

        m = onnx.load(str(path))
        path.unlink()
        onnx.save(
            m,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{name}.onnx.data",
            size_threshold=0,
        )
    np.savez(OUT / f"{name}.npz", **feeds)
    print("built", name, path.stat().st_size)


which = set(sys.argv[2:])


def want(n):
    return not which or n in which


if want("vit"):
    cfg = tf.ViTConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        image_size=224,
        patch_size=16,
        num_labels=10,
    )
    export(
        "vit",
        tf.ViTForImageClassification(cfg),
        {"pixel_values": rng.standard_normal((4, 3, 224, 224), dtype=np.float32)},
        {"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )
if want("whisper"):
    cfg = tf.WhisperConfig(
        d_model=128,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=512,
        decoder_ffn_dim=512,
        num_mel_bins=80,
        max_source_positions=1500,
    )
    enc = tf.WhisperModel(cfg).get_encoder()
    export(
        "whisper_enc",
        enc,
        {"input_features": rng.standard_normal((2, 80, 3000), dtype=np.float32)},
        {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}},
        outs=("last_hidden_state",),
    )
if want("gpt2"):
    cfg = tf.GPT2Config(
        n_embd=128, n_layer=2, n_head=4, vocab_size=8000, n_positions=512, use_cache=False, attn_implementation="eager"
    )
    export(
        "gpt2",
        tf.GPT2LMHeadModel(cfg),
        {
            "input_ids": rng.integers(0, 8000, (2, 256), dtype=np.int64),
            "attention_mask": np.ones((2, 256), dtype=np.int64),
        },
        {
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"},
        },
        opset=18,
    )
if want("clip"):
    cfg = tf.CLIPConfig(
        text_config=dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=256,
            vocab_size=1000,
            max_position_embeddings=77,
        ),
        vision_config=dict(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=512,
            image_size=224,
            patch_size=16,
        ),
        projection_dim=64,
    )
    export(
        "clip",
        tf.CLIPModel(cfg),
        {
            "input_ids": rng.integers(0, 1000, (4, 77), dtype=np.int64),
            "pixel_values": rng.standard_normal((4, 3, 224, 224), dtype=np.float32),
            "attention_mask": np.ones((4, 77), dtype=np.int64),
        },
        {
            "input_ids": {0: "text_batch", 1: "seq"},
            "attention_mask": {0: "text_batch", 1: "seq"},
            "pixel_values": {0: "image_batch"},
        },
        outs=("logits_per_image", "logits_per_text"),
    )
if want("resnet"):
    cfg = tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], num_labels=10)
    export(
        "resnet",
        tf.ResNetForImageClassification(cfg),
        {"pixel_values": rng.standard_normal((4, 3, 224, 224), dtype=np.float32)},
        {"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )
if want("mobilenet"):
    cfg = tf.MobileNetV2Config(depth_multiplier=0.35, num_labels=10, image_size=224)
    export(
        "mobilenet_v2",
        tf.MobileNetV2ForImageClassification(cfg),
        {"pixel_values": rng.standard_normal((4, 3, 224, 224), dtype=np.float32)},
        {"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )
if want("bert"):
    cfg = tf.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=2000
    )
    export(
        "bert",
        tf.BertModel(cfg),
        {
            "input_ids": rng.integers(0, 2000, (4, 256), dtype=np.int64),
            "attention_mask": np.ones((4, 256), dtype=np.int64),
        },
        {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        outs=("last_hidden_state",),
    )
if want("llama_ext"):
    cfg = tf.LlamaConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        vocab_size=4000,
        max_position_embeddings=512,
        use_cache=False,
        attn_implementation="eager",
    )
    export(
        "llama_ext",
        tf.LlamaForCausalLM(cfg),
        {
            "input_ids": rng.integers(0, 4000, (2, 256), dtype=np.int64),
            "attention_mask": np.ones((2, 256), dtype=np.int64),
        },
        {
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"},
        },
        external=True,
    )
if want("bert_fp16"):
    cfg = tf.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=2000
    )
    export(
        "bert_fp16",
        tf.BertModel(cfg).half(),
        {
            "input_ids": rng.integers(0, 2000, (4, 256), dtype=np.int64),
            "attention_mask": np.ones((4, 256), dtype=np.int64),
        },
        {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        outs=("last_hidden_state",),
    )
if want("t5"):
    cfg = tf.T5Config(d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4, vocab_size=2000)
    export(
        "t5_enc",
        tf.T5EncoderModel(cfg),
        {"input_ids": rng.integers(0, 2000, (4, 256), dtype=np.int64)},
        {"input_ids": {0: "batch", 1: "seq"}},
        outs=("last_hidden_state",),
    )
if want("resnet_fp16"):
    cfg = tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], num_labels=10)
    export(
        "resnet_fp16",
        tf.ResNetForImageClassification(cfg).half(),
        {"pixel_values": rng.standard_normal((4, 3, 224, 224)).astype(np.float16)},
        {"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )
if want("vit_fp16"):
    cfg = tf.ViTConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        image_size=224,
        patch_size=16,
        num_labels=10,
    )
    export(
        "vit_fp16",
        tf.ViTForImageClassification(cfg).half(),
        {"pixel_values": rng.standard_normal((4, 3, 224, 224)).astype(np.float16)},
        {"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )
