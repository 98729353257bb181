"""Retail shelf audit with OWLv2 open-vocabulary detection.

Store photos are checked for a list of product queries. The audit keeps each batch's raw
Owlv2ObjectDetectionOutput in a list so that the threshold can be tuned at the end of the run;
those outputs carry per-patch logits, class and image embeddings, and the full text and vision
tower outputs (last_hidden_state for every patch), not just the few boxes the report needs.
"""

import numpy as np
import torch
import transformers

import _common as C

EXPECT = "retained-outputs"
FIX_WORDS = ["post_process", "boxes", "keep", "outputs", "threshold"]

QUERIES = ["cereal box", "price tag", "empty shelf gap", "milk carton", "detergent bottle", "fallen item"]
BATCH = 2
N_BATCHES = 12
PX = 320

model = C.owlv2(image_px=PX, patch_px=16, hidden=64, layers=2, vocab=4096)
post = transformers.Owlv2ImageProcessor()
query_ids = torch.tensor([[C.BOS_ID] + C.tokenize(q, 4000) + [C.EOS_ID] + [0] * (8 - len(q.split())) for q in QUERIES])
query_ids = query_ids.repeat(BATCH, 1)  # OWLv2 takes the queries once per image
query_mask = (query_ids != 0).long()


def photos(batch: int) -> torch.Tensor:
    return C.normalize(np.stack([C.fake_rgb(PX, PX, seed=batch * 10 + i) for i in range(BATCH)]))


if __name__ == "__main__":
    raw = []
    report = []
    with torch.no_grad():
        for b in range(N_BATCHES):
            out = model(input_ids=query_ids, attention_mask=query_mask, pixel_values=photos(b))
            raw.append(out)  # MISTAKE
            dets = post.post_process_object_detection(out, threshold=0.6, target_sizes=[(PX, PX)] * BATCH)
            report.extend([{k: v.clone() for k, v in d.items()} for d in dets])
    print(
        "photos audited:", len(report), "detections:", sum(len(d["scores"]) for d in report), "kept outputs:", len(raw)
    )
