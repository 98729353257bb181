"""A camera-assistant chat loop on a Qwen2-VL-style model: every turn the user sends a new snapshot
and a question; the app keeps each turn's full ``generate`` output (``output_scores=True``) in the
transcript so that the UI can show token confidences later.

Source: https://github.com/JIA-Lab-research/LLaMA-VID/issues/57
  "When using cli.py for inference, as the problem continues, the GPU's graphics card usage also
   increases. Is there any way to prevent the GPU's graphics memory from increasing"
Source (what the kept objects carry): https://github.com/huggingface/transformers/pull/19373 —
  ``output_scores`` / ``output_attentions`` / ``output_hidden_states`` are stored on the generate output.

Each kept output holds a (1, vocab) score tensor per generated token and the turn's KV cache, so the
transcript grows by megabytes per turn although the UI only needs the chosen tokens' probabilities.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "retained-outputs"
FIX_WORDS = ("sequences", "del", "scores", "only", "probabilit")

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
            transcript.append(out)  # MISTAKE
            print(f"turn {turn}: {out.sequences.shape[1] - inputs['input_ids'].shape[1]} new tokens")
    confidences = [torch.stack([s.softmax(-1).max() for s in o.scores]).mean().item() for o in transcript]
    print("mean confidence per turn:", [round(x, 4) for x in confidences])


if __name__ == "__main__":
    main()
