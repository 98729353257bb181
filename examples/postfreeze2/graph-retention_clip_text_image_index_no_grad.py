"""Building a CLIP text+image retrieval index with an embedder method that runs with autograd on.

What the user did: computed CLIP embeddings for a stream of batches in a helper and kept the returned
embeddings; memory kept growing and ``gc.collect()`` / ``torch.cuda.empty_cache()`` did nothing. The
answer: "Using torch.no_grad works because no gradients are [needed] ... the embeddings.grad_fn
attribute is a lingering reference to a closure that has the whole computational backward graph."
clip-retrieval fixed the same leak in its inference back-end by adding ``torch.no_grad``.

Sources:
- https://github.com/huggingface/transformers/issues/26275 ("Memory leak when acquiring CLIP embeddings")
- https://github.com/rom1504/clip-retrieval/pull/81 ("use torch no grad to fix a memleak in clip back")
- https://github.com/idealo/imagededup/pull/192 ("By default, PyTorch will store activations etc. for
  computing gradients ... adds torch.no_grad context manager")

Reproduction: a tiny random-weight CLIP (96 px, 145 patches, 3 layers); 4 batches of 8 images and
their 32-token captions are embedded by ``ClipEmbedder.embed_batch`` and appended to the index.
Every stored embedding keeps its batch's forward activations alive through ``grad_fn``.
"""

import _common as c
import torch

EXPECT = "graph-retention"
FIX_WORDS = ("no_grad", "inference_mode", "detach")


class ClipEmbedder:
    def __init__(self, model):
        self.model = model

    def embed_batch(self, pixel_values, input_ids):  # MISTAKE
        img = self.model.get_image_features(pixel_values=pixel_values)
        txt = self.model.get_text_features(input_ids=input_ids)
        img = getattr(img, "pooler_output", img)
        txt = getattr(txt, "pooler_output", txt)
        return torch.nn.functional.normalize(img, dim=-1), torch.nn.functional.normalize(txt, dim=-1)


def caption_ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(c.FIRST_TEXT_ID, 4000, (n, 32), generator=g)
    ids[:, 0], ids[:, -1] = c.BOS_ID, c.EOS_ID
    return ids


def main():
    torch.manual_seed(0)
    embedder = ClipEmbedder(c.clip(image_px=96, patch_px=8, hidden=128, layers=3, vocab=4096))
    image_index, text_index = [], []
    for b in range(4):
        pixels = torch.randn(8, 3, 96, 96, generator=torch.Generator().manual_seed(b))
        img, txt = embedder.embed_batch(pixels, caption_ids(8, b))
        image_index.append(img)
        text_index.append(txt)
    sims = torch.cat(text_index) @ torch.cat(image_index).T
    print(
        f"index: {sims.shape[1]} images, recall@1 {(sims.argmax(1) == torch.arange(sims.shape[0])).float().mean():.3f}"
    )


if __name__ == "__main__":
    main()
