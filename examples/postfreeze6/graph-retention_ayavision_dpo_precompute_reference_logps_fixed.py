"""Preference tuning an Aya-Vision style VLM on image-grounded answer pairs (chosen vs rejected).

Step 1 of our DPO recipe: run the frozen reference model once over the dataset and keep the
sequence log-probabilities of the chosen and rejected answers, so the reference model can be
dropped before training starts.
"""

import torch

import _common as C

EXPECT = None

PAIRS = 12


def build_pairs(model, n):
    img_tok = model.config.image_token_id
    n_img = C.aya_tokens_per_image(model)
    vocab_top = model.config.text_config.vocab_size - 2
    pairs = []
    for i in range(n):
        image = C.normalize(C.fake_rgb(128, 128, seed=i))
        prompt = [C.BOS_ID] + [img_tok] * n_img + C.text_ids(20, vocab_top, seed=i)[0].tolist()
        chosen = C.text_ids(48, vocab_top, seed=100 + i)[0].tolist()
        rejected = C.text_ids(40, vocab_top, seed=200 + i)[0].tolist()
        pairs.append((image, prompt, chosen, rejected))
    return pairs


def sequence_logp(model, image, prompt, answer):
    ids = torch.tensor([prompt + answer])
    logits = model(input_ids=ids, pixel_values=image.unsqueeze(0)).logits[:, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, torch.tensor([answer]).unsqueeze(-1)).sum()


def precompute_reference(ref_model, pairs):
    ref_model.eval()
    ref_chosen, ref_rejected = [], []
    for image, prompt, chosen, rejected in pairs:
        ref_chosen.append(sequence_logp(ref_model, image, prompt, chosen).detach())
        ref_rejected.append(sequence_logp(ref_model, image, prompt, rejected).detach())
    return torch.stack(ref_chosen), torch.stack(ref_rejected)


def main():
    torch.manual_seed(0)
    ref_model = C.aya_vision(image_px=128, patch_px=8, vision_hidden=64, hidden=128, layers=4, vocab=8192)
    pairs = build_pairs(ref_model, PAIRS)
    ref_chosen, ref_rejected = precompute_reference(ref_model, pairs)
    print(f"reference margins: {(ref_chosen - ref_rejected).mean().item():.3f} over {len(pairs)} pairs")


if __name__ == "__main__":
    main()
