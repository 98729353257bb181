"""memwarden estimate MODEL [--image WxH]... [--video WxHxF]... [--audio-seconds S] [--prompt-tokens N] [--new-tokens N]
[--batch B] [--dtype D] [--weights-dtype D] [--kv-dtype D] [--max-pixels N] [--logits last|full]
[--device-profile PROFILE]... [--json | --format md] [--sweep] [--quiet]"""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
from collections.abc import Iterator
from typing import Any

from memwarden.commands._help import renamed
from memwarden.errors import InputError
from memwarden.untrusted import terminal_safe


def register(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict the peak memory of a model serving a request, per phase, and whether it fits a device",
        description=(
            "Build MODEL from its config on the meta device (no weights are downloaded or allocated), run "
            "transformers' generate() on the request and report the peak per phase (load, encode, prefill, "
            "decode), the verdict for a device and the cheapest changes that make it fit. MODEL is a zoo name "
            "(llava, qwen2-vl:small, ...), a named real model (llava-1.5-7b, qwen2-vl-7b-instruct, ...) or the "
            "path of a config.json or of a folder holding one; a preprocessor_config.json beside it sets the "
            "image processor, as from_pretrained would (read as data, nothing it names is imported)."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="zoo name, named real model, config.json or its folder")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="WxH",
        help="an image of W x H px, resized, tiled or pixel-limited as the model's own processor does; repeat for "
        "several images (with --sweep: sizes to compare)",
    )
    p.add_argument(
        "--video",
        action="append",
        default=[],
        metavar="WxHxFRAMES",
        help="a video of FRAMES frames of W x H px, framed as the model's own video processor does; repeatable",
    )
    p.add_argument(
        "--max-pixels",
        default=None,
        metavar="N",
        help="pixel limit per image of a dynamic-resolution processor (Qwen2-VL's max_pixels; default the processor's)",
    )
    p.add_argument("--audio-seconds", default=None, metavar="S", help="audio length in seconds (mel frames at 100/s)")
    p.add_argument(
        "--prompt-tokens",
        default="128",
        metavar="N",
        help="text tokens, markers included; image/audio placeholders come on top (default 128; with --sweep a "
        "comma-separated list)",
    )
    p.add_argument("--new-tokens", default="16", metavar="N", help="tokens generated greedily (default 16)")
    p.add_argument(
        "--batch",
        "-b",
        default=None,
        metavar="B",
        help="sequences per request (default 1); for a .gguf MODEL llama.cpp's logical batch -b (default 2048)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        metavar="D",
        help="weights and activations: float32, float16, bfloat16 (or fp32, fp16, bf16; default: the checkpoint's dtype, torch_dtype in "
        "config.json; float32 when it states none)",
    )
    p.add_argument(
        "--logits",
        choices=("last", "full"),
        default="last",
        help="prefill logits: last position only (transformers >= 4.45, default) or every prompt position in float32 "
        "(older transformers, as many published tables were measured)",
    )
    p.add_argument("--weights-dtype", default=None, metavar="D", help="quantized weights: int8 or int4 (nf4)")
    p.add_argument("--kv-dtype", default=None, metavar="D", help="quantized KV cache: float8 (fp8), int8 or int4")
    p.add_argument(
        "--device-profile",
        "--device",
        dest="device",
        default=[],
        metavar="PROFILE",
        action=renamed(argparse._AppendAction, "--device", "--device-profile"),
        help="device profile id or TOML path (repeatable; the first one gets the suggestions)",
    )
    p.add_argument(
        "--device-state",
        default=None,
        metavar="FILE",
        help="judge the peak against the memory the device has now, as FILE shows it (tegrastats, /proc/meminfo, "
        "free, mem_get_info, llama.cpp device lines, L4T version; see telemetry --replay --request)",
    )
    p.add_argument(
        "--largest-buffer",
        default=None,
        metavar="BYTES",
        help="with --device-state: the request's single largest buffer, judged against the largest free contiguous "
        "block the state shows (tegrastats lfb, jtop), as telemetry --largest-buffer does",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the memory card as JSON")
    fmt.add_argument("--format", choices=("text", "md", "json"), default="text", help="output format (default text)")
    p.add_argument(
        "--sweep",
        action="store_true",
        help="estimate over image sizes, prompt lengths (or audio lengths) and print where the model stops fitting",
    )
    p.add_argument("--no-suggest", action="store_true", help="skip the re-runs that price the suggested changes")
    p.add_argument(
        "--fit",
        default=None,
        metavar="BUDGET|DEVICE",
        help="solve the request backwards: a byte budget (6GiB) or a device profile whose limit the peak must fit",
    )
    p.add_argument(
        "--solve",
        default=None,
        choices=("image", "images", "frames", "prompt-tokens", "new-tokens", "batch", "context"),
        help="with --fit: the setting to make as large as fits (the others as given; context: a .gguf MODEL's -c)",
    )
    p.add_argument(
        "--runtime",
        default=None,
        choices=("transformers", "llama.cpp"),
        help="the runtime to estimate for (default: llama.cpp for a .gguf MODEL, else transformers)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _register_gguf(p)
    p.set_defaults(func=run)


def _register_gguf(p: Any) -> None:
    """llama.cpp's own flags, for a MODEL that is a .gguf file (estimated from its headers)."""
    g = p.add_argument_group("llama.cpp (MODEL.gguf)")
    g.add_argument("--mmproj", default=None, metavar="MMPROJ.gguf", help="the projector GGUF (llama.cpp --mmproj)")
    g.add_argument("--context", "-c", default="0", metavar="N", help="context size (-c; default 0: the model's)")
    g.add_argument("--cache-type-k", "-ctk", default="f16", metavar="T", help="K cache type (f16, q8_0, q4_0, ...)")
    g.add_argument("--cache-type-v", "-ctv", default="f16", metavar="T", help="V cache type (quantized needs -fa)")
    g.add_argument(
        "--flash-attn",
        "-fa",
        nargs="?",
        const="on",
        default="auto",
        choices=("on", "off", "auto"),
        help="flash attention (default auto: on for the CPU and CUDA backends)",
    )
    g.add_argument("--n-gpu-layers", "-ngl", default="0", metavar="N", help="layers offloaded to the GPU (default 0)")
    g.add_argument("--ubatch", "-ub", default="512", metavar="N", help="physical batch (default 512)")
    g.add_argument("--parallel", "-np", default="1", metavar="N", help="parallel sequences (default 1)")
    g.add_argument("--image-min-tokens", default="-1", metavar="N", help="llama.cpp --image-min-tokens")
    g.add_argument("--image-max-tokens", default="-1", metavar="N", help="llama.cpp --image-max-tokens")
    g.add_argument("--no-mmproj-offload", action="store_true", help="keep the projector on the CPU")
    g.add_argument("--budget", default=None, metavar="BYTES", help="judge the peak against BYTES (6GiB, 8e9 ...)")


MAX_BATCH = 4096  # sequences per request; --fit's own limit (estimate/fit.py: 4096 steps)


def _int(value: str, flag: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} takes an integer; got {value!r}") from None
    if abs(number) > 10**12:  # past float range the arithmetic downstream would fail, not refuse
        raise InputError(f"{flag} {value[:20]}{'...' if len(value) > 20 else ''}: too large (at most 10^12)")
    return number


def _ints(value: str, flag: str) -> list[int]:
    return [_int(v.strip(), flag) for v in str(value).split(",") if v.strip()]


def _float(value: str, flag: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} takes a number; got {value!r}") from None
    if not math.isfinite(number):  # inf would reach round(); nan compares false with every bound
        raise InputError(f"{flag} takes a finite number; got {value!r}")
    return number


# The short names PyTorch users type (``torch.bfloat16`` prints as ``bfloat16``; bitsandbytes says
# nf4, transformers' configs fp8): each means the estimator's own name.
_DTYPE_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8",
    "nf4": "int4",
    "fp4": "int4",
}


def _dtype(value: str | None) -> str | None:
    if value is None:
        return None
    name = value.strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def run(args: argparse.Namespace) -> int:
    if str(args.model).lower().endswith(".gguf"):
        if args.runtime == "transformers":
            raise InputError("a .gguf MODEL runs in llama.cpp: --runtime llama.cpp (or leave --runtime out)")
        return _run_gguf(args)
    if args.mmproj or args.budget:
        raise InputError("--mmproj and --budget apply to a .gguf MODEL (llama.cpp)")
    if args.runtime == "llama.cpp" or args.solve == "context":
        raise InputError("--runtime llama.cpp and --solve context take a .gguf MODEL (with --mmproj for its projector)")
    args.batch = args.batch if args.batch is not None else "1"
    from memwarden.commands._common import print_json
    from memwarden.estimation.run import estimate, load_device, parse_image, parse_video, sweep
    from memwarden.report.estimate import card_text, sweep_text
    from memwarden.report.progress import progress

    images = [parse_image(v) for v in args.image]
    videos = [parse_video(v) for v in args.video]
    prompts = _ints(args.prompt_tokens, "--prompt-tokens")
    if not prompts:
        raise InputError("--prompt-tokens takes an integer")
    audio = (
        [_float(v.strip(), "--audio-seconds") for v in args.audio_seconds.split(",")] if args.audio_seconds else None
    )
    new_tokens = _int(args.new_tokens, "--new-tokens")
    batch = _int(args.batch, "--batch")
    if not 1 <= batch <= MAX_BATCH:  # the request's ids are real tensors of batch x tokens, and --fit stops here too
        raise InputError(f"--batch {batch}: give 1 to {MAX_BATCH} sequences per request")
    fmt = "json" if args.json else args.format
    devices = [load_device(d) for d in args.device]
    common: dict[str, Any] = dict(
        new_tokens=new_tokens,
        batch=batch,
        dtype=_dtype(args.dtype),
        weights_dtype=_dtype(args.weights_dtype),
        kv_dtype=_dtype(args.kv_dtype),
    )
    if args.sweep:
        result = sweep(args.model, images=images, prompt_tokens=prompts, audio_seconds=audio, devices=devices, **common)
        if fmt == "json":
            print_json(result.to_json())
        else:
            print(sweep_text(result, markdown=fmt == "md"))
        return 0
    if len(prompts) > 1:
        raise InputError("several --prompt-tokens values need --sweep")
    if audio is not None and len(audio) > 1:
        raise InputError("several --audio-seconds values need --sweep")
    max_pixels = _int(args.max_pixels, "--max-pixels") if args.max_pixels is not None else None
    with progress("estimate", enabled=fmt != "json" and not args.quiet) as step, _nothing_fits(fmt):
        card = estimate(
            args.model,
            images=images,
            audio_seconds=audio[0] if audio else None,
            prompt_tokens=prompts[0],
            device=devices[0] if devices else None,
            suggest=not args.no_suggest,
            max_pixels=max_pixels,
            logits=args.logits,
            videos=videos,
            progress=step,
            fit=args.fit,
            solve=args.solve,
            cache=True,  # a repeated estimate answers from the card kept on disk (estimation/card_store.py)
            **common,
        )
    state = _device_state(args.device_state, card, devices[0] if devices else None, args.largest_buffer)
    if fmt == "json":
        print_json({**card.to_json(), "device_state": state.to_json()} if state else card.to_json())
    elif fmt == "md":
        print(card.to_markdown(devices[1:]))
    else:
        print(card_text(card, devices[1:]), end="")
    if state is not None:
        if fmt != "json":
            print(
                f"against the device state in {terminal_safe(args.device_state)}: {state.verdict} "
                f"({terminal_safe(state.reason)})"
            )
        return 1 if state.verdict == "fails" else 0
    # like partition and check: a device that the request does not fit is a failure a script can see
    return 1 if devices and card.fits is False else 0


@contextlib.contextmanager
def _nothing_fits(fmt: str) -> Iterator[None]:
    """``--fit`` that finds nothing: with ``--json`` the verdict on stdout (``fits`` false, the ``fit``
    block without a value) before the one-line error; either way exit 1, as a plain estimate that
    does not fit (the exit code is the error's own)."""
    from memwarden.commands._common import print_json
    from memwarden.estimation.fit import NothingFits

    try:
        yield
    except NothingFits as exc:
        if fmt == "json":
            print_json({"fits": False, "fit": exc.to_json()})
        raise


def _device_state(path: str | None, card: Any, device: Any, largest_buffer: str | None = None) -> Any:
    """The card's peak judged against the pasted state (``govern.device_state``): device memory on a
    GPU or unified board, host memory on a CPU profile; with ``largest_buffer`` also buffer by buffer
    against the largest free contiguous block (tegrastats ``lfb``), as ``telemetry --largest-buffer``."""
    if path is None:
        if largest_buffer is not None:
            raise InputError(
                "--largest-buffer needs --device-state FILE (the state whose free blocks it is judged against)"
            )
        return None
    from memwarden.commands._common import bytes_option
    from memwarden.govern.device_state import judge, load_state

    largest = None if largest_buffer is None else bytes_option("--largest-buffer", largest_buffer)

    read = load_state(path)
    samples = [s for s in read.samples if s.value("mem_available") or s.value("mem_free") or s.value("device_free")]
    if not samples:
        raise InputError(
            f"--device-state {terminal_safe(path)}: no memory figure ({read.skipped} lines not recognised)"
        )
    kind = "cuda" if device is None or device.kind in ("jetson", "gpu", "datacenter") else "host"
    peak = card.device_peak_bytes
    if largest is not None and largest > peak:
        raise InputError(f"--largest-buffer is larger than the estimated peak ({peak} bytes): one buffer of it")
    return judge(samples[-1], peak, kind, largest_buffer_bytes=largest)


def _run_gguf(args: argparse.Namespace) -> int:
    """A llama.cpp deployment, from the GGUF headers (memwarden.estimation.gguf)."""
    from memwarden.commands._common import print_json
    from memwarden.estimation.run import load_device
    from memwarden.units import parse_bytes

    if sum(x is not None and x != [] for x in (args.budget, args.device or None, args.fit)) > 1:
        raise InputError("give one of --budget, --device-profile or --fit")
    if len(args.device) > 1:
        raise InputError("a .gguf MODEL takes one --device-profile")
    if args.solve not in (None, "context"):
        raise InputError(f"--solve {args.solve}: a .gguf MODEL solves its context (--solve context)")
    budget = None
    device = load_device(args.device[0]) if args.device else None
    if args.budget is not None or args.fit is not None:
        flag, value = ("--budget", args.budget) if args.budget is not None else ("--fit", args.fit)
        try:
            budget = parse_bytes(value)
        except (TypeError, ValueError) as exc:
            if flag == "--budget":
                raise InputError(f"--budget: {exc}") from None
            device = load_device(value)  # --fit DEVICE (an unknown one: its own clear error)

    def at(n_ctx: int) -> Any:
        return _estimate_gguf(args, n_ctx, budget, device)

    if args.fit is not None:
        return _fit_gguf(args, at)
    result = at(_int(args.context, "--context"))
    if args.json or args.format == "json":
        print_json(result.to_json())
    else:
        print(result.to_text(), end="")
    return 1 if result.fits is False else 0


def _estimate_gguf(args: argparse.Namespace, n_ctx: int, budget: int | None, device: Any) -> Any:
    from memwarden.estimation.gguf.estimate import estimate_gguf
    from memwarden.estimation.run import parse_image

    return estimate_gguf(
        args.model,
        mmproj_path=args.mmproj,
        images=tuple(parse_image(v) for v in args.image),
        n_ctx=n_ctx,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
        flash_attn=args.flash_attn,
        n_gpu_layers=_int(args.n_gpu_layers, "--n-gpu-layers"),
        n_batch=_int(args.batch if args.batch is not None else "2048", "--batch"),
        n_ubatch=_int(args.ubatch, "--ubatch"),
        n_parallel=_int(args.parallel, "--parallel"),
        image_min_tokens=_int(args.image_min_tokens, "--image-min-tokens"),
        image_max_tokens=_int(args.image_max_tokens, "--image-max-tokens"),
        mmproj_offload=not args.no_mmproj_offload,
        budget_bytes=budget,
        device=device,
    )


def _fit_gguf(args: argparse.Namespace, at: Any) -> int:
    """``--fit`` for a llama.cpp deployment: the largest -c that fits, and the flags that run it."""
    from memwarden.commands._common import print_json
    from memwarden.estimation.gguf.fit import fit_context
    from memwarden.units import format_bytes

    first = at(0)  # the model's own context: the search's top
    answer = fit_context(at, first.text.n_ctx_train, n_ctx_min=first.image_tokens + 1)  # the images and a token
    flags = _llama_flags(args, answer.n_ctx) if answer.n_ctx is not None else None
    if args.json or args.format == "json":
        print_json({**answer.at.to_json(), "fit": {**answer.to_json(), "flags": flags}})
    elif answer.n_ctx is None:
        print(
            f"does not fit at any context: at -c {answer.next_ctx} the deployment needs "
            f"{format_bytes(answer.at.judged_bytes)} "
            f"of {format_bytes(answer.at.budget_bytes or 0)} (the weights and the projector alone do not fit; "
            f"offload fewer layers, quantize the model or the KV cache, or use a smaller model)"
        )
    else:
        print(answer.at.to_text(), end="")
        top = "the model's whole training context" if answer.next_ctx is None else f"-c {answer.next_ctx} does not"
        nxt = f" ({format_bytes(answer.next.judged_bytes)})" if answer.next is not None else ""
        print(
            f"largest context that fits: -c {answer.n_ctx} ({format_bytes(answer.at.judged_bytes)} of "
            f"{format_bytes(answer.at.budget_bytes or 0)}); {top}{nxt}"
        )
        print("run: " + " ".join(shlex.quote(f) for f in flags or []))
    return 1 if answer.n_ctx is None else 0


def _llama_flags(args: argparse.Namespace, n_ctx: int) -> list[str]:
    """The llama-mtmd-cli command line of the answer (every llama.cpp flag the estimate used)."""
    out = ["llama-mtmd-cli", "-m", str(args.model)]
    if args.mmproj:
        out += ["--mmproj", str(args.mmproj)]
    out += ["-c", str(n_ctx), "-ctk", args.cache_type_k, "-ctv", args.cache_type_v, "-fa", args.flash_attn]
    out += ["-ngl", str(args.n_gpu_layers), "-b", str(args.batch or 2048), "-ub", str(args.ubatch)]
    if str(args.parallel) != "1":
        out += ["-np", str(args.parallel)]
    for flag, value in (("--image-min-tokens", args.image_min_tokens), ("--image-max-tokens", args.image_max_tokens)):
        if str(value) != "-1":
            out += [flag, str(value)]
    if args.no_mmproj_offload:
        out.append("--no-mmproj-offload")
    return out
