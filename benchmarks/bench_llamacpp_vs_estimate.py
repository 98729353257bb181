"""memwarden's GGUF estimate held against the real ``llama-mtmd-cli`` (issue 42), as a markdown table.

Tiny random-weight transformers VLMs of five families are saved with ``save_pretrained``, converted
to a language-model GGUF and an mmproj GGUF by llama.cpp's own ``convert_hf_to_gguf.py`` (vendored
by the llama-cpp-python sdist), run once by ``llama-mtmd-cli`` per setting (image size x context x
KV cache type), and every buffer size the binary logs is put beside ``memwarden estimate``'s figure
for the same flags, with the ratio. The process's resident peak (``/usr/bin/time -v``, less the
binary's own baseline from ``--version``) is put beside ``peak_bytes``.

    nice -n 10 .venv/bin/python benchmarks/bench_llamacpp_vs_estimate.py \\
        --bin .cache/llama.cpp-build/bin/llama-mtmd-cli \\
        --llama-cpp .cache/llama_cpp_python-0.3.36/vendor/llama.cpp [--out .cache/llamacpp-acc]

``--bin`` may also come from ``$LLAMA_MTMD_CLI``; without the binary the script says so and exits 0.
The tokenizer is a tiny byte-level BPE trained here (nothing is downloaded); the converter knows BPE
pre-tokenizers by a hash of real models' output, so the run tells it "qwen2" — tokenization plays no
part in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

VOCAB = 8192  # the config's vocabulary; the converter pads the tokenizer's up to it
MiB = 1024 * 1024
FAMILIES = ("qwen2vl", "qwen25vl", "gemma3", "smolvlm", "llava")
# (llama.cpp log pattern, memwarden's llama_cpp key): each figure llama.cpp prints in MiB
FIGURES = (
    (r"load_tensors:\s+CPU_Mapped model buffer size\s*=\s*([\d.]+) MiB", "model_buffer_bytes"),
    (r"llama_kv_cache:\s+CPU KV buffer size\s*=\s*([\d.]+) MiB", "kv_buffer_bytes"),
    (r"sched_reserve:\s+CPU compute buffer size\s*=\s*([\d.]+) MiB", "compute_buffer_bytes"),
    (r"load_hparams: model size:\s+([\d.]+) MiB", "mmproj_buffer_bytes"),
    (r"(?:warmup|reserve_compute_meta):\s+CPU compute buffer size\s*=\s*([\d.]+) MiB", "mmproj_compute_bytes"),
)


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["a picture of a cat on a mat", "describe the image in one word", "the quick brown fox"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
    # fill the vocabulary up to the config's: the Gemma 3 converter cuts token_embd to the
    # tokenizer's size (conversion/gemma.py "remove OOV rows"), which llama.cpp then refuses
    tok.add_tokens([f"<extra_{i}>" for i in range(VOCAB - tok.get_vocab_size(with_added_tokens=True))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)


def _text(**kw: Any) -> dict[str, Any]:
    """A 2-layer decoder; head size 64 so that a quantized cache takes llama.cpp's Hadamard rotation
    (llama-kv-cache.cpp: attn_rot_k needs n_embd_head_k % 64 == 0), as real models do."""
    base: dict[str, Any] = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
    )
    base.update(kw)
    return base


def make_model(family: str, out: Path) -> Path:
    """A tiny random-weight VLM of ``family`` saved with save_pretrained, with a tokenizer."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    mrope = {"type": "mrope", "rope_type": "default", "mrope_section": [8, 12, 12]}
    if family == "qwen2vl":
        vision: dict[str, Any] = dict(depth=3, embed_dim=64, num_heads=2, hidden_size=128, patch_size=14)
        vision.update(spatial_merge_size=2, mlp_ratio=2, in_channels=3, temporal_patch_size=2)
        model: Any = tf.Qwen2VLForConditionalGeneration(
            tf.Qwen2VLConfig(text_config=_text(rope_scaling=mrope), vision_config=vision)
        )
    elif family == "qwen25vl":
        vision = dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128)
        vision.update(patch_size=14, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1, 3])
        model = tf.Qwen2_5_VLForConditionalGeneration(
            tf.Qwen2_5_VLConfig(text_config=_text(rope_scaling=mrope), vision_config=vision)
        )
    elif family == "gemma3":
        text = _text(head_dim=64, sliding_window=512, query_pre_attn_scalar=64, layer_types=None, num_hidden_layers=7)
        vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
        vision.update(image_size=896, patch_size=14)
        model = tf.Gemma3ForConditionalGeneration(
            tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=256)
        )
    elif family == "smolvlm":
        vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
        vision.update(image_size=512, patch_size=16)
        model = tf.Idefics3ForConditionalGeneration(
            tf.Idefics3Config(
                text_config=_text(model_type="llama", architectures=["LlamaForCausalLM"]),
                vision_config=vision,
                scale_factor=4,
            )
        )
    elif family == "llava":
        vision = dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        vision.update(num_attention_heads=2, image_size=336, patch_size=14, projection_dim=128)
        model = tf.LlavaForConditionalGeneration(
            tf.LlavaConfig(text_config=dict(model_type="llama", **_text()), vision_config=vision)
        )
    else:
        raise SystemExit(f"unknown family {family} (known: {', '.join(FAMILIES)})")
    folder = out / f"hf-{family}"
    model.save_pretrained(folder)
    _tokenizer(folder)
    processor: dict[str, Any] = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    if family == "smolvlm":  # the converter reads the processor's longest edge (preproc_image_size)
        processor.update(size={"longest_edge": 1536}, max_image_size={"longest_edge": 512})
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


