"""Multi-turn chat about one holiday photo with an Idefics2-style model. The conversation keeps one
DynamicCache: the photo is encoded on the first turn only, later turns prefill just their new tokens."""

import torch
from transformers import DynamicCache

import _common as C

EXPECT = None


@torch.inference_mode()
def main():
    torch.manual_seed(0)
    model = C.idefics2(image_px=256, patch_px=8, vision_hidden=64, latents=64, hidden=128, layers=4, vocab=8192)
    vocab_top = model.config.text_config.vocab_size - 2
    pix = C.normalize(C.fake_rgb(192, 256, seed=0)).unsqueeze(0).unsqueeze(0)
    pmask = torch.ones(1, 1, 192, 256, dtype=torch.bool)
    history = torch.tensor([[C.BOS_ID] + C.tokenize("User:", vocab_top) + C.idefics2_image_block(model)])
    cache = DynamicCache()
    for turn, q in enumerate(
        [
            "where was this taken ?",
            "what time of day is it ?",
            "describe the boat .",
            "how many people are visible ?",
            "write a caption for instagram .",
        ]
    ):
        history = torch.cat([history, torch.tensor([C.tokenize(q + " Assistant:", vocab_top)])], dim=1)
        media = {"pixel_values": pix, "pixel_attention_mask": pmask} if cache.get_seq_length() == 0 else {}
        out = model.generate(
            input_ids=history,
            attention_mask=torch.ones_like(history),
            past_key_values=cache,
            max_new_tokens=24,
            do_sample=False,
            **media,
        )
        print(f"turn {turn}: +{out.shape[1] - history.shape[1]} tokens, cache {cache.get_seq_length()}")
        history = out


if __name__ == "__main__":
    main()
