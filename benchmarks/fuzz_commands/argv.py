"""Argument lists of every subcommand, mutated, and the small valid files they point at."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from fuzz_commands import ROOT
from fuzz_commands.thresholds import seed_thresholds, to_toml


def _write_fixtures(fix: Path) -> dict[str, str]:
    """Small valid inputs the argument seeds point at."""
    import bench_fuzz

    (fix / "seed.mwtrace").write_bytes(bench_fuzz.seed_trace())
    (fix / "seed.pickle").write_bytes(bench_fuzz.seed_snapshot())
    (fix / "script.py").write_text("x = [bytearray(1024) for _ in range(4)]\n")
    (fix / "align.jsonl").write_text(
        "".join(
            json.dumps({"type": "audio", "t_s": i * 0.04, "samples": 640})
            + "\n"
            + json.dumps({"type": "video", "t_s": i * 0.04})
            + "\n"
            for i in range(25)
        )
    )
    (fix / "grid.toml").write_text('models = ["llava"]\n[[requests]]\nprompt_tokens = 8\nnew_tokens = 2\n')
    (fix / "thresholds.toml").write_text(to_toml(seed_thresholds()))
    (fix / "a dir").mkdir(exist_ok=True)
    fifo = fix / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    link = fix / "link.json"
    if not link.is_symlink():
        link.symlink_to(fix / "target.json")
    try:
        import numpy as np
        from safetensors.numpy import save_file

        save_file(
            {
                "base_model.model.layers.0.q_proj.lora_A.weight": np.ones((2, 8), np.float32),
                "base_model.model.layers.0.q_proj.lora_B.weight": np.zeros((8, 2), np.float32),
            },
            str(fix / "adapter.safetensors"),
        )
    except ImportError:
        (fix / "adapter.safetensors").write_bytes(b"")
    return {
        k: str(fix / v)
        for k, v in {
            "trace": "seed.mwtrace",
            "pickle": "seed.pickle",
            "script": "script.py",
            "align": "align.jsonl",
            "grid": "grid.toml",
            "thresholds": "thresholds.toml",
            "dir": "a dir",
            "fifo": "fifo",
            "link": "link.json",
            "adapter": "adapter.safetensors",
        }.items()
    }


def argv_seeds(f: dict[str, str]) -> list[list[str]]:
    stress = str(ROOT / "examples/stress/plain.toml")
    return [
        ["summary", f["trace"]],
        ["summary", "--json", f["pickle"]],
        ["diagnose", "--config", f["thresholds"], f["trace"]],
        ["diagnose", "--json", "--pattern", "fragmentation", f["trace"]],
        ["diagnose", "--html", "d.html", f["trace"]],
        ["check", "--max-peak", "1GiB", "--max", "allocated:prefill.vision=2MiB", f["trace"]],
        ["check", "--baseline", f["trace"], "--max-growth", "5%", "--min-delta", "1KiB", f["trace"]],
        ["report", "-o", "r.html", "--title", "t", f["trace"]],
        ["export", "--format", "chrome", "-o", "c.json", f["trace"]],
        ["export", "--format", "torch-snapshot", "--allocator", "pytorch-expandable", "-o", "s.pickle", f["trace"]],
        ["replay", "--limit", "4KiB", "--alloc-conf", "max_split_size_mb:128,roundup_power2_divisions:4", f["trace"]],
        ["replay", "--heatmap", "h.png", "--device", "cpu", f["trace"]],
        ["plan", "--alignment", "512", "--json", f["trace"]],
        ["plan", "--strategy", "greedy-by-size", "--device", "0", f["trace"]],
        [
            "estimate",
            "llava",
            "--no-suggest",
            "--json",
            "--image",
            "64x48",
            "--prompt-tokens",
            "8",
            "--new-tokens",
            "2",
        ],
        ["estimate", "qwen2-audio", "--no-suggest", "--audio-seconds", "1", "--batch", "2", "--dtype", "float16"],
        ["estimate", "llava", "--no-suggest", "--sweep", "--prompt-tokens", "8,16", "--new-tokens", "2", "--quiet"],
        ["estimate", "llava", "--no-suggest", "--fit", "1GiB", "--solve", "new-tokens", "--quiet", "--json"],
        [
            "estimate",
            "llava",
            "--no-suggest",
            "--weights-dtype",
            "int4",
            "--kv-dtype",
            "int8",
            "--max-pixels",
            "4096",
            "--device-profile",
            "raspberry-pi-5-8gb",
            "--format",
            "md",
            "--logits",
            "full",
        ],
        ["devices", "--json"],
        ["telemetry", "--json", "--count", "1"],
        ["telemetry", "--replay", str(ROOT / "examples/telemetry/cold.jsonl"), "--json", "--set", "hysteresis_s=10"],
        ["telemetry", "--replay", str(ROOT / "examples/telemetry/tegrastats_orin_nano.log"), "--budget", "6GiB"],
        ["top", "127.0.0.1:9", "--once"],
        ["sweep", f["grid"], "--json", "--jobs", "1", "--quiet"],
        ["doctor", "--no-probe", "--json"],
        ["doctor", "--collect", "--no-probe", "-o", "facts.json"],
        ["align-check", f["align"], "--json", "--audio-rate", "16000", "--video-fps", "25"],
        ["align-check", f["align"], "--audio-per-frame", "640"],
        ["lora", "manifest", f["adapter"], "--version", "3"],
        ["lora", "diff", f["adapter"], f["adapter"], "-o", "d.st"],
        ["lora", "apply", f["adapter"], f["adapter"], "-o", "n.st"],
        ["compare", "--json", f["trace"], f["pickle"]],
        ["compare", "--html", "c.html", "--module-depth", "2", f["trace"], f["trace"]],
        ["partition", "missing.onnx", "--device-profile", "jetson-orin-nano-8gb", "--json", "--time-limit", "1"],
        ["trace", "-o", "t.mwtrace", f["script"]],
        ["trace", "-o", "t.mwtrace", "--ring", "1", "--stacks", f["script"]],
        ["stress", "--a", stress, "--b", stress, "--runs", "0", "--json", "--quiet"],
        ["demo", "--size", "tiny", "--naive-only", "--turns", "1", "--quiet", "--json", "-o", "demo-out"],
        [],
        ["--version"],
        ["summary", "--help"],
    ]


def _flags() -> list[str]:
    from memwarden.cli import build_parser

    parser = build_parser()
    out: set[str] = set()
    for action in parser._actions:
        for sub in getattr(action, "choices", None) or {}:
            sp = action.choices[sub]  # type: ignore[index]
            out.update(o for a in sp._actions for o in a.option_strings)
    return sorted(out - {"--executor", "--ray-address"})


def argv_values(f: dict[str, str]) -> list[str]:
    return [
        "-1",
        "0",
        "1e999",
        "inf",
        "-inf",
        "nan",
        "NaN",
        "9" * 400,
        "1e20",
        "2**63",
        "18446744073709551616",
        "100000000",
        "200000000",
        "x" * 5000,
        "",
        " ",
        "\u202e",
        "日本語",
        "-",
        "--",
        "=",
        "1,2,,3",
        "0x10",
        "1.5",
        "-0",
        "1GiB",
        "1e300GiB",
        "-5MiB",
        "448x-3",
        "0x0",
        "99999x99999",
        "a=b",
        "allocated:=1",
        "/nonexistent/dir/x",
        "/dev/zero",
        "/proc/self/status",
        "/",
        f["dir"],
        f["fifo"],
        f["link"],
        f["trace"],
        f["pickle"],
        f["script"],
        f["align"],
        "llava:huge",
        "llava",
        "qwen2-vl:small",
        "max_split_size_mb:-1",
        "roundup_power2_divisions:0",
        "expandable_segments:maybe",
    ]


def make_argv(seeds: list[list[str]], flags: list[str], values: list[str], rng: random.Random) -> list[str]:
    argv = list(rng.choice(seeds))
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        i = rng.randrange(len(argv) + 1)
        if op < 0.4 and argv:  # a value (or any token) replaced
            j = rng.randrange(1, len(argv)) if len(argv) > 1 else 0
            argv[j] = rng.choice(values)
        elif op < 0.55 and argv:
            del argv[rng.randrange(len(argv))]
        elif op < 0.65 and argv:
            j = rng.randrange(len(argv))
            argv[j:j] = argv[j : j + 2]
        elif op < 0.8:  # a flag of any subcommand, with a value
            argv[i:i] = [rng.choice(flags), rng.choice(values)][: rng.randint(1, 2)]
        elif op < 0.87 and argv:  # --flag=value, or an abbreviation
            flagged = [j for j, a in enumerate(argv) if a.startswith("--")]
            if flagged:
                j = rng.choice(flagged)
                argv[j] = argv[j][: rng.randint(min(3, len(argv[j])), len(argv[j]))] + (
                    f"={rng.choice(values)}" if rng.random() < 0.5 else ""
                )
        elif op < 0.93 and argv:  # another subcommand's name
            argv[0] = rng.choice([s[0] for s in seeds if s])
        elif len(argv) > 1:
            j, k = rng.randrange(len(argv)), rng.randrange(len(argv))
            argv[j], argv[k] = argv[k], argv[j]
    # never ask for Ray (a network cluster) or a script module: both are trusted configuration
    return [a for a in argv if a not in ("ray", "--executor", "--ray-address", "-m")]


def asked_to_run_long(argv: list[str]) -> bool:
    """Commands that run as long as they are told to: ``top`` without ``--once``, a live
    ``telemetry`` with many samples, and ``demo`` (a real model captured, diagnosed and served: it
    takes minutes by design). A run over the limit there is counted apart, and listed."""
    if argv[:1] == ["top"] and "--once" not in argv or argv[:1] == ["demo"]:
        return True
    return argv[:1] == ["telemetry"] and "--replay" not in argv and any(a in argv for a in ("--count", "--interval"))
