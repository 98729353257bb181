"""Video captioning data op that samples all caption candidates of a clip in one ``generate`` call.

What the user did: a data-processing op asks Qwen2-VL for ``caption_num=6`` candidate captions per
video chunk (to pick the best later) and, on the transformers backend, requests them in one call
with ``num_return_sequences=caption_num``. ``generate`` expands the request: the video pixels and
video tokens are repeated for every returned sequence, so the vision tower, the prefill and the KV
cache all run six times over.
Answer in the source: the op draws its ``caption_num`` candidates one ``generate`` call at a time;
with transformers each call then holds one copy of the video (expanding inputs repeats
``pixel_values`` per sequence, which the Qwen-VL issue shows).
Sources: https://github.com/datajuicer/data-juicer/pull/820 ; https://github.com/QwenLM/Qwen3-VL/issues/560
Reproduction: a tiny random-weight Qwen2-VL; a 24-frame 168x168 chunk (432 video tokens); six
sampled 12-token captions requested with ``num_return_sequences=6`` in one call.
"""

import _common as c
import torch

EXPECT = "request-multiplier"
FIX_WORDS = ("num_return_sequences", "one at a time", "sequentially", "loop")

CAPTION_NUM = 6


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=3, vocab=8192, vision_hidden=64)
    video = torch.rand(24, 3, 168, 168).sub_(0.5).div_(0.25)
    inputs = c.qwen_inputs(model, videos=[video], prompt_tokens=24)
    prompt_len = inputs["input_ids"].shape[1]
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=True, num_return_sequences=CAPTION_NUM)  # MISTAKE
        captions = [row[prompt_len:].tolist() for row in out]
    print(f"{len(captions)} candidates for a {prompt_len}-token prompt")


if __name__ == "__main__":
    main()
