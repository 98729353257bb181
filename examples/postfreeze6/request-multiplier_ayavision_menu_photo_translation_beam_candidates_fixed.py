"""Menu-photo translation with an Aya-Vision style multilingual VLM: a tourist uploads a photo of a
menu page and gets the dishes translated. We return the top beam-search hypothesis."""

import torch

import _common as C

EXPECT = None

SIDE = 384


class MenuTranslator:
    def __init__(self):
        torch.manual_seed(0)
        self.model = C.aya_vision(
            image_px=SIDE, patch_px=8, vision_hidden=64, hidden=128, layers=6, vocab=8192, ffn=512
        )
        self.n_img = C.aya_tokens_per_image(self.model)
        self.vocab_top = self.model.config.text_config.vocab_size - 2

    @torch.no_grad()
    def translate(self, rgb, target="English"):
        pix = C.resize(C.normalize(rgb), SIDE, SIDE).unsqueeze(0)
        words = C.tokenize(f"Translate every dish on this menu into {target} , keep the prices .", self.vocab_top)
        ids = torch.tensor([[C.BOS_ID] + [self.model.config.image_token_id] * self.n_img + words])
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=pix,
            max_new_tokens=32,
            min_new_tokens=32,
            do_sample=False,
        )
        return out[0, ids.shape[1] :]


def main():
    tr = MenuTranslator()
    for i in range(2):
        menu = C.fake_rgb(1024, 768, seed=i)
        text = tr.translate(menu)
        print(f"menu {i}: {text.shape[0]} tokens")


if __name__ == "__main__":
    main()
