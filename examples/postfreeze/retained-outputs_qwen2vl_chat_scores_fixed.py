"""Fixed twin of retained-outputs_qwen2vl_chat_scores: per turn, reduce the scores to the chosen
tokens' probabilities right away and keep only token ids and those numbers.

Source: https://github.com/JIA-Lab-research/LLaMA-VID/issues/57
  "as the problem continues, the GPU's graphics card usage also increases"
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

TURNS = 8
NEW_TOKENS = 12


def main() -> None:
    torch.manual_seed(0)
    model = c.qwen2_vl(hidden=128, layers=4, vocab=16384)
    gen = zoo.generate_kwargs("qwen2-vl")
    transcript = []
    with torch.no_grad():
        for turn in range(TURNS):
            inputs = zoo.make_inputs(model, image_size=(448, 336), prompt_tokens=20, seed=turn)
            out = model.generate(
                **inputs, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, output_scores=True, **gen
            )
            new_ids = out.sequences[0, inputs["input_ids"].shape[1] :]
            probs = torch.stack([s.softmax(-1)[0, t] for s, t in zip(out.scores, new_ids, strict=False)])
            transcript.append((new_ids.tolist(), probs.mean().item()))
            del out
            print(f"turn {turn}: {len(new_ids)} new tokens")
    print("mean confidence per turn:", [round(p, 4) for _, p in transcript])


if __name__ == "__main__":
    main()
