"""Fixed twin: one `DynamicCache` is kept for the session; each turn prefills only its new tokens.

What the user did: a video chat app loads one clip and answers several follow-up questions. Each
turn calls ``generate`` on the full conversation (video + all previous questions and answers) with
the video pixels and no cache, so the vision tower re-encodes the same frames and the whole history
is prefilled again at every turn; the previous turns' intermediate results are not reused.
Answer in the source: save the video features for the multi-round questions and use the KV cache to
reuse the previous tokens' caches (the demo simply did not implement it); servers that keep the
prefix cache across turns only prefill the new tokens.
Sources: https://github.com/Vision-CAIR/LongVU/issues/24 ; https://github.com/Blaizzy/mlx-vlm/issues/999
Reproduction: a tiny random-weight Qwen2-VL; a 16-frame 112x112 clip (128 video tokens); 12 turns of a
32-token question and a 32-token answer; the session's cache is passed back every turn, so the
video is encoded once and each turn prefills only the new question.
"""

import _common as c
import torch
from transformers import DynamicCache

EXPECT = None

TURNS = 12


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=3, vocab=4096, vision_hidden=64, ffn=512)
    video = torch.rand(16, 3, 112, 112).sub_(0.5).div_(0.25)
    first = c.qwen_inputs(model, videos=[video], prompt_tokens=24)
    vision = {"pixel_values_videos": first["pixel_values_videos"], "video_grid_thw": first["video_grid_thw"]}
    ids = first["input_ids"]
    session_cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        for turn in range(TURNS):
            if turn:
                ids = torch.cat([ids, c.text_ids(32, 4090, seed=turn)], 1)
            pixels = vision if session_cache.get_seq_length() == 0 else {"video_grid_thw": vision["video_grid_thw"]}
            out = model.generate(
                **c.qwen_turn(model, ids), **pixels, cache=session_cache, max_new_tokens=32, do_sample=False
            )
            ids = out
    print(f"{TURNS} turns, final context {ids.shape[1]} tokens, cache {session_cache.get_seq_length()}")


if __name__ == "__main__":
    main()
