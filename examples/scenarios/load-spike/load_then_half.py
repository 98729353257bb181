"""A float16 checkpoint loaded into a float32 model, then cast with ``.half()``.

What is wrong: a speech encoder ships as a float16 checkpoint. The script
does what most tutorials show: build the model (float32 weights, randomly
initialised), ``torch.load`` the whole state dict into RAM, copy it in with
``load_state_dict`` and cast with ``.half()``. At the moment of the cast three
copies of the weights are alive -- the float32 model (2x), the loaded state
dict (1x) and the float16 weights being made -- so the load phase peaks at
about 3x the float16 weights the run keeps.

The fix (``load_then_half_fixed.py``): build the model on the meta device (no
memory), ``torch.load(path, mmap=True)`` (the checkpoint stays in the page
cache, file-backed) and ``load_state_dict(state, assign=True)`` so the
parameters *are* the mapped float16 tensors. One copy, in the right dtype.

Run: ``python load_then_half.py`` or ``memwarden trace load_then_half.py``.
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

        model = SpeechEncoder()  # float32 weights, randomly initialised
        state = torch.load(path)  # a second, full copy in RAM
        model.load_state_dict(state)
        model = model.half().eval()  # a third copy, while the other two are alive

        mels = torch.randn(1, 200, MEL_BINS, dtype=torch.float16)  # (B, frames, mel bins)
        with torch.inference_mode():
            features = model(mels)
        print("features", tuple(features.shape), features.dtype)


if __name__ == "__main__":
    main()
