import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""An e-commerce catalogue tool captions product photos with a BLIP captioner before they go to a
search index. The captioning function asks generate for 8 beams and 8 returned sequences "to have
alternatives", but the tool only ever stores the first caption: every image's ViT features, the
cross-attention inputs and the decoder caches are expanded 8x for a single kept caption."""

import torch

EXPECT = "request-multiplier"
FIX_WORDS = ("num_beams", "num_return_sequences", "greedy", "one sequence")


def caption_batch(model, pixel_values, max_len=12):
    out = model.generate(
        pixel_values=pixel_values, num_beams=8, num_return_sequences=8, max_new_tokens=max_len, min_new_tokens=max_len
    )  # MISTAKE
    out = out.view(pixel_values.shape[0], -1, out.shape[-1])
    return [row[0].tolist() for row in out]  # keep the best beam only


class CatalogueCaptioner:
    def __init__(self, model, batch_size=2):
        self.model = model
        self.batch_size = batch_size
        self.captions = {}

    @torch.no_grad()
    def run(self, products):
        skus = list(products)
        for i in range(0, len(skus), self.batch_size):
            chunk = skus[i : i + self.batch_size]
            pixels = torch.stack([products[s] for s in chunk])
            for sku, ids in zip(chunk, caption_batch(self.model, pixels)):
                self.captions[sku] = ids
        return self.captions


def main():
    torch.manual_seed(0)
    model = C.blip_captioner(image_px=192, patch_px=8, hidden=64, layers=2, text_layers=6, vocab=2048)
    products = {f"SKU-{i:04d}": C.normalize_float(torch.rand(3, 192, 192)) for i in range(4)}
    captions = CatalogueCaptioner(model).run(products)
    print("captioned products:", len(captions))


if __name__ == "__main__":
    main()
