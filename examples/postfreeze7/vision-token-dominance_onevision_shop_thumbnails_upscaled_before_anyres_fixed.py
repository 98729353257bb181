"""Marketplace listing tagger on LLaVA-OneVision (anyres_max_9).

Sellers upload small product thumbnails. The tagging job asks the model for a category and three
attribute tags per photo, batching 6 listings per generate call. A teammate added an "upscale for
detail" step before the processor (the product photos looked blurry in the debug viewer).
The image processor then picks the largest anyres grid for the enlarged image: 9 crops + the base
view per photo instead of the 2x2 grid the thumbnail actually fills.
"""

import torch

import _common as C

EXPECT = None

BATCH = 6
THUMB_PX = 40  # the stored listing thumbnails (scaled-down: real ones are ~200 px for a 384 px base)
UPSCALE_TO = 96  # 3x the base resolution "so small text on the packaging is readable"

torch.manual_seed(0)
model = C.onevision(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
processor = C.onevision_image_processor(model)
vocab = model.config.text_config.vocab_size
question = C.tokenize("What category is this product? List three attribute tags.", vocab - 2)


def load_listing_photo(listing_id: int):
    img = C.fake_rgb(THUMB_PX, THUMB_PX, seed=listing_id)
    return img


def tag_batch(listing_ids):
    photos = [load_listing_photo(i) for i in listing_ids]
    enc = processor(images=photos, return_tensors="pt")
    inputs = C.onevision_inputs(model, enc["pixel_values"], enc["image_sizes"], question)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    return out[:, inputs["input_ids"].shape[1] :], inputs["input_ids"].shape[1]


if __name__ == "__main__":
    tags, prompt_len = tag_batch(list(range(BATCH)))
    print("prompt tokens per row:", prompt_len, "generated:", tuple(tags.shape))
