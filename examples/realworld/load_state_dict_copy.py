"""A model built with random init, then ``load_state_dict(torch.load(ckpt))``: two full copies.

Source: https://pytorch.org/tutorials/recipes/recipes/module_load_state_dict_tips.html
    "m = SomeModule(1000)
     state_dict = torch.load('checkpoint.pth')
     m.load_state_dict(state_dict)
     ... the module is first initialized on CPU ... and then the state_dict is loaded, so at the
     peak both the initialized parameters and the checkpoint are in memory."

Fix (``_fixed``): build on the meta device and ``load_state_dict(torch.load(path, mmap=True),
assign=True)``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

EXPECT = "load-spike"
FIX_WORDS = ("meta", "mmap")


def build() -> nn.Module:
    return nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(8)))


def main() -> None:
    path = Path(tempfile.mkdtemp(prefix="memwarden-rw-")) / "checkpoint.pth"
    torch.manual_seed(0)
    torch.save(build().state_dict(), path)
    m = build()
    state_dict = torch.load(path)  # MISTAKE
    m.load_state_dict(state_dict)
    del state_dict
    with torch.no_grad():
        print(float(m(torch.randn(4, 1024)).mean()))


if __name__ == "__main__":
    main()
