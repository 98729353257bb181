"""Which code is the user's, for source lines (the recorder's ``configure_sites``).

A frame is the user's unless its file lies in the standard library, in an installed package
(site-packages, which holds torch, transformers and accelerate), in memwarden itself or in
torch/transformers/accelerate wherever they are installed (an editable install lives outside
site-packages). ``user_code`` prefixes widen that (they win over everything), ``library_code``
prefixes narrow it.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

__all__ = ["CallSites", "SiteConfig", "apply_call_sites", "library_prefixes"]

_LIBRARIES = ("torch", "transformers", "accelerate", "memwarden", "numpy", "safetensors", "tokenizers")


def _dirs(path: str | os.PathLike[str]) -> set[str]:
    """The directory as code objects may name it: as given (made absolute) and resolved."""
    out = set()
    for text in (os.path.abspath(os.fspath(path)), os.path.realpath(os.fspath(path))):
        out.add(text if text.endswith(os.sep) else text + os.sep)
    return out


def library_prefixes() -> list[str]:
    """Directories whose code is not the user's, each ending with a separator."""
    return list(_library_prefixes())


@lru_cache(maxsize=1)  # installed locations do not move during a run; each capture asks
def _library_prefixes() -> tuple[str, ...]:
    found: set[str] = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if key in paths:
            found |= _dirs(paths[key])
    for p in [*site.getsitepackages(), site.getusersitepackages()]:
        found |= _dirs(p)
    for name in _LIBRARIES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            found |= _dirs(location)
    found |= _dirs(Path(__file__).resolve().parents[2])  # memwarden's own package
    return tuple(sorted(found))


@dataclass(frozen=True)
class SiteConfig:
    """What the recorder records of the Python stack at each allocation."""

    lines: bool = True  # the innermost user frame of each allocation
    stacks: bool = False  # the whole Python stack of each allocation
    user_code: tuple[str, ...] = ()
    library_code: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        *,
        lines: bool,
        stacks: bool,
        user_code: Iterable[str | os.PathLike[str]] | str | None,
        library_code: Iterable[str | os.PathLike[str]] | str | None,
    ) -> SiteConfig:
        def paths(value: Iterable[str | os.PathLike[str]] | str | None) -> tuple[str, ...]:
            if value is None:
                return ()
            items = [value] if isinstance(value, str | os.PathLike) else list(value)
            return tuple(os.path.realpath(os.fspath(p)) for p in items)

        return cls(lines=lines or stacks, stacks=stacks, user_code=paths(user_code), library_code=paths(library_code))

    def apply(self, recorder: object) -> None:
        """Configure the native recorder (before it starts)."""
        configure = getattr(recorder, "configure_sites", None)
        if configure is None:
            return
        library = [*library_prefixes(), *self.library_code]
        configure(self.lines, self.stacks, list(self.user_code), library)


class CallSites:
    """The user's line that called each step (a root module call): the innermost frame of the
    user's code on the calling thread's stack, outside the module-call machinery, classified as
    the recorder classifies frames (the same prefixes). ``"file:line:function"``, or None."""

    def __init__(self, config: SiteConfig) -> None:
        self._user = config.user_code
        self._library = (*library_prefixes(), *config.library_code)
        self._codes: dict[CodeType, bool] = {}  # each code object classified once

    def _is_user(self, file: str) -> bool:  # native.cpp's is_user_file
        if self._user and file.startswith(self._user):
            return True
        return not file.startswith(self._library) and not file.startswith("<frozen ")

    def of_caller(self) -> str | None:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            user = self._codes.get(code)
            if user is None:
                user = self._codes[code] = self._is_user(code.co_filename)
            if user:
                name = getattr(code, "co_qualname", code.co_name)
                return f"{code.co_filename}:{frame.f_lineno}:{name}"
            frame = frame.f_back
        return None

    def called_from_user(self) -> bool:
        """Whether the module call under way was made by the user's own script code: the first frame
        outside the module-call machinery (torch's, memwarden's hooks) is a user frame that is not a
        module's own method (``clip.vision_model(pixels)`` in a script; not ``generate`` calling a
        model's part, nor a hand-written model's ``step`` calling its layers)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            file = frame.f_code.co_filename
            if not file.startswith(_machinery()):
                user = self._codes.get(frame.f_code)
                if user is None:
                    user = self._codes[frame.f_code] = self._is_user(file)
                return user and not _is_module(frame.f_locals.get("self"))
            frame = frame.f_back
        return False


def _is_module(obj: object) -> bool:
    """Whether ``obj`` is a torch.nn.Module (read from its classes' names: no torch import here)."""
    return obj is not None and any(
        c.__name__ == "Module" and c.__module__ == "torch.nn.modules.module" for c in type(obj).__mro__
    )


@lru_cache(maxsize=1)
def _machinery() -> tuple[str, ...]:
    """Where the module-call machinery lives: torch.nn and memwarden's recorder (its hooks). The rest
    of memwarden is a library like transformers: a GovernedSession calling a model's part is not the
    user's script calling it."""
    spec = importlib.util.find_spec("torch")
    torch_nn = os.path.join(os.path.dirname(os.path.realpath(spec.origin)), "nn") if spec and spec.origin else None
    mine = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # memwarden/record
    return tuple(p for p in (torch_nn, mine) if p)


def apply_call_sites(steps: list[dict[str, Any]], call_sites: dict[int, str], t0_ns: int) -> None:
    """Write each step's ``call_site`` into ``metadata["steps"]`` entries (``start_us`` as the
    capture's clock gives it, ``call_sites`` keyed by the step's start in recorder ns)."""
    by_us = {max(0, (start_ns - t0_ns) // 1000): site for start_ns, site in call_sites.items()}
    for step in steps:
        site = by_us.get(step.get("start_us", -1))
        if site is not None:
            step["call_site"] = site
