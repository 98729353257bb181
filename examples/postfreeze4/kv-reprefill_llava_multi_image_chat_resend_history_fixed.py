"""A LLaVA chat app where the user uploads a new photo every turn ("and what about this one?").

The conversation's cache is kept across turns: each turn only the new photo is encoded and only
the new message (plus the last generated token) is prefilled on top of the cached history.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
from transformers import DynamicCache

EXPECT = None
FIX_WORDS = ["past_key_values", "reuse the cache", "only the new"]

N_TURNS = 6
MAX_NEW_TOKENS = 8


def load_model():
    return C.llava(image_px=128, patch_px=8, vision_hidden=128, vision_layers=4, hidden=128, layers=4, vocab=4096)


def user_turn(model, turn):
    """Tokens of one user message: a photo block plus a short question."""
    img_tok = model.config.image_token_id
    n_img = C.llava_tokens_per_image(model)
    words = C.text_ids(12, 4095, seed=turn)[0].tolist()
    ids = words[:3] + [img_tok] * n_img + words[3:]
    photo = C.normalize(C.fake_rgb(128, 128, seed=turn))
    return ids, photo


@torch.no_grad()
def greedy(model, input_ids, pixel_values, cache, max_new_tokens):
    out = model(input_ids=input_ids, pixel_values=pixel_values, past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    answer = [nxt]
    for _ in range(max_new_tokens - 1):
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        answer.append(nxt)
    return torch.cat(answer, dim=1)


def chat(model):
    history_ids = [C.BOS_ID]
    cache = DynamicCache(config=model.config)  # one cache for the whole conversation
    pending = [C.BOS_ID]  # tokens not yet in the cache
    for turn in range(N_TURNS):
        ids, photo = user_turn(model, turn)
        history_ids += ids
        pending += ids
        input_ids = torch.tensor([pending])
        pixel_values = photo.unsqueeze(0)  # only the new photo
        answer = greedy(model, input_ids, pixel_values, cache, MAX_NEW_TOKENS)
        history_ids += answer[0].tolist()
        pending = answer[0, -1:].tolist()  # the last answer token was never fed back
        print(f"turn {turn}: context {len(history_ids)} tokens, cache {cache.get_seq_length()}")


if __name__ == "__main__":
    chat(load_model().eval())
