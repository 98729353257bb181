"""memwarden partition MODEL.onnx --device-profile P [--dtype D] [--inputs FEEDS.npz] [--dim NAME=N]
[--json | --html OUT.html]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "partition",
        help="assign an ONNX graph's nodes to a device's compute units (CPU, GPU, NPU) for the lowest latency that fits",
        description="Assign every node of MODEL.onnx to one of the device profile's compute units, minimising the "
        "simulated latency (compute + transfers between units) under each unit's memory limit, and compare with "
        "the usual ways: all-CPU, ONNX Runtime's first-claim by priority, its capacity-aware halting, an "
        "affinity-greedy pass with backtracking and Neurosurgeon's single split. Exit status: 0 the answer fits every "
        "unit, 1 no assignment fits (the least bad one is still shown), 2 bad input.",
    )
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX graph")
    p.add_argument(
        "--device-profile", required=True, metavar="P", help="built-in device id or profile TOML with [[compute_units]]"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "fp16", "bf16", "int8"],
        help="deployment dtype of float tensors (default: the graph's own)",
    )
    p.add_argument(
        "--inputs",
        metavar="FEEDS.npz",
        help="size the graph's dynamic axes from these feeds (the .npz given to trace --onnx)",
    )
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=N",
        help="size a symbolic input dimension, e.g. --dim batch=4 (repeatable; unsized ones are 1)",
    )
    p.add_argument(
        "--time-limit", type=float, default=30.0, metavar="S", help="solver time limit in seconds (default 30)"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--html", metavar="OUT.html", help="write an HTML page")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.commands._common import print_json, wrote
    from memwarden.models.compute_units import load_compute_units
    from memwarden.plan.partition_onnx import problem_of
    from memwarden.plan.partition_report import partition_result
    from memwarden.plan.partition_shapes import load_shaped
    from memwarden.record.onnx.guard import INFERENCE_MEMORY_BYTES, load_checked, memory_limited
    from memwarden.untrusted import finite_float, terminal_safe

    finite_float(args.time_limit, "--time-limit", lo=1e-3, hi=86400)
    if args.html:
        from memwarden.trace.io import check_output

        check_output(args.html, flag="--html", allow_stdout=False)
    units = load_compute_units(args.device_profile)
    # declared sizes against this machine, external data, a regular file: before inference reads it
    model, checked = load_checked(args.model)
    shapes = None
    if args.inputs:
        from memwarden.record.onnx.feeds import feed_headers

        shapes = {name: shape for name, (_, shape) in feed_headers(args.inputs).items()}  # no data is inflated
    dims = _dims(args.dim)
    _check_feed_names(model, shapes)
    del model
    with memory_limited(INFERENCE_MEMORY_BYTES, "shape inference of the graph"):
        shaped = load_shaped(args.model, dims=dims, input_shapes=shapes)
    _note(shaped.assumed_dims, shaped.unsized_values)
    if checked.unbounded:
        print(
            f"memwarden: {', '.join(checked.unbounded[:3])}: control flow without a bound is costed as one pass",
            file=sys.stderr,
        )
    problem = problem_of(shaped.model, units, dtype=args.dtype)
    result = partition_result(problem, time_limit_s=args.time_limit)
    result = {
        "model": terminal_safe(Path(args.model).name),
        "device": args.device_profile,
        "dtype": args.dtype,
        "input_dims": dict(shaped.dims),
        "assumed_dims": list(shaped.assumed_dims),
        "shape_inference": shaped.inference,
        "unsized_values": shaped.unsized_values,
        **result,
    }
    title = f"{terminal_safe(Path(args.model).name)} on {terminal_safe(args.device_profile)}"
    if args.json:
        print_json(result)
    elif args.html:
        from memwarden.report.partition import partition_html
        from memwarden.trace.io import atomic_write

        atomic_write(args.html, partition_html(result, title=title).encode())
        wrote(args.html, f"{problem.num_nodes} nodes")
    else:
        from rich.console import Console

        from memwarden.report.partition import partition_table
        from memwarden.untrusted import markup_safe

        Console().print(partition_table(_markup_safe(result), title=markup_safe(title)))
    return _verdict(result["solution"])


def _verdict(solution: dict[str, Any]) -> int:
    """1 when no assignment keeps every unit within its memory (the result still shows the least
    bad one): a script must not take an assignment that breaks a limit for a plan."""
    if solution["feasible"]:
        return 0
    from memwarden.untrusted import terminal_safe

    first = terminal_safe(solution["violations"][0])[:300] if solution["violations"] else "a unit's memory"
    print(f"memwarden partition: no assignment fits the units' memory ({first})", file=sys.stderr)
    return 1


_MAX_DIM = 1 << 31  # one symbolic dimension (--dim, or a feed's axis)


def _dims(pairs: list[str]) -> dict[str, int]:
    from memwarden.errors import InputError
    from memwarden.untrusted import terminal_safe

    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not name or not value.isascii() or not value.isdigit() or len(value) > 12 or not 1 <= int(value) <= _MAX_DIM:
            raise InputError(
                f"--dim {terminal_safe(pair)[:80]!r}: give NAME=N with N an integer from 1 to {_MAX_DIM} (e.g. --dim batch=4)"
            )
        out[name] = int(value)
    return out


def _check_feed_names(model: Any, shapes: dict[str, tuple[int, ...]] | None) -> None:
    """Feeds name model inputs, and bind an axis like --dim does (at most ``_MAX_DIM``)."""
    from memwarden.errors import InputError
    from memwarden.untrusted import terminal_safe

    if shapes is None:
        return
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v.name for v in model.graph.input if v.name not in initializers]
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise InputError(
            terminal_safe(f"feeds name no model input: {', '.join(unknown[:10])} (inputs: {', '.join(inputs[:20])})")[
                :600
            ]
        )
    for name, shape in shapes.items():
        if any(d > _MAX_DIM for d in shape):
            raise InputError(f"feed {terminal_safe(name)[:80]!r}: shape {shape} has an axis over {_MAX_DIM}")


def _markup_safe(value: Any) -> Any:
    """Every string of a result (node names, unit names, violations) with control characters shown
    and rich markup escaped, for the terminal table."""
    from memwarden.untrusted import markup_safe

    if isinstance(value, str):
        return markup_safe(value)
    if isinstance(value, dict):
        return {(markup_safe(k) if isinstance(k, str) else k): _markup_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_markup_safe(v) for v in value]
    return value


def _note(assumed: tuple[str, ...], unsized: int) -> None:
    """Say on stderr what the costs rest on, so a --json on stdout stays parseable."""
    import sys

    from memwarden.untrusted import terminal_safe

    if assumed:
        print(
            f"memwarden: dynamic axes {terminal_safe(', '.join(assumed[:20]))[:400]} taken as 1 (size them with --inputs or --dim NAME=N)",
            file=sys.stderr,
        )
    if unsized:
        print(f"memwarden: {unsized} node outputs have no inferable shape and count 0 bytes", file=sys.stderr)
