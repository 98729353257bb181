"""Issue 15, held out: images a model takes through cross-attention (Mllama: Llama 3.2 Vision) and
float pixels in the model's dtype (Chameleon's VQ image encoder takes no float32 pixels in bf16).

Each request is estimated on the meta device and compared with a live ``memwarden.capture`` of the
same request on a tiny random-weight twin; the Mllama request is compared with what transformers'
own MllamaProcessor makes of the same prompt and image sizes."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers.models.mllama.image_processing_pil_mllama import (
    get_all_supported_aspect_ratios,
    get_optimal_tiled_canvas,
)

import memwarden
from _shrink import tiny_config
from memwarden.analyze.timeline import summary
from memwarden.estimation.metamodel import forget_models
from memwarden.estimation.request import build_request
from memwarden.estimation.resolve import CONFIG_DIR, resolve_model
from memwarden.record.meta import capture as meta
from test_estimate_families import _meta_and_live

MLLAMA = "llama-3.2-11b-vision-instruct"
_GENERATE = {"do_sample": False, "num_beams": 1, "eos_token_id": None, "pad_token_id": 0}


def _tiny_mllama() -> dict:
    """The shipped config shrunk (2 layers, one of them cross-attention; 56 px tiles, up to 4), its
    vocabulary cut to 1024 ids so that the embeddings do not hide the images' bytes."""
    data = json.loads((CONFIG_DIR / f"{MLLAMA}.json").read_text())
    data = tiny_config({k: v for k, v in data.items() if not k.startswith("_")}, 56)
    data["image_token_index"] = 1024  # the first id past the text vocabulary, as 128256 is
    data["text_config"].update(vocab_size=1024, bos_token_id=1000, eos_token_id=[1001], pad_token_id=1002)
    return data


@pytest.mark.parametrize("images", [(), ((56, 56),), ((112, 56), (40, 90))], ids=["text", "one", "two-sizes"])
def test_mllama_meta_estimate_matches_live(images: tuple) -> None:
    data = _tiny_mllama()
    assert data["text_config"]["cross_attention_layers"] == [1] and data["vision_config"]["max_num_tiles"] == 4
    est, live, tokens = _meta_and_live(data, images, dtype=torch.bfloat16)
    assert abs(est - live) <= 0.01 * live, (images, est, live)
    assert tokens == {"vision": len(images), "audio": 0, "text": 12}  # one <|image|> token per image


