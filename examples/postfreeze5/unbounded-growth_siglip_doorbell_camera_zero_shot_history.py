import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A doorbell-camera alert service classifies each incoming frame zero-shot with SigLIP ("a person",
"a package", "a car", "nothing") and smooths the decision over the last 8 frames. The stream object
appends every frame's preprocessed pixels and embedding to a history list that is never trimmed,
while the smoothing only ever reads the last 8 entries."""

import torch

EXPECT = "unbounded-growth"
FIX_WORDS = ("deque", "maxlen", "window", "trim")

LABELS = ["a person at the door", "a package on the porch", "a car in the driveway", "an empty porch"]
WINDOW = 8


class DoorbellStream:
    def __init__(self, model, text_embeds):
        self.model = model
        self.text_embeds = text_embeds
        self.history = []

    @torch.no_grad()
    def on_frame(self, frame_id, pixels):
        emb = self.model.get_image_features(pixel_values=pixels.unsqueeze(0)).pooler_output
        emb = torch.nn.functional.normalize(emb, dim=-1)[0]
        self.history.append({"id": frame_id, "pixels": pixels, "emb": emb})  # MISTAKE
        recent = torch.stack([h["emb"] for h in self.history[-WINDOW:]])
        scores = (recent @ self.text_embeds.T).mean(0)
        return LABELS[int(scores.argmax())]


def main():
    torch.manual_seed(0)
    model = C.siglip(image_px=96, patch_px=16, hidden=64, layers=2)
    vocab = model.config.text_config.vocab_size
    with torch.no_grad():
        ids = torch.tensor([C.tokenize(l, vocab)[:8] + [0] * (8 - len(C.tokenize(l, vocab)[:8])) for l in LABELS])
        text_embeds = torch.nn.functional.normalize(model.get_text_features(input_ids=ids).pooler_output, dim=-1)
    stream = DoorbellStream(model, text_embeds)
    alerts = 0
    for frame_id in range(240):
        frame = C.normalize_float(torch.rand(3, 96, 96))
        label = stream.on_frame(frame_id, frame)
        alerts += label != LABELS[-1]
    print("frames with an alert:", alerts)


if __name__ == "__main__":
    main()
