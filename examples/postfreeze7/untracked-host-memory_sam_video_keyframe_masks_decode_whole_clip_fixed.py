"""Per-frame SAM masks for a 1080p inspection video (box prompt propagated from the first frame).

The script decodes the whole clip into a list of (1080, 1920, 3) uint8 numpy frames up front
(the ffmpeg-to-numpy idiom) and then walks the list; SAM only ever needs one frame at a time.
The decoded frames live in numpy buffers outside torch's allocator.
"""

import numpy as np
import torch

import _common as C

EXPECT = None

N_FRAMES = 48
H, W = 1080, 1920

model = C.sam(image_px=256, patch_px=16, hidden=64, layers=2, out_channels=32)


def decode_frames(n: int):
    """Stands in for reading raw rgb24 frames from an ffmpeg pipe, one np.frombuffer per frame."""
    for i in range(n):
        raw = C.fake_rgb(H, W, seed=i).tobytes()
        yield np.frombuffer(raw, dtype=np.uint8).reshape(H, W, 3)


@torch.no_grad()
def mask_for(frame: np.ndarray, box) -> torch.Tensor:
    small = C.pil_resize(frame, 144, 256)
    x = C.resize(C.normalize(small).unsqueeze(0), 256, 256)
    out = model(pixel_values=x, input_boxes=torch.tensor([[box]], dtype=torch.float), multimask_output=False)
    return (out.pred_masks[0, 0, 0] > 0).clone()


if __name__ == "__main__":
    frames = decode_frames(N_FRAMES)  # lazily, one frame at a time
    box = [60.0, 40.0, 180.0, 200.0]
    areas = []
    for frame in frames:
        areas.append(int(mask_for(frame, box).sum()))
    print("frames:", len(areas), "mean mask area:", sum(areas) / len(areas))
