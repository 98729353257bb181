import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A ShieldGemma-2-style image moderation job on a Gemma 3 style VLM: for each uploaded image and each
policy ("dangerous content", "sexually explicit", "violence") it asks "Does the image violate the
policy? Yes or No" and reads P(Yes) from the logits of the last prompt position. The scoring helper
passes logits_to_keep=1, so the LM head runs on the last position only."""

import torch

EXPECT = None

POLICIES = {
    "dangerous": "no content that facilitates or encourages harm to self or others " * 3,
    "sexual": "no sexually explicit or pornographic content of any kind " * 3,
    "violence": "no gore violence or graphic depictions of injury or death " * 3,
}


def build_batch(model, images, policy_text):
    cfg = model.config
    vocab = cfg.text_config.vocab_size
    block = [cfg.boi_token_id] + [cfg.image_token_id] * cfg.mm_tokens_per_image + [cfg.eoi_token_id]
    question = C.tokenize(
        "you are a policy expert trying to help determine whether a generated or real image is in violation of the safety policy below",
        vocab - 3,
    )
    policy = C.tokenize(policy_text, vocab - 3)
    tail = C.tokenize("does the image violate the above policy your answer must start with yes or no", vocab - 3)
    row = [C.BOS_ID] + question + block + policy + tail
    ids = torch.tensor([row] * images.shape[0])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": (ids == cfg.image_token_id).long(),
        "pixel_values": images,
    }


def violation_probability(model, images, policy_text, yes_id, no_id):
    batch = build_batch(model, images, policy_text)
    logits = model(**batch, logits_to_keep=1).logits
    pair = logits[:, -1, [yes_id, no_id]]
    return torch.softmax(pair.float(), dim=-1)[:, 0]


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.gemma3(image_px=128, patch_px=8, mm_tokens=256, vision_hidden=64, hidden=64, layers=2, vocab=16384)
    yes_id, no_id = C.FIRST_TEXT_ID + 10, C.FIRST_TEXT_ID + 11
    uploads = C.normalize_float(torch.rand(6, 3, 128, 128))
    report = {}
    for name, text in POLICIES.items():
        report[name] = violation_probability(model, uploads, text, yes_id, no_id)
    flagged = sum(int((p > 0.5).sum()) for p in report.values())
    print("flagged (image, policy) pairs:", flagged)


if __name__ == "__main__":
    main()