def _live_summary(data: dict, inputs: dict, new_tokens: int) -> object:
    cfg = transformers.CONFIG_MAPPING[data["model_type"]].from_dict(data)
    torch.manual_seed(0)
    live = transformers.MllamaForConditionalGeneration._from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
    ).eval()
    real = {k: (torch.randn(v.shape, dtype=v.dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.inference_mode():
        live.generate(**real, max_new_tokens=1, min_new_tokens=1, **_GENERATE)  # lazy kernels warmed
    forget_models()
    gc.collect()
    with memwarden.capture() as cap, torch.inference_mode():
        live.generate(**real, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **_GENERATE)
    return summary(cap.trace)


def test_mllama_decode_grows_the_cross_attention_mask_as_generate_does(tmp_path: Path) -> None:
    """generate() appends a row per decoded token to cross_attention_mask (on the host) and the
    cross-attention layers keep the tiles' keys and values from prefill: the estimate runs 5 and 6
    steps and extrapolates to 12; every phase within 1% of a live run of all 12."""
    data = _tiny_mllama()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    card = memwarden.estimate(str(path), images=[(112, 56)], prompt_tokens=12, new_tokens=12, dtype="bfloat16")
    assert card.generation is not None and card.generation["extrapolated"]
    cfg = transformers.CONFIG_MAPPING["mllama"].from_dict(data)
    meta_model = meta.build_meta_model(cfg, torch.bfloat16, "MllamaForConditionalGeneration")
    inputs, _ = build_request(meta_model, cfg, images=((112, 56),), prompt_tokens=12, new_tokens=12, batch=1)
    live = _live_summary(data, inputs, 12)
    assert abs(card.peak_bytes - live.peak_bytes) <= 0.01 * live.peak_bytes, (card.peak_bytes, live.peak_bytes)
    for phase in ("prefill", "decode"):
        est, real = card.phases[phase]["peak_bytes"], live.by_phase_peak[phase]
        assert abs(est - real) <= 0.01 * real, (phase, est, real)


def _llama3_tokenizer(ids: list[int]) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer with Llama 3's special tokens under their own names."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = {"<|begin_of_text|>": 128000, "<|python_tag|>": 128010, "<|image|>": 128256}
    vocab = {**{f"w{i}": i for i in ids if i not in specials.values()}, **specials}
    words = Tokenizer(models.WordLevel(vocab))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<|begin_of_text|>")


def test_mllama_request_is_what_its_processor_makes() -> None:
    """Tiles, aspect-ratio ids and mask, image tokens and cross_attention_mask are MllamaProcessor's
    for the same prompt and image sizes: its image processor from the class defaults with the
    checkpoint's 560 px tiles (its preprocessor_config.json), and Llama 3's special tokens."""
    resolved = resolve_model(MLLAMA)
    model = meta.build_meta_model(resolved.config, torch.bfloat16, resolved.model_class)
    sizes = ((1120, 560), (500, 1500), (300, 300))  # (W, H): wide, tall, smaller than a tile
    inputs, tokens = build_request(model, resolved.config, images=sizes, prompt_tokens=16, new_tokens=1, batch=2)
    ids = inputs["input_ids"][0].tolist()
    assert ids.count(128256) == 3 and tokens == {"vision": 3, "audio": 0, "text": 16}

    image_processor = transformers.MllamaImageProcessorPil(size={"height": 560, "width": 560})
    assert image_processor.max_image_tiles == resolved.config.vision_config.max_num_tiles == 4
    tokenizer = _llama3_tokenizer(ids)
    text = " ".join(tokenizer.convert_ids_to_tokens(ids))  # "<|begin_of_text|> <|image|> w13 <|image|> ..."
    processor = transformers.MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    blanks = [np.zeros((h, w, 3), dtype=np.uint8) for w, h in sizes]
    expected = processor(text=[text, text], images=[blanks, blanks], return_tensors="pt")
    assert torch.equal(inputs["input_ids"], expected["input_ids"])
    for key in ("attention_mask", "cross_attention_mask", "aspect_ratio_ids", "aspect_ratio_mask"):
        assert torch.equal(inputs[key], expected[key]), key
    pixels = inputs["pixel_values"]
    assert pixels.is_meta and pixels.dtype == torch.bfloat16  # the model's dtype; no real pixel bytes
    assert pixels.shape == expected["pixel_values"].shape == (2, 3, 4, 3, 560, 560)
    # the processor's own tiling helpers: 1120x560 is one row of two tiles, aspect ratio (1, 2)
    ratios = get_all_supported_aspect_ratios(4)
    for j, (w, h) in enumerate(sizes):
        canvas_h, canvas_w = get_optimal_tiled_canvas(h, w, 4, 560)
        tiles = (canvas_h // 560, canvas_w // 560)
        assert int(inputs["aspect_ratio_ids"][0, j]) == ratios.index(tiles) + 1
        assert int(inputs["aspect_ratio_mask"][0, j].sum()) == tiles[0] * tiles[1]
    assert int(inputs["aspect_ratio_ids"][0, 0]) == ratios.index((1, 2)) + 1


def test_mllama_image_is_one_clear_error_where_the_processor_refuses_it() -> None:
    resolved = resolve_model(MLLAMA)
    model = meta.build_meta_model(resolved.config, torch.bfloat16, resolved.model_class)
    with pytest.raises(memwarden.errors.InputError, match="max_pixels"):
        build_request(
            model, resolved.config, images=((448, 448),), prompt_tokens=8, new_tokens=1, batch=1, max_pixels=448 * 448
        )


def _tiny_chameleon() -> dict:
    """transformers' Chameleon defaults shrunk, with a VQ encoder small enough for bf16 on a CPU
    (64 px images, 4 x 4 codes) and the two parts of ``vocabulary_map`` the model reads: ``<image>``
    and the ``IMGIMG*`` names of the codebook's BPE ids (digits spelt A-J, as the checkpoint's)."""
    data = tiny_config(transformers.CONFIG_MAPPING["chameleon"]().to_dict())
    data.pop("image_token_id")  # the config reads it from the map, as the published config.json has none
    codes = 64
    spelt = {str(d): chr(ord("A") + d) for d in range(10)}
    names = {"IMGIMG" + "".join(spelt[c] for c in str(code)) + "Z": 4 + code for code in range(codes)}
    data["vocabulary_map"] = {"<image>": 8711, **names}
    data["vq_config"].update(
        resolution=64, base_channels=32, num_res_blocks=1, embed_dim=32, latent_channels=32, num_embeddings=codes
    )
    data["torch_dtype"] = "bfloat16"
    return data


def test_chameleon_pixels_reach_its_vq_encoder_in_the_models_dtype() -> None:
    data = _tiny_chameleon()
    cfg = transformers.CONFIG_MAPPING["chameleon"].from_dict(data)
    model = meta.build_meta_model(cfg, torch.bfloat16, "ChameleonForConditionalGeneration")
    inputs, tokens = build_request(model, cfg, images=((300, 200),), prompt_tokens=12, new_tokens=1, batch=1)
    assert inputs["pixel_values"].dtype == torch.bfloat16  # its conv_in takes no float32 pixels
    downsampling = 2 ** (len(data["vq_config"]["channel_multiplier"]) - 1)
    assert tokens["vision"] == (64 // downsampling) ** 2  # the processor's 64 px crop, in 16 px codes
    est, live, _ = _meta_and_live(data, ((300, 200),), dtype=torch.bfloat16)
    assert abs(est - live) <= 0.01 * live, (est, live)
