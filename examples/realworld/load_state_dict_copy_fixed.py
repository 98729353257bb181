"""Fixed twin of ``load_state_dict_copy.py``: meta-device build, mmap'd checkpoint, ``assign=True``.

Source: https://pytorch.org/tutorials/recipes/recipes/module_load_state_dict_tips.html
    "state_dict = torch.load('checkpoint.pth', mmap=True)
     with torch.device('meta'):
         meta_m = SomeModule(1000)
     meta_m.load_state_dict(state_dict, assign=True)"
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

EXPECT = None


def build() -> nn.Module:
    return nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(8)))


def main() -> None:
    path = Path(tempfile.mkdtemp(prefix="memwarden-rw-")) / "checkpoint.pth"
    torch.manual_seed(0)
    torch.save(build().state_dict(), path)
    state_dict = torch.load(path, mmap=True)
    with torch.device("meta"):
        m = build()
    m.load_state_dict(state_dict, assign=True)
    with torch.no_grad():
        print(float(m(torch.randn(4, 1024)).mean()))


if __name__ == "__main__":
    main()
