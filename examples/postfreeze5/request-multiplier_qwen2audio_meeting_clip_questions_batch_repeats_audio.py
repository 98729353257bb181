import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""Meeting-minutes helper on a Qwen2-Audio style model: for each 30 s meeting clip it asks six
questions (who spoke, decisions, action items, ...). Following the batch-inference example, it builds
one conversation per question, each carrying the same clip, and sends them as one batch, so the same
30 s of audio is run through the audio encoder, prefilled and cached six times."""

import torch

EXPECT = "request-multiplier"
FIX_WORDS = ("once", "same audio", "duplicate", "one at a time", "share")

QUESTIONS = [
    "who is speaking in this clip",
    "what decisions were made",
    "list the action items",
    "what deadlines are mentioned",
    "is anyone disagreeing",
    "summarise the clip in one sentence",
]
WINDOW_FRAMES = 3000  # 30 s of 10 ms mel frames


def audio_block(cfg):
    after_conv = (WINDOW_FRAMES - 1) // 2 + 1
    n = (after_conv - 2) // 2 + 1
    return [cfg.audio_token_id - 2] + [cfg.audio_token_id] * n + [cfg.audio_token_id - 1]


def conversation(cfg, question):
    vocab = cfg.text_config.vocab_size
    return [C.FIRST_TEXT_ID] + audio_block(cfg) + C.tokenize(question, vocab - 3) + [C.FIRST_TEXT_ID + 1]


@torch.no_grad()
def ask(model, mel, questions):
    cfg = model.config
    rows = [conversation(cfg, q) for q in questions]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[C.PAD_ID] * (width - len(r)) + r for r in rows])  # left padding
    mask = (ids != C.PAD_ID).long()
    feats = mel.unsqueeze(0).expand(len(questions), -1, -1).contiguous()
    fmask = torch.ones(len(questions), WINDOW_FRAMES, dtype=torch.long)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        input_features=feats,
        feature_attention_mask=fmask,
        max_new_tokens=12,
        do_sample=False,
    )
    return out[:, ids.shape[1] :].tolist()


def main():
    torch.manual_seed(0)
    model = C.qwen2_audio(window_s=30.0, audio_hidden=64, audio_layers=2, hidden=64, layers=2, vocab=2048)
    answers = []
    for clip in range(2):
        mel = C.log_mel(C.fake_speech(30.0, seed=clip), n_mels=128, frames=WINDOW_FRAMES)
        answers += ask(model, mel, QUESTIONS)  # MISTAKE
    print("answers:", len(answers))


if __name__ == "__main__":
    main()
