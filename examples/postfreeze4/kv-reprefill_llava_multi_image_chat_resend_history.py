"""A LLaVA chat app where the user uploads a new photo every turn ("and what about this one?").

Each turn rebuilds the whole conversation (all previous photos and answers) and runs it through
the model from scratch with a fresh cache: every old photo is re-encoded by the vision tower and
the whole history is prefilled again, although the cache from the previous turn already holds it.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch
from transformers import DynamicCache

EXPECT = "kv-reprefill"
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
    history_photos = []
    for turn in range(N_TURNS):
        ids, photo = user_turn(model, turn)
        history_ids += ids
        history_photos.append(photo)
        cache = DynamicCache(config=model.config)  # MISTAKE
        input_ids = torch.tensor([history_ids])
        pixel_values = torch.stack(history_photos)
        answer = greedy(model, input_ids, pixel_values, cache, MAX_NEW_TOKENS)
        history_ids += answer[0].tolist()
        print(f"turn {turn}: context {len(history_ids)} tokens, {len(history_photos)} photos encoded this turn")


if __name__ == "__main__":
    chat(load_model().eval())
