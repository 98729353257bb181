import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A VLM-as-judge reward for image-captioning RL: a bf16 Gemma 3 style model scores each candidate
caption by the log-probabilities of its tokens given the image. For "stable logprobs" the user
swaps the LM head for a wrapper that casts both the hidden states and the tied (vocab x hidden)
embedding weight to float32 on every call, so each scoring forward materialises an fp32 copy of the
biggest weight in the model next to its bf16 original."""

import torch
from torch import nn

EXPECT = "dequant-temporaries"
FIX_WORDS = ("out_dtype", "upcast the output", "keep the weight in bf16", "weight.float()", "logits.float()")


class Fp32LMHead(nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, hidden):
        return nn.functional.linear(hidden.float(), self.head.weight.float())  # MISTAKE


@torch.no_grad()
def caption_logprobs(model, pixel_values, prompt, captions):
    ids = torch.cat([prompt.expand(captions.shape[0], -1), captions], dim=1)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": (ids == model.config.image_token_id).long(),
        "pixel_values": pixel_values.expand(captions.shape[0], -1, -1, -1),
    }
    n = captions.shape[1]
    logits = model(**batch, logits_to_keep=n + 1).logits[:, :-1]  # positions that predict the caption
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, captions.unsqueeze(-1)).squeeze(-1).sum(-1)


def main():
    torch.manual_seed(0)
    model = C.gemma3(
        image_px=64, patch_px=8, mm_tokens=16, vision_hidden=64, hidden=256, layers=2, vocab=65536, dtype=torch.bfloat16
    )
    model.lm_head = Fp32LMHead(model.lm_head)
    prompt = C.gemma3_inputs(model, n_images=1, prompt_tokens=12, seed=0)["input_ids"]
    rewards = []
    for step in range(4):
        image = C.normalize_float(torch.rand(1, 3, 64, 64)).to(torch.bfloat16)
        captions = torch.randint(C.FIRST_TEXT_ID, 60000, (4, 12), generator=torch.Generator().manual_seed(step))
        rewards.append(caption_logprobs(model, image, prompt, captions))
    print("mean reward:", round(float(torch.cat(rewards).mean()), 3))


if __name__ == "__main__":
    main()
