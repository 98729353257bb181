"""Every finding is the measured effect of its fix.

Two halves. The replay (``analyze/counterfactual.saving``) on hand-built traces: dropping, freeing
sooner and shrinking blocks gives the peak and allocation of the run written without them. Then a
test per pattern: a planted case and its fixed twin (the fix the finding names, applied) run under
a real capture; the planted run's ``saving_peak_bytes`` must equal the twin's measured peak
reduction within 10% or 1 MiB. The planted cases are ``examples/realworld``'s, where each docstring
quotes its public source.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

import memwarden
from memwarden.analyze.analysis import Analysis
from memwarden.analyze.counterfactual import Change, saving, union
from memwarden.analyze.diagnose import diagnose
from memwarden.analyze.finding import Finding
from memwarden.trace.model import Action, Category, Trace, TraceBuilder
from memwarden.trace.steps import steps_of

REALWORLD = Path(__file__).resolve().parents[1] / "examples" / "realworld"
POSTFREEZE = REALWORLD.parent / "postfreeze"
MiB = 1 << 20


def _trace(blocks: list[tuple[int, int, int]]) -> tuple[Trace, dict[int, int]]:
    """A trace of blocks ``(alloc time, free time or -1 for never, bytes)``; and each block's ALLOC row."""
    events = [(t0, Action.ALLOC, i, nbytes) for i, (t0, _, nbytes) in enumerate(blocks)]
    events += [(t1, Action.FREE, i, nbytes) for i, (_, t1, nbytes) in enumerate(blocks) if t1 >= 0]
    events.sort(key=lambda e: (e[0], e[1] == Action.ALLOC))  # a free before an alloc at the same time
    b = TraceBuilder()
    rows = {}
    for t, action, tensor, nbytes in events:
        row = b.event(t, action, tensor, 0x1000 * (tensor + 1), nbytes, category=Category.ACTIVATION)
        if action == Action.ALLOC:
            rows[tensor] = row
    return b.build(), rows


def test_drop_free_and_scale_replay_the_run_without_them() -> None:
    # a: 100 B for the whole run; b: 50 B kept to the end; c: 80 B at t=3..4 (the peak: 230 B)
    trace, rows = _trace([(0, 10, 100), (1, -1, 50), (3, 4, 80)])
    a = Analysis(trace)
    assert int(a.live_bytes.max()) == 230
    s = saving(a, Change(drop=np.array([rows[2]])))
    assert (s.saving_peak_bytes, s.saving_allocated_bytes, s.peak_after_bytes) == (80, 80, 150)
    # b freed right after it is made: the peak is a + c, allocation unchanged
    s = saving(a, Change(free_rows=np.array([rows[1]]), free_at=np.array([rows[1] + 1])))
    assert (s.saving_peak_bytes, s.saving_allocated_bytes) == (50, 0)
    # c at a quarter of its size
    s = saving(a, Change(scale_rows=np.array([rows[2]]), scale=np.array([0.25])))
    assert (s.saving_peak_bytes, s.saving_allocated_bytes) == (60, 60)
    # a "sooner" free that is later than the real one changes nothing; nothing ever goes negative
    s = saving(a, Change(free_rows=np.array([rows[2]]), free_at=np.array([trace.num_events])))
    assert s.saving_peak_bytes == 0 and s.saving_allocated_bytes == 0


def test_union_applies_both_fixes_once() -> None:
    """Two fixes together: each block dropped by either, freed at the sooner row, scaled by the
    smaller factor, and counted once (a block both free sooner is not freed twice)."""
    trace, rows = _trace([(0, 10, 100), (1, -1, 50), (3, 4, 80)])
    a = Analysis(trace)
    one = Change(free_rows=np.array([rows[1]]), free_at=np.array([rows[1] + 1]))
    other = Change(
        free_rows=np.array([rows[1]]),
        free_at=np.array([rows[2]]),
        scale_rows=np.array([rows[2]]),
        scale=np.array([0.5]),
    )
    both = union(one, other)
    assert both.free_rows.tolist() == [rows[1]] and both.free_at.tolist() == [rows[1] + 1]
    # b gone at once, c at half its size: the peak moves to a + b (150, before c is made) of 230
    s = saving(a, both)
    assert (s.saving_peak_bytes, s.saving_allocated_bytes) == (80, 40)
    # the same fix twice is the fix once (b is not freed twice): a + b + c - b = 180
    assert saving(a, union(one, one)).saving_peak_bytes == saving(a, one).saving_peak_bytes == 50