_CONVERT = """
import sys, runpy
sys.path.insert(0, {root!r})
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
def _no_sentencepiece(self, *a, **k):  # no tokenizer.model here: the converters fall back to the BPE vocab
    raise FileNotFoundError("tokenizer.model")
base.TextModel._set_vocab_sentencepiece = _no_sentencepiece
import conversion.gemma as gemma  # transformers 5 saves Gemma 3's tower without "vision_model."
_filter = gemma.Gemma3VisionModel.filter_tensors.__func__
def _gemma3_names(cls, item):
    name, gen = item
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        name = "vision_tower.vision_model." + name[len("vision_tower."):]
    return _filter(cls, (name, gen))
gemma.Gemma3VisionModel.filter_tensors = classmethod(_gemma3_names)
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def convert(llama_cpp: Path, folder: Path, mmproj: bool) -> Path:
    """``convert_hf_to_gguf.py FOLDER --outtype f16 [--mmproj]``, once."""
    out = folder.parent / f"{folder.name.removeprefix('hf-')}{'-mmproj' if mmproj else ''}-f16.gguf"
    if not out.exists():
        argv = ["convert_hf_to_gguf.py", str(folder), "--outtype", "f16", "--outfile", str(out)]
        if mmproj:
            argv.append("--mmproj")
        code = _CONVERT.format(root=str(llama_cpp), argv=argv, script=str(llama_cpp / "convert_hf_to_gguf.py"))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"convert {folder.name}{' --mmproj' if mmproj else ''} failed:\n{proc.stderr[-1500:]}")
    return out


def _max_rss_bytes(stderr: str) -> int:
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    return int(found.group(1)) * 1024 if found else 0


def mtmd_command(binary: Path, model: Path, mmproj: Path, image: Path, ctx: int, cache: str) -> list[str]:
    return [
        str(binary),
        "-m",
        str(model),
        "--mmproj",
        str(mmproj),
        "--image",
        str(image),
        "-p",
        "hi",
        "-n",
        "1",
        "-c",
        str(ctx),
        "-ctk",
        cache,
        "-ctv",
        cache,
        "-fa",
        "on",
        "-ngl",
        "0",
        "-t",
        "2",
        "--temp",
        "0",
        "--chat-template",
        "chatml",  # the tiny tokenizer's own template is not one llama.cpp knows
        "-v",  # the buffer sizes are info lines, and the compute buffer's exact size a debug line
    ]


def parse_log(log: str) -> dict[str, int]:
    """The figures of one llama-mtmd-cli log, in bytes (as logged: MiB with two decimals)."""
    got = {}
    for pattern, key in FIGURES:
        values = re.findall(pattern, log)
        if key == "kv_buffer_bytes":  # one line per cache: sliding-window models log two (iswa)
            got[key] = sum(round(float(v) * MiB) for v in values)
        else:  # the last reservation is the one kept
            got[key] = round(float(values[-1]) * MiB) if values else 0
    # llama-context.cpp ~llama_context: the same compute buffer with four decimals (debug level)
    exact = re.findall(r"~llama_context:\s+CPU compute buffer size is\s+([\d.]+) MiB", log)
    if exact:
        got["compute_buffer_bytes"] = round(float(exact[-1]) * MiB)
    # mtmd-helper.cpp mtmd_helper_decode_image_chunk: "decoding image batch i/n, n_tokens_batch = N"
    got["image_tokens"] = sum(int(t) for t in re.findall(r"decoding image batch \d+/\d+, n_tokens_batch = (\d+)", log))
    # tiled projectors (idefics3): mtmd.cpp add_media logs the slices, clip_encode each slice's tokens;
    # counted from these so that a run cut short after some slices still gives the image's total
    slices = re.search(
        r"add_media: preproc_out has (\d+) entries, grid_x = \d+, grid_y = \d+, has_overview = (\d)", log
    )
    per_slice = re.search(r"clip_encode: output embedding shape \[\d+, (\d+), 1\]", log)
    if slices and per_slice and int(slices.group(1)) > 1:
        got["image_tokens"] = (int(slices.group(1)) + int(slices.group(2))) * int(per_slice.group(1))
    return got


def run_mtmd(cmd: list[str]) -> tuple[dict[str, int], int, str]:
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    if proc.returncode and "reserve_compute_meta" not in log:  # aborted before the figures were logged
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log[-2000:]}")
    return parse_log(log), _max_rss_bytes(proc.stderr), log


def baseline_rss(binary: Path) -> int:
    """The binary's own resident peak with no model (its libraries and backend registry)."""
    proc = subprocess.run(["/usr/bin/time", "-v", str(binary), "--version"], capture_output=True, text=True)
    return _max_rss_bytes(proc.stderr)


