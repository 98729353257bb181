"""Crafted .mwtrace files (issue 16): every value a command relies on is checked at load, so each file
is refused with one TraceFormatError or works in every command — never a traceback later."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memwarden.commands._common import print_json
from memwarden.trace.format import FORMAT_MAGIC, dumps, loads
from memwarden.trace.model import Trace, TraceFormatError

BASE = Path(__file__).parent / "fixtures" / "cuda_cpu.mwtrace"


def _base() -> Trace:
    return loads(BASE.read_bytes())


def _mutated(events: Any = None, spans: Any = None, metadata: Any = None, shapes: Any = None) -> bytes:
    base = _base()
    ev = {k: v.copy() for k, v in base.events.items()}
    sp = {k: v.copy() for k, v in base.spans.items()}
    md = json.loads(json.dumps(base.metadata))
    for fn, target in ((events, ev), (spans, sp), (metadata, md)):
        if fn is not None:
            fn(target)
    trace = Trace(
        events=ev,
        spans=sp,
        strings=list(base.strings),
        shapes=list(base.shapes) if shapes is None else shapes,
        devices=list(base.devices),
        metadata=md,
    )
    return dumps(trace)


def _first(column: str, value: int, index: int = 0):
    def set_it(table: dict) -> None:
        table[column][index] = value

    return set_it


def _meta(key: str, value: Any):
    return lambda md: md.__setitem__(key, value)


def _header_edit(edit) -> bytes:
    """The base file with its JSON header changed by ``edit`` (payload and checksum kept consistent)."""
    data = BASE.read_bytes()
    fixed = len(FORMAT_MAGIC) + 12
    _version, length = struct.unpack("<IQ", data[len(FORMAT_MAGIC) : fixed])
    header = json.loads(data[fixed : fixed + length])
    start = fixed + length + (-(fixed + length)) % 64
    payload = data[start:]
    edit(header)
    header["payload_crc32"] = zlib.crc32(payload)
    raw = json.dumps(header, separators=(",", ":")).encode()
    head = FORMAT_MAGIC + struct.pack("<IQ", 1, len(raw)) + raw
    return head + b"\0" * ((-len(head)) % 64) + payload


def _unaligned(header: dict) -> None:
    column = next(c for c in header["columns"] if c["name"] == "events.nbytes")
    column["offset"] += 1


REFUSED = {
    "span modality out of range": lambda: _mutated(spans=_first("modality", 200)),
    "span phase out of range": lambda: _mutated(spans=_first("phase", 200)),
    "span parent past the table": lambda: _mutated(spans=_first("parent", 99_999)),
    "span parent negative": lambda: _mutated(spans=_first("parent", -7)),
    "span parents in a cycle": lambda: _mutated(
        spans=lambda s: s["parent"].__setitem__(slice(None), np.arange(len(s["parent"])))
    ),
    "unsorted times": lambda: _mutated(events=lambda e: [e.__setitem__(k, v[::-1].copy()) for k, v in list(e.items())]),
    "time near 2**63": lambda: _mutated(events=_first("time_us", 2**63 - 1, -1)),
    "size 2**63-1": lambda: _mutated(events=_first("nbytes", 2**63 - 1)),
    "negative size": lambda: _mutated(events=_first("nbytes", -1)),
    "huge shape dimensions": lambda: _mutated(shapes=[(2**62, 2**62)] * len(_base().shapes)),
    "negative shape dimension": lambda: _mutated(shapes=[(-5, 3)] * len(_base().shapes)),
    "annotations not a list": lambda: _mutated(metadata=_meta("annotations", "x")),
    "annotation not an object": lambda: _mutated(metadata=_meta("annotations", [1])),
    "annotation time not a number": lambda: _mutated(metadata=_meta("annotations", [{"time_us": "x"}])),
    "device not a string": lambda: _mutated(metadata=_meta("device", {"a": [1]})),
    # dumps writes non-finite numbers as null (what memwarden saves always loads), so these are
    # crafted in the header's JSON text, as a hostile file would be
    "infinite started_at": lambda: _header_edit(lambda h: h["metadata"].__setitem__("started_at", float("inf"))),
    "NaN deep in metadata": lambda: _header_edit(lambda h: h["metadata"].__setitem__("x", {"y": [float("nan")]})),
    "unaligned column": lambda: _header_edit(_unaligned),
    "a header of empty shapes": lambda: _header_edit(lambda h: h.__setitem__("shapes", [[]] * 3_000_000)),
}

HARMLESS = {  # loaded; commands read them through steps_of, which skips what is malformed
    "steps a string": lambda: _mutated(metadata=_meta("steps", "x")),
    "steps of ints": lambda: _mutated(metadata=_meta("steps", [1, 2])),
    "steps with bad fields": lambda: _mutated(metadata=_meta("steps", [{"start_us": "x"}, {"name": 5}])),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_crafted_trace_is_refused_at_load(case):
    with pytest.raises(TraceFormatError):
        loads(REFUSED[case]())


@pytest.mark.parametrize("case", sorted(HARMLESS))
def test_malformed_steps_load(case):
    assert loads(HARMLESS[case]()).num_events > 0


COMMANDS = (["summary", "--json"], ["diagnose", "--json"], ["report", "-o", "{out}"], ["replay", "--json"])


@pytest.mark.parametrize("case", ["span modality out of range", "infinite started_at", "steps with bad fields"])
def test_commands_give_one_error_line_or_work(tmp_path, case):
    path = tmp_path / "crafted.mwtrace"
    path.write_bytes({**REFUSED, **HARMLESS}[case]())
    for command in COMMANDS:
        args = [a.format(out=tmp_path / "out.html") for a in command]
        proc = subprocess.run(
            [sys.executable, "-m", "memwarden.cli", *args, str(path)], capture_output=True, text=True, timeout=300
        )
        assert "Traceback" not in proc.stderr, (command, proc.stderr[-3000:])
        if proc.returncode != 0:
            assert len(proc.stderr.strip().splitlines()) == 1, (command, proc.stderr)
        elif "--json" in command:
            json.loads(proc.stdout, parse_constant=lambda c, command=command: pytest.fail(f"{command} printed {c}"))


def test_json_output_never_holds_infinity_or_nan(capsys):
    print_json({"ratio": float("inf"), "values": [np.float64("nan"), 1.5], "ok": 2})
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"printed {c}"))
    assert out == {"ratio": None, "values": [None, 1.5], "ok": 2}
