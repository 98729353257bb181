"""Click-to-segment annotation backend on SAM (label-studio-ML-backend style).

The expensive part of SAM is the image encoder, so the backend memoises each image's embedding by
image id and reuses it for every further click on that image. The cache has a capacity setting,
but the deployment config leaves it unset, so every image any annotator ever opened keeps its
(128, 24, 24) embedding (plus the positional grid) for the life of the worker.
"""

from collections import OrderedDict

import numpy as np
import torch

import _common as C

EXPECT = None

SETTINGS = {
    "embedding_cache_capacity": 8,
}

model = C.sam(image_px=384, patch_px=16, hidden=64, layers=2, out_channels=128)


class SamBackend:
    def __init__(self, capacity):
        self.capacity = capacity
        self.embeddings: "OrderedDict[str, torch.Tensor]" = OrderedDict()

    @torch.no_grad()
    def _embedding(self, image_id: str, rgb: np.ndarray) -> torch.Tensor:
        if image_id in self.embeddings:
            self.embeddings.move_to_end(image_id)
            return self.embeddings[image_id]
        x = C.resize(C.normalize(rgb).unsqueeze(0), 384, 384)
        emb = model.get_image_embeddings(x)
        emb = emb if torch.is_tensor(emb) else emb[0]
        self.embeddings[image_id] = emb
        if self.capacity is not None and len(self.embeddings) > self.capacity:
            self.embeddings.popitem(last=False)
        return emb

    @torch.no_grad()
    def predict(self, image_id: str, rgb: np.ndarray, click_xy) -> torch.Tensor:
        emb = self._embedding(image_id, rgb)
        pts = torch.tensor([[[click_xy]]], dtype=torch.float)
        out = model(
            image_embeddings=emb,
            input_points=pts,
            input_labels=torch.ones(1, 1, 1, dtype=torch.long),
            multimask_output=False,
        )
        return (out.pred_masks[0, 0, 0] > 0).clone()


if __name__ == "__main__":
    backend = SamBackend(SETTINGS["embedding_cache_capacity"])
    task_ids = [f"task-{i}" for i in range(30)]
    for req in range(60):  # annotators move on through the queue, occasionally re-clicking the same image
        tid = task_ids[req // 2]
        rgb = C.fake_rgb(96, 128, seed=hash(tid) % 1000)
        mask = backend.predict(tid, rgb, (40.0 + req % 7, 60.0))
    print("cached embeddings:", len(backend.embeddings), "last mask:", tuple(mask.shape))
