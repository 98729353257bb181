"""LLaVA-OneVision reading a scanned delivery form at its own resolution.

The scan is large (it fills the biggest anyres grid: 9 crops + the base view, the documented
anyres_max_9 budget), and it is passed as scanned, with no upscaling; two forms per call, greedy,
no_grad. Big prompt, but every token carries pixels the form has.
"""

import torch

import _common as C

EXPECT = None

model = C.onevision(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
processor = C.onevision_image_processor(model)
vocab = model.config.text_config.vocab_size
question = C.tokenize("Read the consignee name, the address and the parcel count.", vocab - 2)

if __name__ == "__main__":
    scans = [C.fake_rgb(100, 96, seed=s) for s in range(2)]  # already larger than the 3x3 grid
    enc = processor(images=scans, return_tensors="pt")
    inputs = C.onevision_inputs(model, enc["pixel_values"], enc["image_sizes"], question)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    print("prompt tokens:", inputs["input_ids"].shape[1], "answers:", tuple(out.shape))
