"""Every subcommand's ``--help``: a description and an example, in one place so they read alike.

A command that sets its own ``description`` keeps it; the example comes from ``EXAMPLES`` unless
the command set an ``epilog`` itself.
"""

from __future__ import annotations

import argparse
import re
import sys

__all__ = ["EXAMPLES", "describe", "flag_names", "renamed"]

DESCRIPTIONS = {
    "summary": "Print the peak of a trace, what was live at the peak (by category and by modality), the peak "
    "of each phase, the weights, and the allocation sites that matter most at the peak.",
    "demo": "Run the built-in deployment (a small vision-language model chatting about an image) under "
    "capture, diagnose it, serve the same turns with a GovernedSession, and write both reports. "
    "Needs Python and a C++ compiler only; no browser, no download.",
    "diagnose": "Name the overflow patterns in a trace (repeated encodes, KV growth, load spikes, "
    "fragmentation, ...), each with what it adds to the peak, what it allocates over the run, the "
    "evidence and the change that fixes it.",
}

EXAMPLES = {
    "demo": ["memwarden demo -o out/", "memwarden demo --size tiny --turns 2 --naive-only"],
    "trace": ["memwarden trace -o run.mwtrace my_script.py --its-args"],
    "summary": ["memwarden summary run.mwtrace", "memwarden summary run.mwtrace --json | jq .peak_bytes"],
    "diagnose": ["memwarden diagnose run.mwtrace", "memwarden diagnose run.mwtrace --html report.html"],
    "report": ["memwarden report run.mwtrace -o report.html", "memwarden report run.mwtrace -o - > report.html"],
    "export": [
        "memwarden export run.mwtrace --format torch-snapshot -o run.pickle",
        "memwarden export run.mwtrace --format chrome -o - | gzip > run.json.gz",
    ],
    "replay": ["memwarden replay run.mwtrace --limit 512MiB", "memwarden replay run.mwtrace --heatmap layout.png"],
    "plan": ["memwarden plan run.mwtrace --strategy best"],
    "estimate": [
        "memwarden estimate llava-1.5-7b --image 336x336 --dtype bfloat16 --device-profile jetson-orin-nano-8gb",
        "memwarden estimate qwen2-vl:small --image 448x448 --sweep",
    ],
    "devices": ["memwarden devices", "memwarden devices jetson-orin-nano-8gb"],
    "telemetry": [
        "memwarden telemetry",
        "memwarden telemetry --replay examples/telemetry/thermal_event.jsonl --device-profile jetson-orin-nano-8gb",
    ],
    "stress": [
        "memwarden stress --a examples/stress/plain.toml --b examples/stress/governed.toml --runs 50 "
        "--inject squeeze:at=2s,to=60%,for=1s --html stress.html"
    ],
    "sweep": ["memwarden sweep examples/sweep/grid.toml"],
    "doctor": [
        "memwarden doctor",
        "memwarden doctor --collect -o facts.json   # on the device; then --facts elsewhere",
    ],
    "align-check": ["memwarden align-check capture.jsonl --json"],
    "lora": [
        "memwarden lora manifest adapter.safetensors",
        "memwarden lora diff old/adapter.safetensors new/adapter.safetensors -o update.delta",
        "memwarden lora apply old/adapter.safetensors update.delta -o new.safetensors",
    ],
    "compare": ["memwarden compare eager.mwtrace ort.mwtrace", "memwarden compare a.mwtrace b.mwtrace --html cmp.html"],
    "partition": ["memwarden partition vision.onnx --device-profile galaxy-s24-ultra-12gb --json"],
}


class _Formatter(argparse.HelpFormatter):
    """Wraps prose as argparse does, but keeps indented lines (the examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for paragraph in text.split("\n"):
            if not paragraph.strip() or paragraph.startswith("  "):
                lines.append(indent + paragraph)
            else:
                lines.append(super()._fill_text(paragraph, width, indent))
        return "\n".join(lines)


def describe(name: str, parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """Give ``parser`` a description (else its one-line help, as a sentence) and an example
    section where it has none."""
    if not parser.description:
        fallback = f"{help_text[:1].upper()}{help_text[1:]}." if help_text else None
        parser.description = DESCRIPTIONS.get(name) or fallback
    examples = EXAMPLES.get(name)
    if examples and not parser.epilog:
        parser.epilog = "example:\n" + "\n".join(f"  {line}" for line in examples)
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = _Formatter


def renamed(base: type[argparse.Action], old: str, new: str) -> type[argparse.Action]:
    """An argparse action that still accepts the option's ``old`` name, with a warning on stderr
    naming ``new``: one flag name per meaning across subcommands, without breaking scripts."""

    class Renamed(base):  # type: ignore[valid-type,misc]
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            if option_string == old:
                print(f"{parser.prog}: warning: {old} is deprecated here; use {new}", file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)

    return Renamed


# Names the estimate API uses in its messages, and the flags a command-line user typed.
_FLAG_OF = {
    "new_tokens": "--new-tokens",
    "prompt_tokens": "--prompt-tokens",
    "audio_seconds": "--audio-seconds",
    "weights_dtype": "--weights-dtype",
    "kv_dtype": "--kv-dtype",
    "max_pixels": "--max-pixels",
    "an image size is": "--image takes",
    "image_size": "--image",
    "dtype must": "--dtype must",
    "batch must": "--batch must",  # plain words: only as the subject of an error
}
_API_NAME = re.compile(r"(?<![-\w.])(" + "|".join(map(re.escape, sorted(_FLAG_OF, key=len, reverse=True))) + r")\b")


def flag_names(message: str) -> str:
    """``message`` with the API's parameter names (``new_tokens``) replaced by the flags that set
    them (``--new-tokens``), for errors shown to a command-line user."""
    return _API_NAME.sub(lambda m: _FLAG_OF[m.group(1)], message)
