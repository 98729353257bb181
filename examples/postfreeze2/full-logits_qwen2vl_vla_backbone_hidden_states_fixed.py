"""A vision-language-action policy that uses a Qwen-VL backbone only for its last hidden states.

FIXED TWIN: the backbone is called with logits_to_keep=1, so lm_head runs on one position only.

What the user did: a robot policy (GR00T-style) runs a Qwen-VL model as backbone on the camera images
and the instruction, and feeds ``hidden_states[-1]`` to an action head. The backbone's forward still
evaluates ``lm_head`` over every position -- a [B, S, vocab] tensor with a 150k vocabulary -- that is
discarded on the next line. The fix is one argument: ``logits_to_keep=1``.

Sources:
- https://github.com/NVIDIA/Isaac-GR00T/pull/734 ("Skip full-vocabulary logits the backbone never reads
  (logits_to_keep=1) ... The backbone consumes only hidden_states[-1], but
  Qwen3VLForConditionalGeneration.forward evaluates lm_head unconditionally")
- https://github.com/NVIDIA-NeMo/Automodel/issues/3907 ("Full [B, S, V] logits materialized ... only
  narrows logits_to_keep for FusedLinearCrossEntropy")

Reproduction: a tiny random-weight Qwen2-VL with a 32k vocabulary; two 224x224 camera views
(2 x 64 merged tokens) plus a 40-token instruction; a small MLP action head on the pooled last hidden
state; 4 control steps.
"""

import _common as c
import torch

EXPECT = None

VOCAB = 32768


class VLAPolicy(torch.nn.Module):
    def __init__(self, vlm, action_dim=7):
        super().__init__()
        self.vlm = vlm
        hidden = vlm.config.get_text_config().hidden_size
        self.action_head = torch.nn.Sequential(
            torch.nn.Linear(hidden, 256), torch.nn.GELU(), torch.nn.Linear(256, action_dim)
        )

    def forward(self, inputs):
        out = self.vlm(**inputs, output_hidden_states=True, logits_to_keep=1)
        feats = out.hidden_states[-1]
        mask = inputs["attention_mask"].unsqueeze(-1).to(feats.dtype)
        pooled = (feats * mask).sum(1) / mask.sum(1)
        return self.action_head(pooled)


def observation(vlm, step):
    views = [c.normalize(c.fake_rgb(224, 224, seed=10 * step + k)) for k in range(2)]
    return c.qwen_inputs(vlm, images=views, prompt_tokens=40, seed=step)


def main():
    torch.manual_seed(0)
    vlm = c.qwen_vl("qwen2-vl", vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=VOCAB)
    policy = VLAPolicy(vlm).eval()
    with torch.inference_mode():
        for step in range(4):
            action = policy(observation(vlm, step))
            print(f"step {step}: action {[round(v, 3) for v in action[0].tolist()[:3]]} ...")


if __name__ == "__main__":
    main()
