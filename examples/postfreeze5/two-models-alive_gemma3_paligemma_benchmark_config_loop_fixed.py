import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""A VLMEvalKit-style benchmark runner: a config dict names several VLMs (a PaliGemma checkpoint and
a Gemma 3 checkpoint) and the script evaluates them one after another on the same image set. After
each model's evaluation the runner deletes it and collects garbage before building the next one."""

import gc

import torch

EXPECT = None

MODEL_CONFIGS = {
    "paligemma-3b-mix-style": {
        "builder": "paligemma",
        "kwargs": dict(image_px=64, patch_px=8, hidden=256, layers=4, vocab=16384),
    },
    "gemma-3-4b-it-style": {
        "builder": "gemma3",
        "kwargs": dict(image_px=64, patch_px=8, mm_tokens=16, hidden=256, layers=4, vocab=16384),
    },
}


def build_model(entry):
    return getattr(C, entry["builder"])(**entry["kwargs"])


def make_prompt(model, n_text=12, seed=0):
    cfg = model.config
    vocab = cfg.text_config.vocab_size
    if cfg.model_type == "paligemma":
        n_img = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
        rows = [cfg.image_token_id] * n_img + [C.BOS_ID] + C.text_ids(n_text, vocab - 1, seed)[0].tolist()
        ids = torch.tensor([rows])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return C.gemma3_inputs(model, n_images=1, prompt_tokens=n_text, seed=seed)


@torch.no_grad()
def run_benchmark(model, images):
    answers = []
    for i, img in enumerate(images):
        batch = make_prompt(model, seed=i)
        batch["pixel_values"] = img.unsqueeze(0)
        out = model.generate(**batch, max_new_tokens=4, do_sample=False)
        answers.append(out[0, batch["input_ids"].shape[1] :].tolist())
    return answers


def main():
    torch.manual_seed(0)
    images = C.normalize_float(torch.rand(4, 3, 64, 64))
    results = {}
    model = None
    for name, entry in MODEL_CONFIGS.items():
        model = build_model(entry)
        results[name] = run_benchmark(model, images)
        print(name, "done", len(results[name]))
        del model
        gc.collect()
    print("models evaluated:", len(results))


if __name__ == "__main__":
    main()
