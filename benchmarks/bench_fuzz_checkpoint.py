"""Fuzz ``memwarden estimate ./folder``: a checkpoint folder's safetensors headers and config.json.

    python benchmarks/bench_fuzz_checkpoint.py [--n 10000] [--seed 0] [--hang-s 10] [--json]

The seed is a valid folder of a small Llama: ``config.json``, its ``model.safetensors`` (the
header of every tensor the model holds, the data region a hole of the right size) and a
``preprocessor_config.json``. Each case copies it into a fresh folder, changes one to three
things and runs ``memwarden.cli.main(["estimate", FOLDER, "--no-suggest", "--prompt-tokens", "16",
"--new-tokens", "2"])`` in this process (``--json`` one case in two), as the documented command does:

- the header's entries: ``data_offsets`` overlapping, negative, reversed, past the data region,
  of 2^63; shapes huge (2^39, 2^70), negative, booleans, strings, 9 or 200,000 dimensions, or
  another module's (consistent offsets, so the shape itself reaches the meta model); dtypes
  unknown or swapped; keys renamed (escape sequences, rich markup, a module path, a key of no
  module, quantization suffixes); 10 to 99,999 extra tensors, or 120,000 (over the limit);
  ``__metadata__`` hostile; the whole header another JSON value or 100,000 levels deep;
- the header's bytes: flipped, the length field set to 0, 1, 2^63, one more or less; the file
  cut inside the header or the data region;
- ``config.json``: a value replaced (400-digit integers, ``1e999``, NaN, negative, strings with
  escape sequences, deep nesting), a key dropped, ``model_type`` swapped, a hostile
  ``quantization_config``; or its bytes flipped or cut;
- ``preprocessor_config.json``: a value replaced the same way;
- the folder: a second shard holding a key of another shape, the shard replaced by a FIFO, a
  symlink to ``/dev/zero``, a directory or an empty file, only a ``.bin`` pickle, three empty shards beside it.

Outcome classes: ``ok`` (exit 0), ``clear error`` (a non-zero exit with one stderr line),
``multi-line error``, ``TRACEBACK`` (an exception escaping ``main``, or ``Traceback`` on
stderr), ``HANG`` (over ``--hang-s``: a SIGALRM watchdog), ``escape leak`` (an ESC byte on
stdout or stderr). Peak RSS per case is ``VmHWM`` after ``clear_refs`` (the process's own
start-up included: torch and transformers, about 0.5 GiB). Each case's CPU time is kept beside its
wall time: on a loaded machine a case can pass ``--hang-s`` waiting for a CPU, and the report says
how many passed it in CPU time. Targets: 0 tracebacks, 0 hangs, 0 multi-line errors, 0 escape
leaks, every case under 1 GiB above the process's start.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ESC = "\x1b]0;pwned\x07\x1b[2J"
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PREPROCESSOR = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 224}, "do_resize": True}
ST_NAMES = {"float16": "F16", "float32": "F32", "bfloat16": "BF16"}
DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "U8": 1, "I64": 8, "F8_E4M3": 1, "U16": 2, "I32": 4}
HOSTILE: list[Any] = [
    -1,
    0,
    2**63,
    10**400,
    -(10**400),
    1e308,
    True,
    None,
    "",
    "x" * 5000,
    ESC,
    "[link=file:///etc/passwd]x[/link]",
    "[/bold]",
    [],
    {},
    [[[[1]]]],
    [2] * 200_000,
    [1 << 40, 1 << 40],
    "F16",
    "qwen2_vl",
    "\ud800",
]
SPECIALS = ["1e999", "-1e999", "NaN", "Infinity", "1" + "0" * 400, "[" * 100_000 + "]" * 100_000]
MODEL_TYPES = ["qwen2_vl", "mllama", "whisper", "llava", "gemma3", "nope", "", "bert", "t5", "mistral"]
QUANT = [
    {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    {"quant_method": "gptq", "bits": 4, "group_size": 128},
    {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"},
    {"quant_method": "fp8", "weight_block_size": [128, 128]},
    {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"]}}},
    {"quant_method": "hqq", "quant_config": {"weight_quant_params": {"nbits": 4, "group_size": 64}}},
]
KEYS = [
    ESC,
    "[link=file:///etc/passwd]x[/link]",
    "",
    ".",
    "model",
    "model.layers.0",
    "model.layers.99.mlp.up_proj.weight",
    "lm_head.weight",
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight.absmax",
    "model.layers.0.self_attn.q_proj.qweight",
    "model.layers.0.self_attn.q_proj.weight_scale",
    "visual.x.weight",
    "k" * 5000,
    "model.norm.weight.extra.deep.name",
    "\ud800",
    "__metadata__x",
]


EXTRA_COUNTS = (10, 1000, 99_999, 120_000)  # extra tensors; MAX_TENSORS is 100,000 a file
_EXTRA_TEXT: dict[int, str] = {}


class Hang(BaseException):
    """Raised by the watchdog: a BaseException, so no ``except Exception`` of the product swallows it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang()


