import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""OCR of scanned forms with a PaliGemma-style model at its 448 px "ocr" resolution (the 448 px
checkpoints exist for text-heavy inputs): 1024 image tokens per page, 4 pages per batch, greedy
generation under no_grad, only generated ids kept."""

import torch

EXPECT = None


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.paligemma(image_px=256, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    cfg = model.config
    n_img = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    prompt = C.tokenize("ocr the form fields", cfg.text_config.vocab_size - 1)
    rows = [cfg.image_token_id] * n_img + [C.BOS_ID] + prompt
    texts = []
    for page0 in range(0, 8, 4):
        pages = C.normalize_float(torch.rand(4, 3, 256, 256))
        ids = torch.tensor([rows] * 4)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            token_type_ids=torch.zeros_like(ids),
            pixel_values=pages,
            max_new_tokens=24,
            do_sample=False,
        )
        texts += out[:, ids.shape[1] :].tolist()
    print("pages read:", len(texts), "image tokens per page:", n_img)


if __name__ == "__main__":
    main()
