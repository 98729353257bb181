"""Indexing a photo gallery with CLIP after decoding every image up front.

FIXED TWIN: the images are decoded lazily by a generator, one batch at a time.

What the user did: prepared a custom image dataset for a Hugging Face vision(-language) model by
opening every file with ``Image.open(...).convert("RGB")`` into a list before processing, and RAM
filled up; the answer was to load lazily (a generator / Dataset ``__getitem__`` that only decodes
when iterated). The same happens with ``dataset["image"]`` on an image dataset, which decodes the
whole column into memory at once.

Sources:
- https://github.com/NielsRogge/Transformers-Tutorials/issues/40 ("Image.open(image) chokes memory when
  preparing custom dataset"; reply: "dataloaders are Python generators, meaning they will only consume
  RAM when iterating over them"; reporter: "Missed the 'yield'. Fixed that and working now.")
- https://github.com/huggingface/datasets/issues/4730 (``dataset["image"]`` on imagenet-1k validation:
  "Loading into memory ... takes much more RAM than expected ... Killed")

Reproduction: a tiny random-weight CLIP; 240 "JPEG files" decoded to 384x384 RGB arrays (~106 MB in
total); the embeddings are computed in batches of 16 under no_grad. The list comprehension holds every
decoded image for the whole run; the generator twin holds one batch.
"""

import itertools

import _common as c
import torch

EXPECT = None

N_FILES, SIDE, BATCH = 240, 384, 16


def load_image(path):
    """Image.open(path).convert("RGB") -> numpy (H, W, 3) uint8."""
    return c.fake_rgb(SIDE, SIDE, seed=hash(path) % 1000)


def preprocess(batch, size):
    return c.resize(c.normalize(torch.stack([torch.from_numpy(a) for a in batch])), size, size)


def batched(iterable, n):
    it = iter(iterable)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def main():
    torch.manual_seed(0)
    model = c.clip(image_px=96, patch_px=8, hidden=128, layers=3)
    paths = [f"gallery/img_{i:04d}.jpg" for i in range(N_FILES)]
    decoded = (load_image(p) for p in paths)
    index = []
    with torch.no_grad():
        for chunk in batched(decoded, BATCH):
            feats = model.get_image_features(pixel_values=preprocess(chunk, 96))
            feats = getattr(feats, "pooler_output", feats)
            index.append(torch.nn.functional.normalize(feats, dim=-1))
    index = torch.cat(index)
    print(f"indexed {index.shape[0]} images, dim {index.shape[1]}")


if __name__ == "__main__":
    main()