# -- the seed ------------------------------------------------------------------------------------


def seed_tensors() -> dict[str, tuple[list[int], str]]:
    """key -> (shape, safetensors dtype) of every tensor the seed Llama holds (built on meta)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**{k: v for k, v in CONFIG.items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {k: (list(v.shape), ST_NAMES[str(v.dtype).removeprefix("torch.")]) for k, v in model.state_dict().items()}


def header_for(tensors: dict[str, tuple[list[int], str]]) -> tuple[dict[str, Any], int]:
    """A safetensors header laying ``tensors`` out back to back, and the bytes of its data region."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, (shape, dtype) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return header, offset


def write_shard(path: Path, raw_header: bytes, data_len: int, *, length: int | None = None) -> None:
    """8-byte length (``length``, else the header's own), the header, a hole of ``data_len`` bytes
    (at most 1 TiB: a header claiming more is then one whose tensors reach past the file)."""
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw_header) if length is None else length) + raw_header)
        f.truncate(8 + len(raw_header) + min(max(data_len, 0), 1 << 40))  # filesystems stop at 16 TiB


# -- mutations -----------------------------------------------------------------------------------


def _structural(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """``obj`` with one value somewhere replaced or a key dropped."""
    if isinstance(obj, dict) and obj:
        key = rng.choice(list(obj))
        out = dict(obj)
        roll = rng.random()
        if roll < 0.15:
            del out[key]
        elif roll < 0.7 or depth > 4:
            out[key] = rng.choice(HOSTILE)
        else:
            out[key] = _structural(rng, obj[key], depth + 1)
        return out
    if isinstance(obj, list) and obj:
        out_list = list(obj)
        out_list[rng.randrange(len(obj))] = rng.choice(HOSTILE)
        return out_list
    return rng.choice(HOSTILE)


def _dumps(obj: Any, rng: random.Random) -> bytes:
    text = json.dumps(obj, allow_nan=True)
    if rng.random() < 0.3:  # a number JSON can spell but json.dumps never writes
        starts = [i for i, c in enumerate(text) if c.isdigit() and (i == 0 or not text[i - 1].isalnum())]
        if starts:
            i = j = rng.choice(starts)
            while j < len(text) and (text[j].isdigit() or text[j] in ".e-+"):
                j += 1
            text = text[:i] + rng.choice(SPECIALS) + text[j:]
    return text.encode("utf-8", "surrogatepass")


def _flip(rng: random.Random, data: bytes, lo: int = 0) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        if len(b) > lo:
            b[rng.randrange(lo, len(b))] = rng.randrange(256)
    return bytes(b)


def _extra_tensors(text: str) -> str:
    """``text`` (a header's JSON) with each extra-tensors marker replaced by that many empty tensors."""
    for count in EXTRA_COUNTS:
        marker = f'"__extra_{count}__": null'
        if marker in text:
            if count not in _EXTRA_TEXT:
                _EXTRA_TEXT[count] = ", ".join(
                    f'"t{i}": {{"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}' for i in range(count)
                )
            text = text.replace(marker, _EXTRA_TEXT[count])
    return text


def _laid_out(header: dict[str, Any]) -> bool:
    """Whether every entry still has a plain dtype, shape and offsets (what ``header_for`` redoes)."""

    def plain(v: Any) -> bool:
        shape, offsets = v.get("shape"), v.get("data_offsets")
        return (
            isinstance(v.get("dtype"), str)
            and v["dtype"] in DTYPE_BYTES
            and isinstance(shape, list)
            and len(shape) <= 8
            and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int for o in offsets)
        )

    return all(isinstance(v, dict) and plain(v) for k, v in header.items() if k != "__metadata__")