def _captured(path: Path) -> Trace:
    """A capture of the script run as ``memwarden trace`` runs it (as ``__main__``, its folder on
    ``sys.path``), with one torch thread."""
    import torch

    gc.collect()  # what an earlier case left in reference cycles (its model) is not this run's
    saved_argv, threads = sys.argv[:], torch.get_num_threads()
    sys.argv = [str(path)]
    # each corpus folder has its own helper modules under the same names (_common, _tiny): a case
    # imports its own folder's, not one an earlier case of another folder left in sys.modules
    for name in [
        m
        for m, mod in sys.modules.items()
        if m.startswith("_")
        and getattr(mod, "__file__", None)
        and Path(mod.__file__).parent.parent == path.parent.parent
    ]:
        del sys.modules[name]
    sys.path.insert(0, str(path.parent))
    torch.set_num_threads(1)
    try:
        with memwarden.capture() as cap:
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = saved_argv
        sys.path.remove(str(path.parent))
        torch.set_num_threads(threads)
    assert cap.trace is not None
    return cap.trace


def _peak_and_findings(path: Path) -> tuple[int, list[Finding]]:
    trace = _captured(path)
    return memwarden.summary(trace).peak_bytes, diagnose(trace)


# (planted case, pattern): the twin ``<case>_fixed.py`` applies the fix the finding names
PAIRS = [
    ("retained_generate_hidden_states", "retained-outputs"),
    ("two_models_switch", "two-models-alive"),
    ("full_logits_scoring", "full-logits"),
    ("multiplier_num_beams", "request-multiplier"),
    ("graph_total_loss", "graph-retention"),
    ("load_state_dict_copy", "load-spike"),
    ("dequant_saved_for_backward", "dequant-temporaries"),
    ("concat_manual_past", "kv-concat-growth"),
    ("reprefill_greedy_positional", "kv-reprefill"),
    ("padding_max_length", "alignment-padding"),
    # numpy frames held: the fix streams them (the twin decodes only the sampled 8)
    ("../postfreeze/untracked-host-memory_video_decode_all", "untracked-host-memory"),
    # a per-image feature dict: the fix bounds it to the 4 newest (the twin's LRU of 4)
    ("../postfreeze/unbounded-growth_llava_feature_cache_handler", "unbounded-growth"),
    # a policy that reads the hidden states of a causal VLM's forward: the logits are made and dropped
    # unread (the twin runs the base model, no LM head)
    ("../postfreeze2/full-logits_qwen2vl_vla_backbone_hidden_states", "full-logits"),
    # the third post-freeze corpus' misses at its freeze, measured since (a development corpus now):
    # a Whisper collator padding the labels (no attention mask says so: their trailing -100 do)
    ("../postfreeze3/alignment-padding_whisper_finetune_labels_pad_to_max_length", "alignment-padding"),
    # every layer dequantised at once by a merge script, outside any module: one layer at a time
    ("../postfreeze3/dequant-temporaries_qwen2vl_qlora_merge_dequantize_all_layers", "dequant-temporaries"),
    # a tower the script calls itself (clip.vision_model), every chunk's whole output kept
    ("../postfreeze3/retained-outputs_clip_video_frame_embeddings_keep_outputs", "retained-outputs"),
    # every frame's features appended, the last two read: a deque(maxlen=2)
    ("../postfreeze3/unbounded-growth_llava_live_camera_context_frames", "unbounded-growth"),
    # video frames each tiled with the single-image max_num=12 into a fixed-resolution tower
    ("../postfreeze3/vision-token-dominance_internvl_video_frames_tiled_max_num", "vision-token-dominance"),
    # a reranker batch's full logits while the next batch's ids (B, T) are joined: one position read
    ("../postfreeze3/full-logits_qwen2vl_page_reranker_yes_no_last_token", "full-logits"),
    # the fourth post-freeze corpus' misses at its freeze, measured since (a development corpus now):
    # an int8 linear keeping its dequantised fp32 weight on the module after the first call
    ("../postfreeze4/dequant-temporaries_llava_int8_weight_only_linear_caches_fp32", "dequant-temporaries"),
    # a caption judge log-softmaxing the full logits (a same-shaped copy) to read one position
    ("../postfreeze4/full-logits_qwen25vl_caption_judge_yes_probability", "full-logits"),
    # one chart sent with each of six questions in one batch: the image encoded and cached six times
    ("../postfreeze4/request-multiplier_qwen2vl_chart_questions_batch_duplicates_image", "request-multiplier"),
    # small crops upscaled to a megapixel by a document config's min_pixels
    ("../postfreeze4/vision-token-dominance_qwen2vl_small_crops_eval_min_pixels_1280", "vision-token-dominance"),
    # every mel chunk of a live stream appended to an attribute another method reads the last 10 of;
    # the list is local to main and freed before the capture ends: seen at the peak
    ("../postfreeze4/unbounded-growth_whisper_live_captions_mel_history", "unbounded-growth"),
    # a chat re-sending every earlier photo with a fresh cache each turn: the photos matched item by
    # item (each turn's stack is a new tensor, so no encode repeats as a whole)
    ("../postfreeze4/kv-reprefill_llava_multi_image_chat_resend_history", "kv-reprefill"),
    # a 2-minute clip sampled at 1 fps (120 frames) where SmolVLM2's recipe sends at most 64: the
    # saving is the run at 64 frames', the twin sends 8 (so only the finding's own saving is checked)
    # the fifth post-freeze corpus' misses at its freeze, measured since (a development corpus now):
    # a bf16 LM head whose tied weight is upcast to fp32 on every call (a float, not integer, weight)
    ("../postfreeze5/dequant-temporaries_gemma3_reward_judge_fp32_lm_head_weight_upcast", "dequant-temporaries"),
    # an int8 checkpoint dequantised to fp32 linears at load, the int8 blocks kept beside them
    ("../postfreeze5/dequant-temporaries_siglip_q8_checkpoint_dequantized_at_load", "dequant-temporaries"),
    # a model built with random weights, then a safetensors state dict (mapped) copied into it
    ("../postfreeze5/load-spike_mllama_random_init_then_load_safetensors", "load-spike"),
    # BLIP's generate runs its text decoder's own generate: 8 beams expand the image features
    ("../postfreeze5/request-multiplier_blip_shop_catalogue_beam_candidates", "request-multiplier"),
    # a podcast decoded whole into numpy, then cut into the 30 s windows the model reads
    ("../postfreeze5/untracked-host-memory_wav2vec2_podcast_ffmpeg_decode_whole_episode", "untracked-host-memory"),
    # (the sixth corpus, read after its measurement) an fp16 checkpoint loaded as float32, then .half():
    # a cast parameter by parameter frees the small ones first, the large stay duplicated at the peak
    ("../postfreeze6/load-spike_instructblip_from_pretrained_fp32_then_half", "load-spike"),
    # a bf16 model cast whole to the pixels' float32 at run time (model.to(pixel_values.dtype))
    ("../postfreeze6/dequant-temporaries_idefics2_bf16_checkpoint_upcast_on_dtype_mismatch", "dequant-temporaries"),
]


