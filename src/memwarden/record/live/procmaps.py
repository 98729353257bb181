"""Which addresses are file-backed: parsed from /proc/self/maps (Linux).

On small devices mapping checkpoint files is the main way to keep weights out
of anonymous memory, so a tensor whose storage lies in a mapping of a regular
file is counted apart from allocator memory.
"""

from __future__ import annotations

import bisect
from pathlib import Path


class FileMappings:
    """Sorted (start, end, path) ranges of file-backed mappings of this process."""

    def __init__(self, maps_path: str = "/proc/self/maps") -> None:
        self._maps_path = Path(maps_path)
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, str]] = []
        self._stale = False

    def invalidate(self) -> None:
        """Forget the mappings; the next lookup reads them again. Reading /proc/self/maps of a
        torch process costs milliseconds, and most captures never ask (only storages PyTorch's
        allocator did not make can lie in a file)."""
        self._stale = True

    def refresh(self) -> None:
        ranges: list[tuple[int, int, str]] = []
        try:
            text = self._maps_path.read_text()
        except OSError:  # not Linux: nothing is known to be file-backed
            text = ""
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            # Only regular files: not [heap], [stack], anonymous, /dev/zero, deleted shm or shared libraries.
            if not path.startswith("/") or path.startswith("/dev/") or path.endswith(" (deleted)"):
                continue
            if ".so" in path.rsplit("/", 1)[-1] or path.endswith((".py", ".pyc")):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((lo, hi, path))
        ranges.sort()
        self._ranges = ranges
        self._starts = [r[0] for r in ranges]
        self._stale = False

    def file_of(self, address: int) -> str | None:
        if self._stale:
            self.refresh()
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            lo, hi, path = self._ranges[i]
            if lo <= address < hi:
                return path
        return None
