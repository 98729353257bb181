"""OWLv2 open-vocabulary detection over a folder of warehouse photos: 8 distinct photos per batch,
inference_mode, outputs post-processed right away; only boxes, scores and labels are kept."""

import numpy as np
import torch
import transformers

import _common as C

EXPECT = None

BATCH = 8
QUERIES = ["forklift", "pallet", "safety vest", "spill"]
model = C.owlv2(image_px=320, patch_px=16, hidden=64, layers=2, vocab=4096)
post = transformers.Owlv2ImageProcessor()
q = torch.tensor([[C.BOS_ID] + C.tokenize(t, 4000) + [C.EOS_ID] + [0] * (3 - len(t.split())) for t in QUERIES])
q = q.repeat(BATCH, 1)

if __name__ == "__main__":
    kept = []
    with torch.inference_mode():
        for b in range(3):
            px = C.normalize(np.stack([C.fake_rgb(320, 320, seed=b * BATCH + i) for i in range(BATCH)]))
            out = model(input_ids=q, attention_mask=(q != 0).long(), pixel_values=px)
            for d in post.post_process_object_detection(out, threshold=0.6, target_sizes=[(320, 320)] * BATCH):
                kept.append({k: v.clone() for k, v in d.items()})
    print("photos:", len(kept), "boxes:", sum(len(d["boxes"]) for d in kept))