@pytest.mark.parametrize(("case", "pattern"), PAIRS, ids=[p for _, p in PAIRS])
def test_predicted_saving_is_the_fixed_twins_measured_saving(case: str, pattern: str) -> None:
    planted_peak, findings = _peak_and_findings((REALWORLD / f"{case}.py").resolve())
    fixed_peak, fixed_findings = _peak_and_findings((REALWORLD / f"{case}_fixed.py").resolve())
    mine = [f for f in findings if f.pattern == pattern]
    assert mine, f"{case}: no {pattern} finding ({[f.pattern for f in findings]})"
    predicted, measured = mine[0].saving_peak_bytes, planted_peak - fixed_peak
    assert abs(predicted - measured) <= max(0.1 * abs(measured), MiB), (case, predicted, measured)
    # the twin does not repeat the mistake loudly, nor raise another alarm (a correct run)
    assert not [f.pattern for f in fixed_findings if f.severity in ("high", "medium")], case
    for f in findings:  # the JSON contract: integers, never negative
        j = f.to_json()
        assert isinstance(j["saving_peak_bytes"], int) and j["saving_peak_bytes"] >= 0
        assert isinstance(j["saving_allocated_bytes"], int) and j["saving_allocated_bytes"] >= 0
        assert "change" not in j


def test_a_batch_padded_to_its_longest_row_is_no_alignment_padding() -> None:
    """Audio clips of 2-6 s padded to each batch's longest clip (zeros filled row by row, the mask
    says so): a third of the batch is padding, and still as small as a rectangular batch gets."""
    _, findings = _peak_and_findings(
        REALWORLD.parent / "postfreeze5" / "ok_hubert_call_center_emotion_batch_pad_longest.py"
    )
    assert not [f for f in findings if f.severity in ("high", "medium")], [(f.pattern, f.severity) for f in findings]


