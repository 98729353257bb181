"""Fixed twin of ``qwen2vl_video_frames.py``: 6 frames sampled from the clip instead of 32.

Six frames at 224x224 px make 3 x 8 x 8 = 192 visual tokens instead of 1024 (what Qwen2-VL's
video processor gives with ``fps`` / ``max_frames`` set for the task), so the vision tower runs
on 768 patches and the language model's activations and KV shrink with the token count.

Uses the zoo's tiny random-weight Qwen2-VL. Run: ``python qwen2vl_video_frames_fixed.py`` or
``memwarden trace qwen2vl_video_frames_fixed.py``.
"""

from __future__ import annotations

import torch

from memwarden.models import zoo

FRAMES, FRAME_PX, QUESTION_TOKENS = 6, 224, 16  # 1.5 fps over the 4 s clip


def video_inputs(model: torch.nn.Module, frames: int, px: int, question_tokens: int) -> dict[str, torch.Tensor]:
    """input_ids, mask, mm_token_type_ids, pixel_values_videos and video_grid_thw for one clip."""
    cfg = model.config
    vc = cfg.vision_config
    grid = (frames // vc.temporal_patch_size, px // vc.patch_size, px // vc.patch_size)  # (t, h, w) patches
    n_tokens = grid[0] * grid[1] * grid[2] // vc.spatial_merge_size**2
    gen = torch.Generator().manual_seed(0)
    question = torch.randint(3, cfg.video_token_id - 4, (question_tokens,), generator=gen).tolist()
    ids = [cfg.vision_start_token_id] + [cfg.video_token_id] * n_tokens + [cfg.vision_end_token_id] + question
    input_ids = torch.tensor([ids])  # (1, T)
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "mm_token_type_ids": (input_ids == cfg.video_token_id).int() * 2,  # text 0, image 1, video 2
        "pixel_values_videos": torch.randn(grid[0] * grid[1] * grid[2], patch_dim, generator=gen),  # (patches, C*T*P*P)
        "video_grid_thw": torch.tensor([grid]),  # (videos, 3)
    }


def main() -> None:
    model = zoo.build_model("qwen2-vl")
    inputs = video_inputs(model, FRAMES, FRAME_PX, QUESTION_TOKENS)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("qwen2-vl"))
    print(f"{inputs['input_ids'].shape[1]} prompt tokens; answer {out[0, -4:].tolist()}")


if __name__ == "__main__":
    main()
