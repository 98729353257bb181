"""LLaVA-NeXT-Video question answering on a 2-minute how-to clip with 32 frames sampled uniformly
(the model card: "sample uniformly 8 or more frames, depending on length of video"); frames are
decoded by index only, greedy, no_grad."""

import numpy as np
import torch

import _common as C

EXPECT = None

NUM_FRAMES = 32
model = C.llava_next_video(image_px=32, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
vocab = model.config.text_config.vocab_size
prompt = C.tokenize("USER: List the tools used, in order of appearance. ASSISTANT:", vocab - 2)

if __name__ == "__main__":
    total = 120 * 30
    idx = np.linspace(0, total - 1, NUM_FRAMES).round().astype(int)
    video = C.normalize(np.stack([C.fake_rgb(32, 32, seed=int(i)) for i in idx])).unsqueeze(0)
    n = C.llava_next_video_tokens_per_frame(model) * NUM_FRAMES
    ids = torch.tensor([[C.BOS_ID] + [model.config.video_token_id] * n + prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values_videos=video,
            max_new_tokens=24,
            do_sample=False,
        )
    print("video tokens:", n, "answer tokens:", out.shape[1] - ids.shape[1])
