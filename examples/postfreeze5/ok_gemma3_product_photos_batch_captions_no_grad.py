import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Alt-text generation for a web shop with a Gemma 3 style VLM: product photos are resized to the
model's native square input (no pan-and-scan), batched 8 at a time and captioned under no_grad with
greedy decoding; only the generated ids are kept."""

import torch

EXPECT = None


def batch_inputs(model, n, seed):
    single = C.gemma3_inputs(model, n_images=1, prompt_tokens=16, seed=seed)
    return {k: v.expand(n, -1).contiguous() for k, v in single.items()}


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.gemma3(image_px=128, patch_px=8, mm_tokens=256, vision_hidden=64, hidden=128, layers=4, vocab=4096)
    photos = [torch.rand(3, 300, 300) for _ in range(16)]
    alt_texts = []
    for i in range(0, len(photos), 8):
        pixels = torch.stack([C.normalize_float(C.resize(p, 128, 128)) for p in photos[i : i + 8]])
        batch = batch_inputs(model, pixels.shape[0], seed=i)
        out = model.generate(**batch, pixel_values=pixels, max_new_tokens=16, do_sample=False)
        alt_texts += out[:, batch["input_ids"].shape[1] :].tolist()
    print("alt texts:", len(alt_texts))


if __name__ == "__main__":
    main()
