"""Building an image-retrieval index from a LLaVA-style model's projected image features
(``get_image_features``) — in eval mode, but without ``torch.no_grad()``.

Source: https://github.com/samuelyu2002/ImVisible/issues/2 — "The problem might be because the
computational graphs were also being stored, taking up large amounts of RAM." (fix: ``.item()`` /
no graph); https://github.com/macrocosm-os/pretraining/pull/104 — "Use torch.no_grad on loss
calculation to save memory."

``model.eval()`` does not turn autograd off: every stored feature tensor has ``requires_grad`` and
keeps its whole vision-tower + projector graph (the activations saved for backward) alive in the index.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "graph-retention"
FIX_WORDS = ("no_grad", "inference_mode", "detach")

N_IMAGES = 6


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=224, patch_px=14, vision_hidden=128, vision_layers=4, hidden=128, layers=2, vocab=1024)
    index = []
    for i in range(N_IMAGES):
        pixels = zoo.make_inputs(model, seed=i)["pixel_values"]
        feats = model.get_image_features(pixel_values=pixels).pooler_output[0]  # MISTAKE
        index.append(torch.nn.functional.normalize(feats.mean(0), dim=-1))
    index = torch.stack(index)
    query = index[3]
    print("nearest to image 3:", (index @ query).topk(3).indices.tolist())


if __name__ == "__main__":
    main()
