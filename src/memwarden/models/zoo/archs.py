"""The zoo's families: one ``Arch`` subclass per transformers architecture, tiny and small configs.

Also the name registry (``NAMES``) and the lookups on it: ``spec`` and ``build_config``.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from memwarden.errors import InputError
from memwarden.models.zoo.base import (
    BOS_ID,
    ENCODER_SIZES,
    MEL_FRAMES_PER_SECOND,
    PAD_ID,
    SIZES,
    TEXT_SIZES,
    Arch,
    Request,
    ZooSpec,
    random_pixels,
    text_config,
    top_ids,
    vit_config,
)


class UnknownModelError(InputError):
    """A zoo name that does not exist."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown zoo model {name!r}; valid names: {', '.join(NAMES)}")
        self.name = name


class _Llava(Arch):
    name, family, model_class = "llava", "llava", "LlavaForConditionalGeneration"
    description = "LLaVA-1.5 style: CLIP ViT (penultimate layer, CLS dropped) + 2-layer MLP projector + Llama"

    def config(self, size: str) -> Any:
        # small: CLIP ViT at 224 px / patch 14 -> 256 image tokens
        image, patch = {"tiny": (32, 8), "small": (224, 14)}[size]
        return transformers.LlavaConfig(  # type: ignore[call-arg]  # pad_token_id goes through **kwargs
            vision_config=vit_config(size, image, patch, model_type="clip_vision_model"),
            text_config=text_config(size, model_type="llama"),
            image_token_index=top_ids(size, 1)[0],
            image_seq_length=(image // patch) ** 2,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
            pad_token_id=PAD_ID,
        )

    def placeholders(self, cfg: Any, req: Request) -> int:
        vc = cfg.vision_config
        # LlavaModel.get_image_features: "default" drops the CLS token, "full" keeps it
        return (vc.image_size // vc.patch_size) ** 2 + (cfg.vision_feature_select_strategy == "full")


class _PaliGemma(Arch):
    name, family, model_class = "paligemma", "paligemma", "PaliGemmaForConditionalGeneration"
    description = "PaliGemma style: SigLIP ViT (no head) + linear projector + Gemma; bidirectional prefix"
    media_first = True  # PaliGemmaProcessor: <image>*N + BOS + prompt + "\n"

    def config(self, size: str) -> Any:
        image, patch = {"tiny": (32, 8), "small": (224, 14)}[size]
        t = TEXT_SIZES[size]
        return transformers.PaliGemmaConfig(
            vision_config=vit_config(size, image, patch, model_type="siglip_vision_model", vision_use_head=False),
            text_config=text_config(size, model_type="gemma", head_dim=t["hidden"] // t["heads"]),
            image_token_index=top_ids(size, 1)[0],
            vocab_size=t["vocab"],
            projection_dim=t["hidden"],
            hidden_size=t["hidden"],
        )

    def placeholders(self, cfg: Any, req: Request) -> int:
        return int(cfg.text_config.num_image_tokens)  # (image_size // patch_size) ** 2, set by the config

    def extra_text_tensors(self, cfg: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        # The processor marks prefix (image + prompt) 0 and suffix 1; a generation request has no
        # suffix, so the whole prompt attends bidirectionally and generated tokens causally.
        return {"token_type_ids": torch.zeros_like(input_ids)}


class _Idefics3(Arch):
    name, family, model_class = "idefics3", "idefics3", "Idefics3ForConditionalGeneration"
    description = "SmolVLM / Idefics3 style: SigLIP-like ViT + pixel-shuffle connector + Llama; one global image"
    n_special = 3  # <fake_token_around_image>, <global-img>, <image>

    def config(self, size: str) -> Any:
        # small: SmolVLM's 512 px / patch 16 encoder with pixel-shuffle 4 -> 64 tokens per image
        image, patch, scale = {"tiny": (32, 4, 2), "small": (512, 16, 4)}[size]
        return transformers.Idefics3Config(  # type: ignore[call-arg]  # pad_token_id goes through **kwargs
            vision_config=vit_config(size, image, patch),
            text_config=text_config(size, model_type="llama"),
            image_token_id=top_ids(size, self.n_special)[-1],
            scale_factor=scale,
            pad_token_id=PAD_ID,
        )

    def placeholders(self, cfg: Any, req: Request) -> int:
        vc = cfg.vision_config
        return int(((vc.image_size // vc.patch_size) ** 2) / (cfg.scale_factor**2))  # Idefics3Model.image_seq_len

    def markers(self, cfg: Any) -> tuple[list[int], list[int], list[int]]:
        fake, glob = cfg.image_token_id - 2, cfg.image_token_id - 1  # the zoo puts them right below <image>
        # Idefics3Processor, no splitting: <fake_token_around_image><global-img><image>*N<fake_token_around_image>
        return [BOS_ID], [fake, glob], [fake]

    def media(self, cfg: Any, req: Request, gen: torch.Generator) -> dict[str, torch.Tensor]:
        w, h = req.image
        return {
            "pixel_values": random_pixels(gen, req.batch, 1, 3, h, w),  # (B, images, 3, H, W)
            "pixel_attention_mask": torch.ones(req.batch, 1, h, w, dtype=torch.bool),  # no padding inside
        }


class _Gemma3(Arch):
    name, family, model_class = "gemma3", "gemma3", "Gemma3ForConditionalGeneration"
    description = "Gemma 3 style: SigLIP ViT + avg-pool to a fixed token count + Gemma 3 (sliding/global layers)"
    n_special = 3  # <start_of_image>, <end_of_image>, <image_soft_token>

    def config(self, size: str) -> Any:
        # small: 448 px / patch 14 = 32x32 patches pooled 2x2 -> 256 tokens (Gemma 3: 896 px pooled 4x4 -> 256)
        image, patch, mm_tokens = {"tiny": (32, 4, 16), "small": (448, 14, 256)}[size]
        t = TEXT_SIZES[size]
        head_dim = t["hidden"] // t["heads"]
        boi, eoi, image_tok = top_ids(size, self.n_special)
        # Gemma 3 has five sliding-window layers per global one; keep at least one global layer.
        n = t["layers"]
        layer_types = ["full_attention" if i % 6 == 5 or i == n - 1 else "sliding_attention" for i in range(n)]
        return transformers.Gemma3Config(
            vision_config=vit_config(size, image, patch, model_type="siglip_vision_model", vision_use_head=False),
            text_config=text_config(
                size,
                head_dim=head_dim,
                query_pre_attn_scalar=head_dim,
                sliding_window={"tiny": 64, "small": 512}[size],
                layer_types=layer_types,
            ),
            mm_tokens_per_image=mm_tokens,
            boi_token_index=boi,
            eoi_token_index=eoi,
            image_token_index=image_tok,
        )

    def placeholders(self, cfg: Any, req: Request) -> int:
        return int(cfg.mm_tokens_per_image)

    def markers(self, cfg: Any) -> tuple[list[int], list[int], list[int]]:
        # Gemma3Processor: "\n\n<start_of_image>" + <image_soft_token>*N + "<end_of_image>\n\n";
        # the newlines are ordinary text tokens.
        return [BOS_ID], [cfg.boi_token_id], [cfg.eoi_token_id]

    def finish_init(self, model: Any) -> None:
        # Gemma3PreTrainedModel._init_weights zeroes the projector (a checkpoint overwrites it), which
        # would embed every image to zeros; give it unit-gain random weights instead.
        weight = model.model.multi_modal_projector.mm_input_projection_weight  # (vision_hidden, text_hidden)
        with torch.no_grad():
            weight.normal_(0.0, weight.shape[0] ** -0.5)

    def extra_text_tensors(self, cfg: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        # Gemma3Processor's token_type_ids: 1 on image soft tokens (bidirectional block), 0 elsewhere
        return {"token_type_ids": (input_ids == cfg.image_token_id).long()}


class _QwenVL(Arch):
    """Qwen2-VL and Qwen2.5-VL: dynamic resolution, patch merger, M-RoPE."""

    n_special = 4  # <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|>
    native_px = {"tiny": 112, "small": 448}  # small: 32x32 patches of 14 px merged 2x2 -> 256 tokens

    def _config(self, size: str, config_cls: Any, vision: dict[str, Any]) -> Any:
        t = TEXT_SIZES[size]
        half_head = t["hidden"] // t["heads"] // 2
        # M-RoPE splits the rotary half-dimension into (temporal, height, width), [16, 24, 24] of 64 in Qwen2-VL
        spatial = (half_head - half_head // 4) // 2
        mrope = [half_head - 2 * spatial, spatial, spatial]
        vstart, vend, image_tok, video_tok = top_ids(size, self.n_special)
        cfg = config_cls(
            vision_config={"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, **vision},
            text_config=text_config(
                size, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": mrope}
            ),
            vision_start_token_id=vstart,
            vision_end_token_id=vend,
            image_token_id=image_tok,
            video_token_id=video_tok,
        )
        cfg.native_image_px = self.native_px[size]
        return cfg

    def native_image_size(self, cfg: Any) -> tuple[int, int] | None:
        # Dynamic resolution has no native size; this is the one zoo requests default to
        # (448 px, 16x16 merged tokens, for a config from elsewhere).
        side = int(getattr(cfg, "native_image_px", 448))
        return (side, side)

    def image_multiple(self, cfg: Any) -> int | None:
        vc = cfg.vision_config
        return int(vc.patch_size * vc.spatial_merge_size)

    def check_image(self, cfg: Any, image_wh: tuple[int, int]) -> None:
        m = self.image_multiple(cfg) or 1
        w, h = image_wh
        if w <= 0 or h <= 0 or w % m or h % m:
            raise InputError(
                f"{self.name} takes images whose width and height are positive multiples of {m} px "
                f"(patch_size x spatial_merge_size; its processor resizes to that); got {w}x{h}."
            )

    def _grid(self, cfg: Any, req: Request) -> tuple[int, int, int]:
        p = cfg.vision_config.patch_size
        w, h = req.image
        return (1, h // p, w // p)  # (t, h, w) in patches; a still image is one temporal patch

    def placeholders(self, cfg: Any, req: Request) -> int:
        t, gh, gw = self._grid(cfg, req)
        return t * gh * gw // cfg.vision_config.spatial_merge_size**2

    def markers(self, cfg: Any) -> tuple[list[int], list[int], list[int]]:
        # Qwen2VLProcessor: <|vision_start|><|image_pad|>*N<|vision_end|>; Qwen prompts have no BOS
        return [], [cfg.vision_start_token_id], [cfg.vision_end_token_id]

    def media(self, cfg: Any, req: Request, gen: torch.Generator) -> dict[str, torch.Tensor]:
        vc = cfg.vision_config
        t, gh, gw = self._grid(cfg, req)
        patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
        return {
            "pixel_values": random_pixels(gen, req.batch * t * gh * gw, patch_dim),  # (images*patches, C*T*P*P)
            "image_grid_thw": torch.tensor([[t, gh, gw]] * req.batch, dtype=torch.long),  # (images, 3)
        }

    def extra_text_tensors(self, cfg: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        # ProcessorMixin.create_mm_token_type_ids (text 0, image 1, video 2): M-RoPE needs it
        return {"mm_token_type_ids": (input_ids == cfg.image_token_id).int()}


class _Qwen2VL(_QwenVL):
    name, family, model_class = "qwen2-vl", "qwen2_vl", "Qwen2VLForConditionalGeneration"
    description = "Qwen2-VL style: dynamic-resolution ViT with 2D RoPE + 2x2 patch merger + Qwen2 with M-RoPE"

    def config(self, size: str) -> Any:
        e = ENCODER_SIZES[size]
        vision = {
            "depth": e["layers"],
            "embed_dim": e["hidden"],
            "num_heads": e["heads"],
            "mlp_ratio": e["ffn"] // e["hidden"],
            "hidden_size": TEXT_SIZES[size]["hidden"],  # the merger's output width
        }
        return self._config(size, transformers.Qwen2VLConfig, vision)


class _Qwen25VL(_QwenVL):
    name, family, model_class = "qwen2.5-vl", "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"
    description = "Qwen2.5-VL style: windowed-attention ViT (RMSNorm, SwiGLU) + patch merger + Qwen2 with M-RoPE"

    def config(self, size: str) -> Any:
        e = ENCODER_SIZES[size]
        vision = {
            "depth": e["layers"],
            "hidden_size": e["hidden"],
            "num_heads": e["heads"],
            "intermediate_size": e["ffn"],
            "out_hidden_size": TEXT_SIZES[size]["hidden"],
            "window_size": 112,  # px, Qwen2.5-VL's value
            "fullatt_block_indexes": list(range(e["layers"] // 2 - 1, e["layers"], e["layers"] // 2)),
        }
        return self._config(size, transformers.Qwen2_5_VLConfig, vision)


class _Qwen2Audio(Arch):
    name, family, model_class = "qwen2-audio", "qwen2_audio", "Qwen2AudioForConditionalGeneration"
    description = "Qwen2-Audio style: Whisper-like encoder over a fixed mel window + linear projector + Qwen2"
    modality = "audio"
    n_special = 3  # <|audio_bos|>, <|audio_eos|>, <|AUDIO|>
    default_seconds = {"tiny": 1.0, "small": 10.0}

    def config(self, size: str) -> Any:
        # small: Whisper's 30 s window (1500 encoder positions); the default 10 s request -> 250 tokens
        e = ENCODER_SIZES[size]
        cfg = transformers.Qwen2AudioConfig(
            audio_config={
                "model_type": "qwen2_audio_encoder",
                "d_model": e["hidden"],
                "encoder_layers": e["layers"],
                "encoder_attention_heads": e["heads"],
                "encoder_ffn_dim": e["ffn"],
                "num_mel_bins": 128,
                "max_source_positions": {"tiny": 100, "small": 1500}[size],
            },
            text_config=text_config(size, model_type="qwen2"),
            audio_token_index=top_ids(size, self.n_special)[-1],
        )
        cfg.default_audio_frames = round(self.default_seconds[size] * MEL_FRAMES_PER_SECOND)
        return cfg

    def placeholder_id(self, cfg: Any) -> int:
        return int(cfg.audio_token_id)

    def native_image_size(self, cfg: Any) -> tuple[int, int] | None:
        return None

    def audio_frames_range(self, cfg: Any) -> tuple[int, int, int]:
        # Qwen2AudioEncoder.forward: input padded to max_source_positions * conv strides (1 * 2).
        # Fewer than 7 frames make a single audio token, which Qwen2AudioModel.forward takes for an
        # unexpanded legacy prompt and mis-merges; a real clip is never that short.
        longest = int(cfg.audio_config.max_source_positions * 2)
        return 7, int(getattr(cfg, "default_audio_frames", longest)), longest

    def placeholders(self, cfg: Any, req: Request) -> int:
        # Qwen2AudioEncoder._get_feat_extract_output_lengths: conv stride 2, then avg-pool 2
        after_conv = (req.frames - 1) // 2 + 1
        return (after_conv - 2) // 2 + 1

    def markers(self, cfg: Any) -> tuple[list[int], list[int], list[int]]:
        audio_bos, audio_eos = cfg.audio_token_id - 2, cfg.audio_token_id - 1  # right below <|AUDIO|>
        return [], [audio_bos], [audio_eos]

    def media(self, cfg: Any, req: Request, gen: torch.Generator) -> dict[str, torch.Tensor]:
        mels = cfg.audio_config.num_mel_bins
        window = self.audio_frames_range(cfg)[2]
        feats = torch.zeros(req.batch, mels, window)  # (B, mel, frames), padded like the feature extractor
        feats[:, :, : req.frames] = torch.randn(req.batch, mels, req.frames, generator=gen)
        mask = torch.zeros(req.batch, window, dtype=torch.long)  # (B, frames)
        mask[:, : req.frames] = 1
        return {"input_features": feats, "feature_attention_mask": mask}


_ARCHS: dict[str, Arch] = {
    a.name: a for a in (_Llava(), _Qwen2VL(), _PaliGemma(), _Idefics3(), _Gemma3(), _Qwen2Audio(), _Qwen25VL())
}
NAMES: tuple[str, ...] = tuple(_ARCHS)
ARCH_BY_FAMILY = {a.family: a for a in _ARCHS.values()}


def family_arch(name: str) -> Arch:
    try:
        return _ARCHS[name]
    except KeyError:
        raise UnknownModelError(name) from None


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise InputError(f"unknown zoo size {size!r}; valid sizes: {', '.join(SIZES)}")


def spec(name: str, size: str = "tiny") -> ZooSpec:
    """What zoo model ``name`` is at ``size``: family, modality, native request, special ids."""
    arch = family_arch(name)
    _check_size(size)
    return arch.spec(size)


def build_config(name: str, size: str = "tiny") -> transformers.PretrainedConfig:
    """The transformers config of zoo model ``name`` at ``size`` (a fresh object on every call)."""
    arch = family_arch(name)
    _check_size(size)
    return arch.config(size)
