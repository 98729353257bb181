"""Audio devices' open parameters from ALSA's procfs, and the sound server in front of them.

``/proc/asound/cardN/pcmMD/subK/hw_params`` holds "closed" or the negotiated ``rate: 44100``;
a stream open at a different rate than the pipeline expects is resampled by someone, or not.
The sound server (PipeWire, PulseAudio) is found by process name; its configured clock rate
comes from its config files where they set one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memwarden.edge.doctor.sources._read import read_text

_FIELD = re.compile(r"^(\w+):\s*(\S+)", re.M)
_SERVER_RATE = (
    (
        "pipewire",
        ("/etc/pipewire/pipewire.conf", "~/.config/pipewire/pipewire.conf"),
        r"default\.clock\.rate\s*=\s*(\d+)",
    ),
    ("pulseaudio", ("/etc/pulse/daemon.conf", "~/.config/pulse/daemon.conf"), r"^\s*default-sample-rate\s*=\s*(\d+)"),
)


def _devices(root: Path) -> list[dict[str, Any]]:
    devices = []
    for params in sorted(root.glob("card*/pcm*/sub*/hw_params")):
        raw = read_text(params, 4096)
        sub, pcm, card = params.parent, params.parent.parent, params.parent.parent.parent
        entry: dict[str, Any] = {
            "id": f"{card.name}/{pcm.name}/{sub.name}",
            "direction": "capture" if pcm.name.endswith("c") else "playback",
            "name": ((read_text(card / "id", 128) or "").strip() or None),
        }
        if raw is None:
            entry["state"] = "unreadable"
        elif raw.strip() == "closed":
            entry["state"] = "closed"
        else:
            fields = dict(_FIELD.findall(raw))
            entry.update(state="open", format=fields.get("format"))
            for key, name in (("rate", "rate_hz"), ("channels", "channels")):
                if fields.get(key, "").isdigit():
                    entry[name] = int(fields[key])
        devices.append(entry)
    return devices


def _sound_server() -> dict[str, Any] | None:
    names = set()
    try:
        for comm in Path("/proc").glob("[0-9]*/comm"):
            names.add((read_text(comm, 64) or "").strip())
    except OSError:
        pass
    for server, configs, pattern in _SERVER_RATE:
        if server in names:
            rate = None
            for config in configs:
                raw = read_text(Path(config).expanduser())
                if raw and (match := re.search(pattern, raw, re.M)):
                    rate = int(match.group(1))
            return {"name": server, "rate_hz": rate}
    return None


def collect(root: str = "/proc/asound") -> dict[str, Any]:
    base = Path(root)
    if not base.is_dir():
        return {"status": "not present", "devices": [], "sound_server": _sound_server()}
    return {"status": "present", "devices": _devices(base), "sound_server": _sound_server()}
