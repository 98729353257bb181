"""The child side of ``capture.onnx.bounded``: one ONNX Runtime session run in a fresh interpreter
under an address-space limit, its profile and outputs printed as JSON (its errors as one line).

Apart from ``bounded`` so that the parent, which ``session`` imports, never imports ``session``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.record.onnx.guard import vm_size


def _child(config: dict[str, Any]) -> dict[str, Any]:
    import resource

    import onnxruntime  # noqa: F401 - loaded before the limit is set, so its libraries are not counted

    from memwarden.record.onnx.feeds import load_feeds
    from memwarden.record.onnx.session import OrtSettings, profiled_session

    feeds = [load_feeds(p) for p in config["feeds"]]
    settings = OrtSettings(**config["settings"])
    cap = vm_size() + int(config["memory_bytes"])
    if cap > int(config["memory_bytes"]):
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    profile, _, outputs = profiled_session(
        config["model"], feeds, settings, Path(config["workdir"]), config["prefix"], optimized=bool(config["optimized"])
    )
    return {"profile": str(profile), "outputs": outputs}


if __name__ == "__main__":
    try:
        print(json.dumps(_child(json.loads(sys.argv[1]))))
    except MemoryError:
        print("memwarden: memory limit reached", file=sys.stderr)
        raise SystemExit(3) from None
    except InputError as exc:
        text = str(exc)
        if "bad_alloc" in text or "Failed to allocate" in text:
            print(f"memwarden: memory limit reached ({text[:200]})", file=sys.stderr)
        else:
            print(f"memwarden: {text}", file=sys.stderr)
        raise SystemExit(2) from None
