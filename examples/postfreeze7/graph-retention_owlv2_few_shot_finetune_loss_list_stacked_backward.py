"""Few-shot adaptation of OWLv2 to a new defect class on solar-panel photos.

The loop computes a box-level loss per labelled photo (one forward per photo, since every photo has
its own number of boxes), appends each loss tensor to a list and calls
torch.stack(losses).mean().backward() once per epoch, so every photo's forward graph (ViT over
~400 patches + the detection heads) stays alive until the end of the epoch.
"""

import numpy as np
import torch

import _common as C

EXPECT = "graph-retention"
FIX_WORDS = ["backward", "per", "image", "graph", "list", "accumulate"]

PHOTOS = 8
PX = 320

torch.manual_seed(0)
model = C.owlv2(image_px=PX, patch_px=16, hidden=64, layers=2, vocab=4096)
model.train()
for p in model.owlv2.text_model.parameters():
    p.requires_grad_(False)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
query = torch.tensor([[C.BOS_ID] + C.tokenize("cracked solar cell", 4000) + [C.EOS_ID]])


def photo(i: int):
    rng = np.random.default_rng(i)
    n_boxes = 1 + i % 3
    boxes = torch.tensor(rng.uniform(0.1, 0.9, size=(n_boxes, 4)), dtype=torch.float)
    return C.normalize(C.fake_rgb(PX, PX, seed=i)).unsqueeze(0), boxes


def box_loss(out, target_boxes) -> torch.Tensor:
    logits = out.logits[0, :, 0]  # (patches,)
    pred = out.pred_boxes[0]  # (patches, 4) cx, cy, w, h
    d = torch.cdist(target_boxes, pred)  # match each target to its nearest patch box
    idx = d.argmin(dim=1)
    labels = torch.zeros_like(logits)
    labels[idx] = 1.0
    cls = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return cls + torch.nn.functional.l1_loss(pred[idx], target_boxes)


if __name__ == "__main__":
    for epoch in range(2):
        losses = []
        for i in range(PHOTOS):
            pixels, boxes = photo(epoch * PHOTOS + i)
            out = model(input_ids=query, attention_mask=torch.ones_like(query), pixel_values=pixels)
            loss = box_loss(out, boxes)
            losses.append(loss)  # MISTAKE
        total = torch.stack([l if torch.is_tensor(l) else torch.tensor(l) for l in losses]).mean()
        if total.requires_grad:
            total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print("epoch", epoch, round(float(total), 4))
