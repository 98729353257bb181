"""Fixed twin of ``load_then_half.py``: meta device, mmap, assign.

The model is built on the meta device (shapes only, no memory), the float16
checkpoint is opened with ``torch.load(path, mmap=True)`` (file-backed pages
the kernel can drop and reload, not a heap copy) and
``load_state_dict(state, assign=True)`` makes the mapped tensors the
parameters. Weights exist once, in float16; nothing is cast.

Run: ``python load_then_half_fixed.py`` or ``memwarden trace load_then_half_fixed.py``.
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch import nn

MEL_BINS, WIDTH, LAYERS = 80, 768, 6


class SpeechEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.audio_encoder = nn.Sequential(
            nn.Linear(MEL_BINS, WIDTH), *(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(LAYERS))
        )
        self.audio_projector = nn.Linear(WIDTH, WIDTH)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        return self.audio_projector(self.audio_encoder(mels))  # (B, frames, WIDTH)


def write_checkpoint(path: str) -> None:
    """Stands in for the training job that exported the float16 checkpoint."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in SpeechEncoder().state_dict().items()}
    torch.save({k: torch.randn(s, dtype=torch.float16) * 0.02 for k, s in shapes.items()}, path)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "speech_encoder.pt")
        write_checkpoint(path)

        with torch.device("meta"):
            model = SpeechEncoder()  # shapes only
        state = torch.load(path, mmap=True, weights_only=True)  # file-backed, float16
        model.load_state_dict(state, assign=True)  # the parameters are the mapped tensors
        model = model.eval()

        mels = torch.randn(1, 200, MEL_BINS, dtype=torch.float16)  # (B, frames, mel bins)
        with torch.inference_mode():
            features = model(mels)
        print("features", tuple(features.shape), features.dtype)
        del model, state, features  # unmap before the directory goes away


if __name__ == "__main__":
    main()