def test_a_generic_growth_explained_by_a_specific_pattern_is_told_once() -> None:
    """Chunk embeddings pooled without no_grad: the kept graphs are graph-retention's, and the same
    bytes read as unbounded growth stay a low hint that names it."""
    _, findings = _peak_and_findings(
        REALWORLD.parent / "postfreeze5" / "graph-retention_hubert_song_identity_chunk_embeddings.py"
    )
    assert findings[0].pattern == "graph-retention" and findings[0].severity == "high"
    growth = [f for f in findings if f.pattern == "unbounded-growth"]
    assert all(f.severity == "low" and f.evidence["same_bytes_as"] == "graph-retention" for f in growth)


def test_a_reassigned_output_is_not_a_retained_output() -> None:
    """A loop that reassigns ``out = model.generate(..., output_attentions=True)`` and keeps only
    ``out.sequences``: the old output lives on through the next call until it returns (the output is
    assembled after the last decode step), which is no kept output; keeping the whole output is."""
    case = REALWORLD.parent / "postfreeze2" / "retained-outputs_whisper_segments_keep_attentions"
    _, fixed = _peak_and_findings(case.with_name(case.name + "_fixed.py"))
    assert not [f for f in fixed if f.pattern == "retained-outputs" and f.severity in ("high", "medium")]
    _, planted = _peak_and_findings(case.with_name(case.name + ".py"))
    mine = [f for f in planted if f.pattern == "retained-outputs"]
    assert mine and mine[0].lines[0]["line"] == 51  # segments.append(out), not the generate call


def test_vision_tokens_saving_at_the_documented_max_pixels() -> None:
    """Qwen2-VL at a 1232 px photo (1936 tokens) against the model card's max_pixels=1280*28*28: the
    finding's saving is what the run at the recommended size (1008x980 px, 1260 tokens) saves."""
    script = Path(__file__).resolve().parent / "fixtures" / "vision_tokens_pair.py"
    planted_peak, findings = _peak_and_findings(script)
    mine = [f for f in findings if f.pattern == "vision-token-dominance"]
    assert mine and mine[0].evidence["recommended"] == {"max_pixels": 1280 * 28 * 28}
    os.environ["MW_VISION_SIZE"] = "1008x980"
    try:
        fixed_peak, fixed_findings = _peak_and_findings(script)
    finally:
        del os.environ["MW_VISION_SIZE"]
    measured = planted_peak - fixed_peak
    # the twin makes 1260 tokens, the recommendation 1280: a 1.5% smaller request than predicted
    assert abs(mine[0].saving_peak_bytes - measured) <= max(0.1 * measured, MiB), (mine[0].saving_peak_bytes, measured)
    assert not [f for f in fixed_findings if f.pattern == "vision-token-dominance"]