KEYS = [k for _, k in FIGURES] + ["image_tokens"]


def _estimate(model: str, mmproj: str, w: int, h: int, ctx: int, cache: str) -> dict[str, Any]:
    """``memwarden estimate MODEL --mmproj MMPROJ --image WxH -c CTX -ctk T -ctv T -fa on --json``."""
    from memwarden.estimation.gguf.estimate import estimate_gguf

    est = estimate_gguf(
        model, mmproj_path=mmproj, images=((w, h),), n_ctx=ctx, cache_type_k=cache, cache_type_v=cache, flash_attn="on"
    )
    return est.to_json()


def _image(path: Path, w: int, h: int) -> Path:
    from PIL import Image

    if not path.exists():
        Image.new("RGB", (w, h), (120, 90, 60)).save(path)
    return path


def _mib(n: int) -> str:
    return f"{n / MiB:.2f}"


def _ratio(ours: int, real: int) -> str:
    return f"{ours / real:.3f}" if real else ("1.000" if ours == 0 else "—")


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| family | image | -c | cache | figure | llama.cpp (MiB) | memwarden (MiB) | ratio |\n"
        "|---|---|---|---|---|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        for _, key in FIGURES:
            real, ours = r["llama_cpp"][key], r["memwarden"][key]
            lines.append(
                f"| {r['family']} | {r['image']} | {r['ctx']} | {r['cache']} | {key} | {_mib(real)} | {_mib(ours)} | {_ratio(ours, real)} |"
            )
        real_t, ours_t = r["llama_cpp"]["image_tokens"], r["memwarden"]["image_tokens"]
        lines.append(
            f"| {r['family']} | {r['image']} | {r['ctx']} | {r['cache']} | image_tokens | {real_t} | {ours_t} | {_ratio(ours_t, real_t)} |"
        )
    rss = (
        "\n| family | image | -c | cache | max RSS (MiB) | RSS − baseline (MiB) | peak_bytes (MiB) | peak / (RSS − baseline) |\n"
        "|---|---|---|---|---:|---:|---:|---:|\n"
    )
    for r in rows:
        if r.get("aborted"):
            continue  # the resident peak of a run cut short says nothing
        net = r["max_rss_bytes"] - r["baseline_rss_bytes"]
        rss += (
            f"| {r['family']} | {r['image']} | {r['ctx']} | {r['cache']} | {_mib(r['max_rss_bytes'])} | "
            f"{_mib(net)} | {_mib(r['peak_bytes'])} | {_ratio(r['peak_bytes'], net)} |\n"
        )
    return head + "\n".join(lines) + "\n" + rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=os.environ.get("LLAMA_MTMD_CLI"), help="llama-mtmd-cli")
    ap.add_argument("--llama-cpp", type=Path, default=Path(".cache/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    ap.add_argument("--out", type=Path, default=Path(".cache/llamacpp-acc"))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--images", default="640x480,1280x960")
    ap.add_argument("--contexts", default="2048,4096")  # 1280x960 is 1564 Qwen tokens: over -c 1024
    ap.add_argument("--cache-types", default="f16,q8_0")
    ap.add_argument("--json", type=Path, default=None, help="write the rows (and the logs' figures) here")
    ap.add_argument("--logs", action="store_true", help="keep each run's log under --out/logs")
    ap.add_argument("--replay", type=Path, default=None, help="re-estimate the rows of an earlier --json; no runs")
    args = ap.parse_args()
    if args.replay:
        stored: list[dict[str, Any]] = json.loads(args.replay.read_text())
        for r in stored:
            w, h = (int(v) for v in r["image"].split("x"))
            est = _estimate(r["model"], r["mmproj"], w, h, r["ctx"], r["cache"])
            r["memwarden"], r["peak_bytes"] = {k: est["llama_cpp"][k] for k in KEYS}, est["peak_bytes"]
        print(table(stored))
        return 0
    binary = args.bin
    if binary is None or not Path(binary).is_file():
        print(f"llama-mtmd-cli not found ({binary}); give --bin or $LLAMA_MTMD_CLI. Nothing compared.")
        return 0
    if not Path("/usr/bin/time").exists():
        print("/usr/bin/time is missing: the resident peak is not measured")
    args.out.mkdir(parents=True, exist_ok=True)
    base_rss = baseline_rss(binary)
    rows: list[dict[str, Any]] = []
    for family in args.families.split(","):
        folder = args.out / f"hf-{family}"
        try:
            if not folder.exists():
                make_model(family, args.out)
            model, mmproj = convert(args.llama_cpp, folder, False), convert(args.llama_cpp, folder, True)
        except Exception as exc:  # a family the converter refuses offline: say so, keep the others
            shutil.rmtree(folder, ignore_errors=True)
            print(f"{family}: not converted ({str(exc).strip().splitlines()[-1][:200]})", file=sys.stderr)
            continue
        for size in args.images.split(","):
            w, h = (int(v) for v in size.split("x"))
            image = _image(args.out / f"img-{w}x{h}.png", w, h)
            for ctx in (int(c) for c in args.contexts.split(",")):
                for cache in args.cache_types.split(","):
                    est = _estimate(str(model), str(mmproj), w, h, ctx, cache)
                    cmd = mtmd_command(binary, model, mmproj, image, ctx, cache)
                    try:
                        real, rss, log = run_mtmd(cmd)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        print(f"{family} {size} -c {ctx} {cache}: {str(exc)[:300]}", file=sys.stderr)
                        continue
                    if args.logs:
                        (args.out / "logs").mkdir(exist_ok=True)
                        (args.out / "logs" / f"{family}-{size}-{ctx}-{cache}.log").write_text(log)
                    rows.append(
                        {
                            "model": str(model),
                            "mmproj": str(mmproj),
                            "aborted": "GGML_ASSERT" in log,  # figures logged, the run cut short after
                            "family": family,
                            "image": size,
                            "ctx": ctx,
                            "cache": cache,
                            "command": " ".join(cmd),
                            "llama_cpp": real,
                            "memwarden": {k: est["llama_cpp"][k] for k in KEYS},
                            "peak_bytes": est["peak_bytes"],
                            "max_rss_bytes": rss,
                            "baseline_rss_bytes": base_rss,
                        }
                    )
                    print(f"{family} {size} -c {ctx} {cache}: done", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
