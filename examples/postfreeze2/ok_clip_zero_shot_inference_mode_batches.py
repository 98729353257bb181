"""Zero-shot tagging of a photo set with CLIP: inference mode, large batches, only embeddings kept.

What the user does: the pattern the CLIP memory threads converge on -- run the encoders under
``torch.no_grad`` / ``torch.inference_mode`` so no graph is recorded, feed reasonably large batches
for throughput, keep only the (small) normalised embeddings, and decode images per batch. Memory is
dominated by one batch's activations, which is expected and bounded.

Sources:
- https://github.com/huggingface/transformers/issues/26275 ("Using torch.no_grad works because no
  gradients are [computed] when doing the forward pass of the model")
- https://github.com/christiansafka/img2vec/pull/33 ("use torch no grad to reduce memory usage")
- https://github.com/huggingface/transformers/issues/20636 (CLIP inference over a large image set in
  batches of 500)

Reproduction: a tiny random-weight CLIP (96 px); 64 label prompts; 192 images in batches of 64.
"""

import _common as c
import torch

EXPECT = None

BATCH, N_IMAGES, N_LABELS = 64, 192, 64


def image_batches(n, batch):
    for start in range(0, n, batch):
        arrays = [c.fake_rgb(160, 160, seed=i) for i in range(start, min(n, start + batch))]
        yield c.resize(c.normalize(torch.stack([torch.from_numpy(a) for a in arrays])), 96, 96)


def main():
    torch.manual_seed(0)
    model = c.clip(image_px=96, patch_px=8, hidden=128, layers=3, vocab=4096)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(c.FIRST_TEXT_ID, 4000, (N_LABELS, 16), generator=g)
    prompts[:, 0], prompts[:, -1] = c.BOS_ID, c.EOS_ID
    tags = []
    with torch.inference_mode():
        text = model.get_text_features(input_ids=prompts)
        text = torch.nn.functional.normalize(getattr(text, "pooler_output", text), dim=-1)
        for pixels in image_batches(N_IMAGES, BATCH):
            img = model.get_image_features(pixel_values=pixels)
            img = torch.nn.functional.normalize(getattr(img, "pooler_output", img), dim=-1)
            tags.append((img @ text.T).topk(3, dim=-1).indices)
    tags = torch.cat(tags)
    print(f"tagged {tags.shape[0]} images with {tags.shape[1]} labels each")


if __name__ == "__main__":
    main()
