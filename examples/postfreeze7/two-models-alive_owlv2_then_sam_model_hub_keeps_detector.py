"""Grounded-SAM-style labelling job: OWLv2 finds "forklift" / "pallet" boxes, then SAM turns every
box into a mask.

Models come from a small hub object that loads on first use and memoises in a dict. The job runs
the detector over all images, then asks the hub for SAM; the detector stays in the hub's dict (it
is never used again), so both models' weights are resident through the segmentation phase.
"""

import gc

import numpy as np
import torch
import transformers

import _common as C

EXPECT = "two-models-alive"
FIX_WORDS = ["del", "release", "unload", "gc.collect", "detector"]

LOADERS = {
    "detector": lambda: C.owlv2(image_px=224, patch_px=16, hidden=256, layers=4, vocab=49408),
    "segmenter": lambda: C.sam(image_px=256, patch_px=16, hidden=384, layers=6, out_channels=64),
}


class ModelHub:
    def __init__(self):
        self.loaded = {}

    def get(self, name: str) -> torch.nn.Module:
        if name not in self.loaded:
            self.loaded[name] = LOADERS[name]()  # MISTAKE
        return self.loaded[name]


hub = ModelHub()
post = transformers.Owlv2ImageProcessor()
queries = torch.tensor(
    [[C.BOS_ID] + C.tokenize("forklift", 49000) + [C.EOS_ID], [C.BOS_ID] + C.tokenize("pallet", 49000) + [C.EOS_ID]]
)


@torch.no_grad()
def detect(images) -> list[torch.Tensor]:
    det = hub.get("detector")
    boxes = []
    for img in images:
        x = C.resize(C.normalize(img).unsqueeze(0), 224, 224)
        out = det(input_ids=queries, attention_mask=torch.ones_like(queries), pixel_values=x)
        r = post.post_process_object_detection(out, threshold=0.0, target_sizes=[(256, 256)])[0]
        top = r["scores"].argsort(descending=True)[:3]
        boxes.append(r["boxes"][top].clamp(0, 256))
    return boxes


@torch.no_grad()
def segment(images, boxes) -> list[torch.Tensor]:
    seg = hub.get("segmenter")
    masks = []
    for img, b in zip(images, boxes):
        x = C.resize(C.normalize(img).unsqueeze(0), 256, 256)
        out = seg(pixel_values=x, input_boxes=b.unsqueeze(0), multimask_output=False)
        masks.append((out.pred_masks[0, :, 0] > 0).clone())
    return masks


if __name__ == "__main__":
    images = [C.fake_rgb(300, 400, seed=i) for i in range(6)]
    boxes = detect(images)
    masks = segment(images, boxes)
    gc.collect()
    print("masks per image:", [tuple(m.shape) for m in masks])
