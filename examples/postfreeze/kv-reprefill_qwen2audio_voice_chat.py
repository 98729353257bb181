"""A voice-note assistant on a Qwen2-Audio-style model: every chat turn rebuilds the whole prompt
(audio clip + all previous questions and answers) and calls ``generate`` again with the audio
features, so the clip is re-encoded and the whole history re-prefilled every turn.

Source: https://github.com/fpgaminer/joycaption/issues/56
  "the application get's real slow because I have to pass an image to every conversational step"
  ... "Do you know a way to ask multiple questions to one single image?"
See also https://github.com/abetlen/llama-cpp-python/issues/2222 ("In multi-turn conversations that
include images, the image encoding is performed on each turn").

The prefill of turn k covers the audio tokens plus k turns of history; keeping the KV cache across
turns would prefill only the new question.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "kv-reprefill"
FIX_WORDS = ("cache", "past_key_values", "DynamicCache", "reuse", "re-use")

TURNS = 6
NEW_TOKENS = 8


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_audio(window_s=8.0, hidden=256, layers=4, ffn=1024, vocab=4096)
    gen = zoo.generate_kwargs("qwen2-audio")
    first = zoo.make_inputs(model, audio_seconds=8.0, prompt_tokens=24)
    history = first["input_ids"]
    with torch.no_grad():
        for turn in range(TURNS):
            if turn:
                question = c.text_ids(40, 4093, seed=turn)
                history = torch.cat([history, question], dim=1)
            out = model.generate(
                input_ids=history,
                attention_mask=torch.ones_like(history),  # MISTAKE
                input_features=first["input_features"],
                feature_attention_mask=first["feature_attention_mask"],
                max_new_tokens=NEW_TOKENS,
                **gen,
            )
            history = out
            print(f"turn {turn}: prompt+answer {history.shape[1]} tokens")


if __name__ == "__main__":
    main()