def _mutate_header(rng: random.Random, header: dict[str, Any], data_len: int) -> tuple[Any, int]:
    """One change to the header (a copy) and the data region's length."""
    keys = [k for k in header if k != "__metadata__"]
    key = rng.choice(keys)
    entry = dict(header[key]) if isinstance(header[key], dict) else {}
    what = rng.randrange(12)
    if what in (4, 8) and not _laid_out(header):
        what = 11  # an earlier change left no layout to redo: a structural change instead
    if what == 0:
        entry["data_offsets"] = [
            rng.choice([-8, 0, 16, 1 << 62, data_len]),
            rng.choice([32, 64, data_len + 1, 1 << 63]),
        ]
    elif what == 1:
        entry["shape"] = rng.choice(
            [
                [1 << 39, 896],
                [-1, 32],
                [True, 4],
                ["4", 32],
                [2**70],
                [1.5],
                [2] * 9,
                [2] * 200_000,
                [],
                [0, 32],
            ]
        )
    elif what == 2:
        entry["dtype"] = rng.choice(["F17", None, 3, "I64", "BOOL", "U16", "F8_E8M0", "f16", ""])
    elif what == 3:
        return header, rng.choice([0, data_len - 1, data_len // 2, data_len + 4096, 1 << 33])
    elif what == 4:  # another shape, its offsets made consistent: the shape itself reaches the meta model
        shape = rng.choice([[64, 32], [32], [32, 32, 2], [1 << 20, 4096], [0], [256, 64], [1, 1]])
        header = {k: v for k, v in header.items() if k != key}
        tensors = {k: (v["shape"], v["dtype"]) for k, v in header.items() if k != "__metadata__"}
        tensors[key] = (shape, rng.choice(["F16", "F32", "U8", "I64", "F8_E4M3"]))
        return header_for(tensors)
    elif what == 5:  # a marker the writer replaces with the tensors' JSON, made once per count
        return {**header, f"__extra_{rng.choice(list(EXTRA_COUNTS))}__": None}, data_len
    elif what == 6:  # a key renamed
        new = rng.choice(KEYS)
        out = {(new if k == key else k): v for k, v in header.items()}
        return out, data_len
    elif what == 7:
        return {**header, key: rng.choice([[], "x", None, 7, {"dtype": "F16"}, {}])}, data_len
    elif what == 8:  # overlapping: the next tensor starts inside this one
        start, end = entry["data_offsets"]
        entry["data_offsets"] = [start + 2, end + 2] if end + 2 <= data_len else [max(start - 2, 0), end - 2]
    elif what == 9:
        return {**header, "__metadata__": rng.choice(HOSTILE + [{"format": ESC}, {"k": "v" * 100_000}])}, data_len
    elif what == 10:
        return rng.choice([[], 1, "x", {}, None, [{"a": 1}]]), data_len
    else:
        entry = _structural(rng, entry)
    return {**header, key: entry}, data_len


def _mutate_config(rng: random.Random, config: dict[str, Any]) -> bytes:
    roll = rng.random()
    if roll < 0.15:
        return _flip(rng, json.dumps(config).encode())
    if roll < 0.2:
        raw = json.dumps(config).encode()
        return raw[: rng.randrange(len(raw))]
    if roll < 0.3:
        return json.dumps({**config, "model_type": rng.choice(MODEL_TYPES)}).encode()
    if roll < 0.4:
        quant = _structural(rng, rng.choice(QUANT)) if rng.random() < 0.6 else rng.choice(QUANT)
        return _dumps({**config, "quantization_config": quant}, rng)
    if roll < 0.45:
        return _dumps(
            {**config, "torch_dtype": rng.choice(["float8", "int4", ESC, None, 3, "bfloat16", "float32"])}, rng
        )
    return _dumps(_structural(rng, config), rng)


def make_case(rng: random.Random, folder: Path, seed: dict[str, tuple[list[int], str]]) -> str:
    """Write case ``rng`` into ``folder``; returns a short label of what was changed."""
    header: Any
    header, data_len = header_for(seed)
    config: bytes = json.dumps(CONFIG).encode()
    preprocessor: bytes = json.dumps(PREPROCESSOR).encode()
    raw: bytes | None = None
    length: int | None = None
    labels = []
    for _ in range(rng.randint(1, 3)):
        target = rng.choices(["header", "header-bytes", "config", "preprocessor", "folder"], [45, 15, 25, 5, 10])[0]
        labels.append(target)
        if target == "header" and isinstance(header, dict) and len(header) > 1:
            header, data_len = _mutate_header(rng, header, data_len)
        elif target == "header-bytes":
            raw = _extra_tensors(json.dumps(header)).encode() if raw is None else raw
            roll = rng.random()
            if roll < 0.5:
                raw = _flip(rng, raw)
            elif roll < 0.8:
                length = rng.choice([0, 1, 2**63, len(raw) + 1, len(raw) - 1, 200 * 1024**2])
            else:
                raw = raw[: rng.randrange(len(raw))]
                data_len = 0
        elif target == "config":
            try:
                parsed = json.loads(config)
            except (ValueError, RecursionError):  # made unreadable by an earlier change: its bytes, then
                parsed = None
            config = _mutate_config(rng, parsed) if isinstance(parsed, dict) else _flip(rng, config)
        elif target == "preprocessor":
            preprocessor = _dumps(_structural(rng, PREPROCESSOR), rng)
    if raw is None:
        raw = _extra_tensors(json.dumps(header)).encode("utf-8", "surrogatepass")
        if rng.random() < 0.05:
            raw = rng.choice(SPECIALS[-1:] + ['{"a": ' * 5000 + "1" + "}" * 5000]).encode()
    shard = folder / "model.safetensors"
    write_shard(shard, raw, data_len, length=length)
    (folder / "config.json").write_bytes(config)
    (folder / "preprocessor_config.json").write_bytes(preprocessor)
    if "folder" in labels:
        _mutate_folder(rng, folder, shard, seed)
    return "+".join(labels)


def _mutate_folder(rng: random.Random, folder: Path, shard: Path, seed: dict[str, tuple[list[int], str]]) -> None:
    what = rng.randrange(8)
    if what == 0:  # a second shard holding a key of the first with another shape
        key = rng.choice(list(seed))
        header, data_len = header_for({key: ([7, 3], "F16")})
        write_shard(folder / "model-2.safetensors", json.dumps(header).encode(), data_len)
    elif what in (1, 2, 3, 4):
        shard.unlink()
        if what == 1:
            os.mkfifo(shard)
        elif what == 2:
            shard.symlink_to("/dev/zero")
        elif what == 3:
            shard.mkdir()
        else:
            shard.touch()
    elif what == 5:
        shard.unlink()
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    elif what == 6:
        for i in range(3):
            (folder / f"extra-{i}.safetensors").touch()
    else:
        (folder / "config.json").unlink()
        if rng.random() < 0.5:
            os.mkfifo(folder / "config.json")


# -- running -------------------------------------------------------------------------------------


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _signature(stderr: str, folder: Path) -> str:
    """What kind of error ``stderr`` is: its first line past ``error:``, the folder's path dropped."""
    first = stderr.strip().splitlines()[0] if stderr.strip() else ""
    text = first.split("error: ", 1)[-1].replace(str(folder), "FOLDER")
    return ascii(text.split(" (", 1)[0][:90])[1:-1]


def run_case(folder: Path, json_out: bool, hang_s: float) -> dict[str, Any]:
    """``memwarden estimate FOLDER --no-suggest`` in this process: its outcome class, seconds, peak RSS."""
    from memwarden.cli import main

    argv = ["estimate", str(folder), "--no-suggest", "--prompt-tokens", "16", "--new-tokens", "2"]
    argv += ["--json"] if json_out else []
    out, err = io.StringIO(), io.StringIO()
    _reset_hwm()
    t0, cpu0 = time.perf_counter(), time.process_time()
    status: int | None = None
    outcome = ""
    signal.setitimer(signal.ITIMER_REAL, hang_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = int(main(argv))
    except Hang:
        outcome = "HANG"
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001 - the point: anything escaping main is a finding
        outcome = "TRACEBACK"
        err.write(f"Traceback: {type(exc).__name__}: {exc}"[:400])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu0  # a case slow on the wall clock but not here waited for a CPU
    stdout, stderr = out.getvalue(), err.getvalue()
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("memwarden: ")]
    if outcome:
        pass
    elif "Traceback" in stderr:
        outcome = "TRACEBACK"
    elif seconds > hang_s:
        outcome = "HANG"
    elif "\x1b" in stdout or "\x1b" in stderr:
        outcome = "escape leak"
    elif status == 0:
        outcome = "ok"
    else:
        outcome = "clear error" if len(lines) == 1 else "multi-line error"
    return {
        "outcome": outcome,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "rss": _vm_hwm(),
        "stderr": stderr[-300:],
        "stderr_head": stderr[:600],
    }


@contextlib.contextmanager
def _restored(signum: int, handler: Any, build_parser: Any) -> Iterator[None]:
    from memwarden import cli

    try:
        yield
    finally:
        signal.signal(signum, handler)
        cli.build_parser = build_parser  # type: ignore[assignment]


def run(
    n: int = 10_000, *, seed: int = 0, hang_s: float = 10.0, first: int = 0, progress: bool = False
) -> dict[str, Any]:
    """The campaign: case ``i`` (``first <= i < first + n``) made from ``random.Random(f"{seed}-{i}")``."""
    from memwarden import cli

    tensors = seed_tensors()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    # main() builds its parser, importing every command, on each call (0.04 s, a quarter of a case);
    # one parser serves every case, so the time goes to the checks under test.
    build_parser, parser = cli.build_parser, cli.build_parser()
    cli.build_parser = lambda: parser  # type: ignore[assignment]
    counts: Counter[str] = Counter()
    failures: Counter[str] = Counter()  # outcome and the error's words (the case's folder left out)
    by_change: dict[str, Counter[str]] = {}
    examples: list[str] = []
    slowest = (0.0, -1, "")
    cpu_over, slowest_cpu = 0, 0.0  # cases over hang_s of CPU time (a HANG without it waited for a CPU)
    peak_rss, base_rss = 0, _vm_hwm()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mw-fuzz-ckpt-") as tmp, _restored(signal.SIGALRM, previous, build_parser):
        for i in range(first, first + n):
            folder = Path(tmp) / f"case{i}"  # a fresh path each case: estimate keeps meta models by path
            folder.mkdir()
            rng = random.Random(f"{seed}-{i}")
            try:
                label = make_case(rng, folder, tensors)
            except Exception as exc:  # noqa: BLE001 - a bug of this campaign, counted apart, never the product's
                counts["campaign error"] += 1
                examples.append(f"case {i}: making it failed: {type(exc).__name__}: {exc}"[:300])
                shutil.rmtree(folder, ignore_errors=True)
                continue
            result = run_case(folder, rng.random() < 0.5, hang_s)
            shutil.rmtree(folder, ignore_errors=True)
            outcome = result["outcome"]
            counts[outcome] += 1
            for part in set(label.split("+")):
                by_change.setdefault(part, Counter())[outcome] += 1
            peak_rss = max(peak_rss, result["rss"])
            if result["seconds"] > slowest[0]:
                slowest = (result["seconds"], i, label)
            if progress and (i - first + 1) % 500 == 0:
                print(f"{i - first + 1}/{n} {dict(counts)}", file=sys.stderr, flush=True)
            if outcome not in ("ok", "clear error"):
                failures[f"{outcome}: {_signature(result['stderr_head'], folder)}"] += 1
            if outcome not in ("ok", "clear error") and len(examples) < 20:
                examples.append(
                    f"case {i} ({label}): {outcome} ({result['seconds']:.1f} s, "
                    f"{result['cpu_seconds']:.1f} s CPU): {result['stderr'][-240:]!r}"
                )
            if result["cpu_seconds"] > hang_s:
                cpu_over += 1
            slowest_cpu = max(slowest_cpu, result["cpu_seconds"])
    return {
        "mutations": n,
        "seed": seed,
        "first": first,
        "outcomes": dict(counts),
        "by_change": {k: dict(v) for k, v in sorted(by_change.items())},
        "failures": dict(failures.most_common(12)),
        "tracebacks": counts["TRACEBACK"],
        "hangs": counts["HANG"],
        "cpu_over_hang_s": cpu_over,
        "slowest_cpu_s": round(slowest_cpu, 3),
        "multi_line_errors": counts["multi-line error"],
        "escape_leaks": counts["escape leak"],
        "slowest_case": {"seconds": round(slowest[0], 3), "case": slowest[1], "changed": slowest[2]},
        "start_rss_mib": round(base_rss / 1024**2, 1),
        "peak_rss_mib": round(peak_rss / 1024**2, 1),
        "wall_s": round(time.perf_counter() - started, 1),
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="mutations (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="the first case's index (to rerun one: --first I --n 1)")
    parser.add_argument("--hang-s", type=float, default=10.0, help="a case slower than this is a hang")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # the meta runs need no threads; one keeps the campaign off the other core
    report = run(args.n, seed=args.seed, hang_s=args.hang_s, first=args.first, progress=True)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(", ".join(f"{k} {v}" for k, v in sorted(report["outcomes"].items())))
        for change, c in report["by_change"].items():
            print(f"  {change:13s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        s = report["slowest_case"]
        print(
            f"{report['mutations']} mutations in {report['wall_s']} s: tracebacks {report['tracebacks']}, "
            f"hangs {report['hangs']} ({report['cpu_over_hang_s']} over it in CPU time; slowest case "
            f"{report['slowest_cpu_s']} s CPU), multi-line errors {report['multi_line_errors']}, escape leaks "
            f"{report['escape_leaks']}; slowest case {s['seconds']} s (case {s['case']}, {s['changed']}); "
            f"RSS {report['start_rss_mib']} MiB at start, peak {report['peak_rss_mib']} MiB"
        )
        for line in report["examples"]:
            print("  " + line)
    bad = report["tracebacks"] or report["hangs"] or report["multi_line_errors"] or report["escape_leaks"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
