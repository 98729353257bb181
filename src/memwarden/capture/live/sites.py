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
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SiteConfig", "library_prefixes"]

_LIBRARIES = ("torch", "transformers", "accelerate", "memwarden", "numpy", "safetensors", "tokenizers")


def _dirs(path: str | os.PathLike[str]) -> set[str]:
    """The directory as code objects may name it: as given (made absolute) and resolved."""
    out = set()
    for text in (os.path.abspath(os.fspath(path)), os.path.realpath(os.fspath(path))):
        out.add(text if text.endswith(os.sep) else text + os.sep)
    return out


def library_prefixes() -> list[str]:
    """Directories whose code is not the user's, each ending with a separator."""
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
    return sorted(found)


@dataclass(frozen=True)
class SiteConfig:
    """What the recorder records of the Python stack at each allocation."""

    lines: bool = True  # the innermost user frame of each allocation
    stacks: bool = False  # the whole Python stack of each allocation
    user_code: tuple[str, ...] = ()
    library_code: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, *, lines: bool, stacks: bool, user_code: Iterable[str | os.PathLike[str]] | str | None,
        library_code: Iterable[str | os.PathLike[str]] | str | None,
    ) -> SiteConfig:  # fmt: skip
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