def test_a_fix_that_makes_the_run_fit_its_budget_is_high() -> None:
    """Severity follows the saving against the budget: a finding whose saving is small against the
    peak is high when the budget lies between the peak and the peak without it (``diagnose
    --budget``, and the demo with its budget); against a budget the fix cannot reach, the peak
    share decides as before."""
    trace = _captured(REALWORLD / "concat_manual_past.py")
    peak = memwarden.summary(trace).peak_bytes
    (g,) = [x for x in diagnose(trace) if x.pattern == "kv-concat-growth"]
    assert g.severity != "high" and g.saving_peak_bytes > 0
    fits = [x for x in diagnose(trace, budget_bytes=peak - g.saving_peak_bytes // 2) if x.pattern == g.pattern]
    assert fits[0].severity == "high"
    short = [x for x in diagnose(trace, budget_bytes=peak - 2 * g.saving_peak_bytes) if x.pattern == g.pattern]
    assert short[0].severity == g.severity


def test_fragmentation_saving_is_the_static_shape_twins_reserved_saving() -> None:
    """Fragmentation is reserved memory, which the live-bytes replay does not see: the planted run
    (24 random lengths) and its twin (one static length, the fix the finding names) are replayed
    through the caching-allocator model, and the twin reserves what the finding said it would save."""
    from memwarden.plan.allocator.config import AllocatorConfig
    from memwarden.plan.replay import replay

    planted = _captured(REALWORLD / "frag_variable_length.py")
    fixed = _captured(REALWORLD / "frag_variable_length_fixed.py")
    (finding,) = [f for f in diagnose(planted) if f.pattern == "fragmentation"]
    reserved = [replay(t, AllocatorConfig(), device=Analysis(t).device).peak_reserved_bytes for t in (planted, fixed)]
    measured = reserved[0] - reserved[1]
    assert measured > 0
    assert abs(finding.saving_peak_bytes - measured) <= max(0.1 * measured, MiB), (finding.saving_peak_bytes, measured)
    assert not [f for f in diagnose(fixed) if f.pattern == "fragmentation" and f.severity in ("high", "medium")]


def test_frames_beyond_the_documented_count_are_named_and_the_recipe_twin_is_clean() -> None:
    """SmolVLM video at one frame a second of a 2-minute clip: 120 frames, above SmolVLM2's
    documented 64 (generate passes the encoded frames, not pixel_values: counted from the
    encoder outputs' items); the twin's 8 uniformly spread frames raise nothing."""
    case = REALWORLD.parent / "postfreeze4" / "vision-token-dominance_idefics3_smolvlm_video_eval_1fps_all_frames"
    _, planted = _peak_and_findings(case.with_name(case.name + ".py"))
    mine = [f for f in planted if f.pattern == "vision-token-dominance"]
    assert mine and mine[0].evidence["frames"] == 120 and mine[0].evidence["documented_max_frames"] == 64
    assert mine[0].saving_peak_bytes > 0 and "max_frames" in mine[0].fix
    _, fixed = _peak_and_findings(case.with_name(case.name + "_fixed.py"))
    assert not [f for f in fixed if f.severity in ("high", "medium")]


def test_one_image_repeated_per_question_under_the_decoders_own_generate() -> None:
    """BLIP-2's generate runs its vision tower, then its language model's generate on
    ``inputs_embeds``: the prefill gets no ids and no pixels, so the items the tower was sent are
    the prefill's (record/inputs.StepMedia). Eight questions about one photo, the photo expanded
    to the batch: eight equal digests, a request multiplied by 8; one question per call is clean."""
    case = REALWORLD.parent / "postfreeze6" / "request-multiplier_blip2_catalogue_attribute_prompts_batch_repeats_image"
    trace = _captured(case.with_name(case.name + ".py"))
    prefill = [s for s in steps_of(trace) if s.phase == "prefill"][0]
    assert prefill.batch == 8 and prefill.media_repeat == 8 and len(set(prefill.media_digests)) == 1
    mine = [f for f in diagnose(trace) if f.pattern == "request-multiplier"]
    assert mine and mine[0].evidence["multiplier"] == 8 and mine[0].severity == "high"
    _, fixed = _peak_and_findings(case.with_name(case.name + "_fixed.py"))
    assert not [f for f in fixed if f.severity in ("high", "medium")], [(f.pattern, f.severity) for f in fixed]


@pytest.mark.parametrize(
    "twin",
    [
        # Kosmos-2 marks its image positions with a mask, not an id: 24 photos indexed with one
        # grounding prompt send the same ids with other images; where the images sit is unknown, so
        # no prefix is known to be shared (no kv-reprefill)
        "retained-outputs_kosmos2_grounded_photo_index_keep_forward_outputs_fixed",
        # an lru_cache(maxsize=32) of decoded pixels: once full, each request evicts one, so what is
        # kept stays at the bound (no retained-outputs)
        "unbounded-growth_git_cctv_snapshot_captions_lru_cache_unbounded_fixed",
        # (the seventh corpus, read after its measurement) OWLv2's text queries repeated for each of
        # 8 photos in one forward: the detector's documented input, no beams (no request-multiplier)
        "../postfreeze7/ok_owlv2_warehouse_photos_batch8_postprocess_inline",
    ],
)
def test_the_held_out_correct_runs_that_raised_an_alarm_are_clean(twin: str) -> None:
    _, fixed = _peak_and_findings((REALWORLD.parent / "postfreeze6" / f"{twin}.py").resolve())
    assert not [f for f in fixed if f.severity in ("high", "medium")], [(f.pattern, f.severity) for f in fixed]
