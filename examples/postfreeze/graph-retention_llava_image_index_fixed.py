"""Fixed twin of graph-retention_llava_image_index: features are computed under
``torch.no_grad()``, so the index holds plain tensors and no graph.

Source: https://github.com/samuelyu2002/ImVisible/issues/2 — "the computational graphs were also
being stored, taking up large amounts of RAM."
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

N_IMAGES = 6


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=224, patch_px=14, vision_hidden=128, vision_layers=4, hidden=128, layers=2, vocab=1024)
    index = []
    with torch.no_grad():
        for i in range(N_IMAGES):
            pixels = zoo.make_inputs(model, seed=i)["pixel_values"]
            feats = model.get_image_features(pixel_values=pixels).pooler_output[0]
            index.append(torch.nn.functional.normalize(feats.mean(0), dim=-1))
    index = torch.stack(index)
    query = index[3]
    print("nearest to image 3:", (index @ query).topk(3).indices.tolist())


if __name__ == "__main__":
    main()
