"""memwarden's GGUF estimate against the real llama.cpp (issue 42).

Tiny transformers VLMs with random weights are saved with ``save_pretrained``, converted to a GGUF
and an mmproj GGUF by llama.cpp's own ``convert_hf_to_gguf.py`` (from the llama-cpp-python sdist,
which vendors llama.cpp), run once by ``llama-mtmd-cli`` with an image, and the buffer sizes it logs
are put beside ``memwarden estimate``'s for the same flags. Without the built binary it still
converts and times the estimate.

    nice -n 15 .venv/bin/python benchmarks/bench_gguf_estimate.py \\
        --llama-cpp .cache/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        --bin .cache/llama.cpp-build/bin [--out .cache/gguf-bench] [--families qwen2vl,gemma3]

The tokenizer is a tiny byte-level BPE trained here; the converter identifies BPE pre-tokenizers by
a hash of known models' output, so the run tells it "qwen2" (tokenization plays no part in memory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VOCAB = 8192  # the config's vocabulary; the converter pads the tokenizer's up to it
MiB = 1024 * 1024


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["a picture of a cat on a mat", "describe the image in one word", "the quick brown fox"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)


def _text(**kw: Any) -> dict[str, Any]:
    return dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        **kw,
    )


def make_model(family: str, out: Path) -> Path:
    """A tiny random-weight VLM of ``family`` saved with save_pretrained (and a tokenizer)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if family == "qwen2vl":
        cfg = tf.Qwen2VLConfig(
            text_config=_text(rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [4, 6, 6]}),
            vision_config=dict(
                depth=3,
                embed_dim=32,
                num_heads=2,
                hidden_size=64,
                patch_size=14,
                spatial_merge_size=2,
                mlp_ratio=2,
                in_channels=3,
                temporal_patch_size=2,
            ),
        )
        model = tf.Qwen2VLForConditionalGeneration(cfg)
    elif family == "gemma3":
        cfg = tf.Gemma3Config(
            text_config=_text(
                head_dim=32, sliding_window=512, query_pre_attn_scalar=32, layer_types=None, num_hidden_layers=7
            ),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=896,
                patch_size=14,
            ),
            mm_tokens_per_image=256,
        )
        model = tf.Gemma3ForConditionalGeneration(cfg)
    elif family == "smolvlm":
        cfg = tf.Idefics3Config(
            text_config=dict(model_type="llama", **_text()),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=512,
                patch_size=16,
            ),
            scale_factor=4,
        )
        model = tf.Idefics3ForConditionalGeneration(cfg)
    elif family == "llava":
        cfg = tf.LlavaConfig(
            text_config=dict(model_type="llama", **_text()),
            vision_config=dict(
                model_type="clip_vision_model",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=336,
                patch_size=14,
                projection_dim=64,
            ),
        )
        model = tf.LlavaForConditionalGeneration(cfg)
    else:
        raise SystemExit(f"unknown family {family}")
    folder = out / f"hf-{family}"
    model.save_pretrained(folder)
    _tokenizer(folder)
    if family == "smolvlm":  # the converter reads the processor's longest edge
        (folder / "preprocessor_config.json").write_text(
            json.dumps(
                {
                    "size": {"longest_edge": 1536},
                    "max_image_size": {"longest_edge": 512},
                    "image_mean": [0.5] * 3,
                    "image_std": [0.5] * 3,
                }
            )
        )
    else:
        (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return folder


_CONVERT = """
import sys, runpy
sys.path.insert(0, {root!r})
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
def _no_sentencepiece(self, *a, **k):  # no tokenizer.model here: the converters fall back to the BPE vocab
    raise FileNotFoundError("tokenizer.model")
base.TextModel._set_vocab_sentencepiece = _no_sentencepiece
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def convert(llama_cpp: Path, folder: Path, outtype: str, mmproj: bool) -> Path:
    out = folder.parent / f"{folder.name}-{'mmproj-' if mmproj else ''}{outtype}.gguf"
    if not out.exists():
        argv = ["convert_hf_to_gguf.py", str(folder), "--outtype", outtype, "--outfile", str(out)]
        if mmproj:
            argv.append("--mmproj")
        code = _CONVERT.format(root=str(llama_cpp), argv=argv, script=str(llama_cpp / "convert_hf_to_gguf.py"))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"convert {folder.name} failed:\n{proc.stderr[-2000:]}")
    return out


def run_mtmd(binary: Path, model: Path, mmproj: Path, image: Path, ctx: int, ctk: str, ctv: str) -> dict[str, Any]:
    """One llama-mtmd-cli run; the buffer sizes it logs (MiB, two decimals) and the image tokens."""
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--mmproj",
        str(mmproj),
        "--image",
        str(image),
        "-p",
        "describe",
        "-n",
        "4",
        "-c",
        str(ctx),
        "-ctk",
        ctk,
        "-ctv",
        ctv,
        "-t",
        "2",
        "--temp",
        "0",
        "-ngl",
        "0",
        "-lv",
        "4",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    mib = lambda pattern: sum(float(v) for v in re.findall(pattern + r"\s*=\s*([\d.]+) MiB", log))  # noqa: E731
    tokens = re.findall(r"n_tokens_batch = (\d+)", log) or re.findall(r"image slice.*?(\d+) tokens", log)
    return {
        "rc": proc.returncode,
        "model_buffer_bytes": round(mib(r"CPU_Mapped model buffer size") * MiB),
        "kv_buffer_bytes": round(mib(r"llama_kv_cache:\s+CPU KV buffer size") * MiB),
        "compute_buffer_bytes": round(mib(r"sched_reserve:\s+CPU compute buffer size") * MiB),
        "mmproj_buffer_bytes": round(mib(r"clip_model_loader: model size:\s") * MiB) if "model size" in log else 0,
        "mmproj_compute_bytes": round(mib(r"(?:warmup|reserve_compute_meta):\s+CPU compute buffer size") * MiB),
        "image_tokens": sum(int(t) for t in tokens),
        "command": " ".join(cmd),
        "log_tail": log[-1500:] if proc.returncode else "",
    }


def _image(path: Path, w: int, h: int) -> Path:
    from PIL import Image

    if not path.exists():
        Image.new("RGB", (w, h), (120, 90, 60)).save(path)
    return path


KEYS = (
    "model_buffer_bytes",
    "kv_buffer_bytes",
    "compute_buffer_bytes",
    "mmproj_buffer_bytes",
    "mmproj_compute_bytes",
    "image_tokens",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, default=Path(".cache/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    ap.add_argument("--bin", type=Path, default=Path(".cache/llama.cpp-build/bin"))
    ap.add_argument("--out", type=Path, default=Path(".cache/gguf-bench"))
    ap.add_argument("--families", default="qwen2vl,gemma3,smolvlm,llava")
    ap.add_argument("--images", default="640x480,1280x960")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--cache-types", default="f16,q8_0")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args()
    from memwarden.estimation.gguf.estimate import estimate_gguf

    args.out.mkdir(parents=True, exist_ok=True)
    binary = args.bin / "llama-mtmd-cli"
    rows = []
    for family in args.families.split(","):
        folder = args.out / f"hf-{family}"
        if not folder.exists():
            make_model(family, args.out)
        model = convert(args.llama_cpp, folder, "f16", mmproj=False)
        mmproj = convert(args.llama_cpp, folder, "f16", mmproj=True)
        for size in args.images.split(","):
            w, h = (int(v) for v in size.split("x"))
            image = _image(args.out / f"img-{w}x{h}.png", w, h)
            for ctx in (int(c) for c in args.contexts.split(",")):
                for ct in args.cache_types.split(","):
                    start = time.perf_counter()
                    est = estimate_gguf(
                        str(model),
                        mmproj_path=str(mmproj),
                        images=((w, h),),
                        n_ctx=ctx,
                        cache_type_k=ct,
                        cache_type_v=ct,
                    )
                    seconds = time.perf_counter() - start
                    ours = {k: est.to_json()["llama_cpp"][k] for k in KEYS}
                    real = run_mtmd(binary, model, mmproj, image, ctx, ct, ct) if binary.exists() else None
                    row = {
                        "family": family,
                        "image": size,
                        "ctx": ctx,
                        "cache": ct,
                        "estimate_s": round(seconds, 4),
                        "memwarden": ours,
                        "llama_cpp": real,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
