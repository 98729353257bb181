import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Zero-shot tagging of a personal photo library with SigLIP: images are embedded 256 at a time under
torch.no_grad(), only the normalised pooled embeddings are kept, and tags come from the sigmoid of
the image-text logits."""

import torch

EXPECT = None

TAGS = ["a beach", "a birthday party", "a mountain hike", "a city at night", "a pet", "food"]


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.siglip(image_px=96, patch_px=8, hidden=128, layers=3)
    vocab = model.config.text_config.vocab_size
    ids = torch.tensor([(C.tokenize(t, vocab) + [0] * 8)[:8] for t in TAGS])
    text = torch.nn.functional.normalize(model.get_text_features(input_ids=ids).pooler_output, dim=-1)
    library = []
    for start in range(0, 512, 256):
        pixels = C.normalize_float(torch.rand(256, 3, 96, 96))
        emb = model.get_image_features(pixel_values=pixels).pooler_output
        library.append(torch.nn.functional.normalize(emb, dim=-1))
    library = torch.cat(library)
    probs = torch.sigmoid(library @ text.T * model.logit_scale.exp() + model.logit_bias)
    print("photos with a tag:", int((probs > 0.5).any(-1).sum()), "of", library.shape[0])


if __name__ == "__main__":
    main()
