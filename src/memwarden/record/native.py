"""Builds and loads the native CPU allocation recorder (native.cpp).

The extension is compiled once per (torch version, source hash) into a cache
folder (``$MEMWARDEN_CACHE`` or ``~/.cache/memwarden``) with torch's own
cpp_extension tooling; ``make install`` builds it ahead of time with
``python -m memwarden.record.native --build``. A ``pip install`` builds nothing: the first capture
builds it, saying so on stderr in one line first (it takes about a minute). Where no compiler is
found (``$CXX``, else ``c++``) the build is not tried; :func:`memwarden.record.python_recorder.recorder`
then captures with the pure-Python recorder instead.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

_SOURCE = Path(__file__).with_name("native.cpp")
_CFLAGS = [
    "-O2",
    "-std=c++17",
    "-DNDEBUG",
]  # NDEBUG: torch's headers assert debug-only state that release libtorch never sets


class NativeRecord(enum.IntEnum):
    """What a row of the recorder's log is (its ``action`` column), numbered as native.cpp's
    ``enum { kAlloc, kFree, kEnter, kExit }``; the meta recorder logs the same codes.

    ENTER and EXIT mark module calls, not memory: their codes equal the trace's ``Action.MAP`` and
    ``Action.UNMAP``, so a recorder row never goes into a Trace without passing through
    attribution, which keeps only ALLOC and FREE rows.
    """

    ALLOC = 0
    FREE = 1
    ENTER = 2  # a module call starts; the row's id is the module's context
    EXIT = 3


class NativeUnavailable(RuntimeError):
    """The recorder could not be built here (no compiler, no headers)."""


BUILD_NOTICE = "memwarden: building the native capture hook (once per torch and numpy version, about a minute)..."
_FAILED: list[NativeUnavailable] = []  # a build that failed is not tried again in this process


def short_reason(exc: BaseException) -> str:
    """The first line of why the recorder is unavailable, short enough for one line of stderr."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _build_dir() -> Path:
    import torch

    tag = f"torch{torch.__version__.replace('+', '_')}-py{sys.version_info[0]}{sys.version_info[1]}-{_digest()}"
    root = Path(os.environ.get("MEMWARDEN_CACHE", Path.home() / ".cache" / "memwarden"))
    return root / "native" / tag


def _digest() -> str:
    import numpy  # its headers are compiled in (the data-memory handler): a new numpy, a new build

    text = _SOURCE.read_bytes() + " ".join(_CFLAGS).encode() + numpy.__version__.encode()
    return hashlib.sha256(text).hexdigest()[:12]


def _module_name() -> str:
    return "memwarden_native_" + _digest()


def _load_built(directory: Path, name: str) -> ModuleType | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = directory / f"{name}{suffix}"
        if path.exists():
            import torch  # noqa: F401  (the extension links against libtorch, loaded by importing torch)

            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


@lru_cache(maxsize=1)
def load(verbose: bool = False) -> ModuleType:
    """Import the recorder, compiling it first if this machine has no build of it."""
    directory = _build_dir()
    name = _module_name()
    module = _load_built(directory, name)
    if module is not None:
        return module
    if _FAILED:
        raise _FAILED[0]
    compiler = os.environ.get("CXX", "c++")  # what torch's cpp_extension compiles with
    if shutil.which(compiler) is None:
        _FAILED.append(NativeUnavailable(f"no C++ compiler to build the native capture hook ({compiler!r} not found)"))
        raise _FAILED[0]
    print(BUILD_NOTICE, file=sys.stderr, flush=True)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import numpy
        from torch.utils import cpp_extension

        return cpp_extension.load(
            name=name,
            sources=[str(_SOURCE)],
            build_directory=str(directory),
            extra_cflags=_CFLAGS,
            extra_include_paths=[numpy.get_include()],
            verbose=verbose,
        )
    except Exception as exc:  # headers missing, a compiler that fails, ...
        _FAILED.append(NativeUnavailable(f"could not build memwarden's native capture hook: {exc}"))
        raise _FAILED[0] from exc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--build":
        module = load(verbose="-v" in args)
        print(f"memwarden native recorder ready: {module.__file__}")
        return 0
    print("usage: python -m memwarden.record.native --build [-v]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
