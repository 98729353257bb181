"""Prefix reuse for M-RoPE models (Qwen2-VL, Qwen2.5-VL): their rotary positions are 3-D and, after an
image, run ahead of (or behind) the token index by the model's ``rope_deltas``. A later turn must reuse
the conversation's KV (the image neither encoded nor prefilled again) and continue the positions where
the cached prefix left them, giving the tokens of the careful user's loop: ``model.generate`` with one
``DynamicCache`` passed back every turn and the image sent once."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from memwarden.models import zoo
from memwarden.runtime import media as media_mod
from memwarden.runtime.mrope import MRopePositions
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig

NEW = 6
FAMILIES = ["qwen2-vl", "qwen2.5-vl"]


def _position_sensitive(model: torch.nn.Module) -> torch.nn.Module:
    """Sharpen the text attention: a tiny random model attends almost uniformly, so its greedy tokens barely
    move when positions are wrong. Scaled queries and keys make them depend on relative positions, so a
    wrong rope_deltas changes the tokens (checked by running these tests with positions left to the model)."""
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: _position_sensitive(zoo.build_model(name, "tiny")) for name in FAMILIES}


def _media(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}


def _conversation(model, image_size, seed):
    g = torch.Generator().manual_seed(seed)
    first = zoo.make_inputs(model, prompt_tokens=30, image_size=image_size, seed=seed)
    return [first] + [{"input_ids": torch.randint(3, 200, (1, n), generator=g)} for n in (9, 5)]


def _careful_user(model, name, turns):
    """One DynamicCache passed back every turn, the image sent with turn 1 only (transformers' recipe)."""
    gk = zoo.generate_kwargs(name)
    cache = DynamicCache(config=model.config)
    history, replies = None, []
    for i, t in enumerate(turns):
        history = t["input_ids"] if history is None else torch.cat([history, t["input_ids"]], 1)
        out = model.generate(
            input_ids=history,
            attention_mask=torch.ones_like(history),
            cache=cache,
            max_new_tokens=NEW,
            **(_media(t) if i == 0 else {}),
            **gk,
        )
        replies.append(out[:, history.shape[1] :])
        history = out
    return replies


class _EncoderRuns:
    """Counts the vision tower's forward calls (the real encoder, below any cache of its outputs)."""

    def __init__(self, model) -> None:
        self.calls = 0
        self.handle = model.model.visual.register_forward_pre_hook(self._count)

    def _count(self, *_args) -> None:
        self.calls += 1


@pytest.mark.parametrize("name", FAMILIES)
def test_chat_reuses_the_prefix_and_equals_generate_with_the_cache_passed_back(models, name):
    """Two conversations about images of different shapes (so different rope_deltas), interleaved turn by
    turn in one session: each turn after the first reuses everything its conversation wrote, the images
    are encoded once each, and every reply equals the careful user's, run conversation by conversation."""
    model = models[name]
    gk = zoo.generate_kwargs(name)
    convs = {"a": _conversation(model, (112, 112), seed=3), "b": _conversation(model, (56, 224), seed=4)}
    runs = _EncoderRuns(model)
    try:
        with torch.inference_mode():
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a supported family: nothing to warn about
                session = GovernedSession(model, budget="1GiB")
            replies: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
            for i in range(3):
                for c, turns in convs.items():
                    t = turns[i]
                    replies[c].append(
                        session.chat(t["input_ids"], conversation=c, max_new_tokens=NEW, **_media(t), **gk)
                    )
            encoder_calls = runs.calls
            refs = {c: _careful_user(model, name, turns) for c, turns in convs.items()}
    finally:
        runs.handle.remove()
    for c in convs:
        for got, want in zip(replies[c], refs[c], strict=True):
            assert torch.equal(got, want)
    assert encoder_calls == 2  # one image per conversation, encoded once
    stats = session.stats()
    assert stats["prefix_reuse_off_reason"] is None
    assert stats["prefix_hits"] > 0
    records = stats["requests"]
    for k in range(2, len(records)):  # turns 2+ of both conversations
        rec, prev = records[k], records[k - 2]
        assert rec["reused_tokens"] == prev["prompt_tokens"] + prev["new_tokens"] - 1 > 0
        assert not rec["media_reencoded"]


@pytest.mark.parametrize("name", FAMILIES)
def test_turn_two_stats_say_the_prefix_was_reused_and_the_image_not_encoded_again(models, name):
    """``stats()`` itself (not only its list of requests) answers for the latest turn: on turn 2 of a
    chat about one image, ``reused_tokens`` > 0 and ``media_reencoded`` False, where turn 1 sent the
    image through the encoder; the reply equals the careful user's."""
    model = models[name]
    gk = zoo.generate_kwargs(name)
    turns = _conversation(model, (112, 112), seed=11)[:2]
    with torch.inference_mode():
        session = GovernedSession(model, budget="1GiB")
        before = session.stats(include_requests=False)
        r1 = session.chat(turns[0]["input_ids"], max_new_tokens=NEW, **_media(turns[0]), **gk)
        one = session.stats(include_requests=False)
        r2 = session.chat(turns[1]["input_ids"], max_new_tokens=NEW, **gk)
        two = session.stats()
        refs = _careful_user(model, name, turns)
    assert torch.equal(r1, refs[0]) and torch.equal(r2, refs[1])
    assert before["reused_tokens"] == 0 and before["media_reencoded"] is None  # no request yet
    assert one["media_reencoded"] is True and one["reused_tokens"] == 0
    assert two["reused_tokens"] > 0 and two["media_reencoded"] is False
    last = two["requests"][-1]
    assert (two["reused_tokens"], two["media_reencoded"]) == (last["reused_tokens"], last["media_reencoded"])
    assert two["reused_tokens_total"] == sum(r["reused_tokens"] for r in two["requests"])


@pytest.mark.parametrize("name", FAMILIES)
def test_repeated_request_reuses_the_image_and_equals_plain_generate(models, name):
    model = models[name]
    gk = zoo.generate_kwargs(name)
    inputs = zoo.make_inputs(model, prompt_tokens=40, seed=5)
    with torch.inference_mode():
        ref = model.generate(**inputs, max_new_tokens=NEW, **gk)
        session = GovernedSession(model, budget="1GiB")
        first = session.generate(**inputs, max_new_tokens=NEW, **gk)
        text = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(2))
        ref_text = model.generate(input_ids=text, max_new_tokens=NEW, **gk)
        session.generate(input_ids=text, max_new_tokens=NEW, **gk)
        other = zoo.make_inputs(model, prompt_tokens=40, image_size=(56, 224), seed=6)
        session.generate(**other, max_new_tokens=NEW, **gk)  # leaves other rope_deltas on the model
        again = session.generate(**inputs, max_new_tokens=NEW, **gk)
        text_again = session.generate(input_ids=text, max_new_tokens=NEW, **gk)
    assert torch.equal(first, ref) and torch.equal(again, ref) and torch.equal(text_again, ref_text)
    assert session.records[4].reused_tokens > 0
    rec = session.records[3]
    assert rec.reused_tokens >= inputs["input_ids"].shape[1] - session.spec.block_size and not rec.media_reencoded


@pytest.mark.parametrize("name", FAMILIES)
def test_an_image_of_another_grid_is_not_served_from_the_cached_one(models, name):
    """Same tokens, same pixels, another grid (16 tokens as 8x8 or 4x16 patches): the positions after the
    image differ, so nothing at or after the image is reused, and the output is plain generate's."""
    model = models[name]
    gk = zoo.generate_kwargs(name)
    a = zoo.make_inputs(model, prompt_tokens=40, image_size=(112, 112), seed=7)
    b = dict(a, image_grid_thw=torch.tensor([[1, 16, 4]]))
    with torch.inference_mode():
        ref_b = model.generate(**b, max_new_tokens=NEW, **gk)
        session = GovernedSession(model, budget="1GiB")
        session.generate(**a, max_new_tokens=NEW, **gk)
        out_b = session.generate(**b, max_new_tokens=NEW, **gk)
    assert torch.equal(out_b, ref_b)
    image_start = int((a["input_ids"][0] == model.config.image_token_id).nonzero()[0])
    assert session.records[1].reused_tokens <= image_start


@pytest.mark.parametrize("name", FAMILIES)
def test_a_new_image_in_a_later_turn_equals_plain_generate(models, name):
    """A second image after the cached prefix: its positions start where the prefix's left off."""
    model = models[name]
    gk = zoo.generate_kwargs(name)
    first = zoo.make_inputs(model, prompt_tokens=30, seed=8)
    second = zoo.make_inputs(model, prompt_tokens=12, image_size=(56, 224), seed=9)
    patches: list[int] = []  # rows of pixel_values the vision tower encodes, per call
    hook = model.model.visual.register_forward_pre_hook(lambda _m, args: patches.append(args[0].shape[0]))
    try:
        with torch.inference_mode():
            session = GovernedSession(model, budget="1GiB")
            r1 = session.chat(first["input_ids"], max_new_tokens=NEW, **_media(first), **gk)
            r2 = session.chat(second["input_ids"], max_new_tokens=NEW, **_media(second), **gk)
    finally:
        hook.remove()
    assert patches == [first["pixel_values"].shape[0], second["pixel_values"].shape[0]]  # each image once
    with torch.inference_mode():
        history = torch.cat([first["input_ids"], r1, second["input_ids"]], 1)
        types = torch.cat(
            [first["mm_token_type_ids"], torch.zeros_like(r1, dtype=torch.int), second["mm_token_type_ids"]], 1
        )
        out = model.generate(
            input_ids=history,
            attention_mask=torch.ones_like(history),
            mm_token_type_ids=types,
            pixel_values=torch.cat([first["pixel_values"], second["pixel_values"]]),
            image_grid_thw=torch.cat([first["image_grid_thw"], second["image_grid_thw"]]),
            max_new_tokens=NEW,
            **gk,
        )
    assert torch.equal(r2, out[:, history.shape[1] :])
    assert session.records[1].reused_tokens > 0


# -- the positions themselves, against the model's own get_rope_index over the whole sequence ------------

layouts = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.sampled_from(["image", "video", "text"]),
        st.sampled_from([(1, 4, 4), (1, 2, 8), (2, 6, 2), (1, 8, 2)]),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(layouts, st.integers(0, 200), st.sampled_from(FAMILIES))
def test_positions_after_any_boundary_equal_get_rope_index_of_the_whole_sequence(models, layout, cut, name):
    model = models[name]
    cfg = model.config
    ids: list[int] = []
    types: list[int] = []
    grids: dict[str, list[list[int]]] = {"image": [], "video": []}
    seconds: list[float] = []
    for lead, kind, (t, h, w) in layout:
        ids += [5 + lead] * lead
        types += [0] * lead
        if kind != "text":  # <|vision_start|> placeholders <|vision_end|>, as Qwen2VLProcessor writes them
            token = cfg.image_token_id if kind == "image" else cfg.video_token_id
            t = t if kind == "video" else 1
            n = t * h * w // 4
            ids += [cfg.vision_start_token_id] + [token] * n + [cfg.vision_end_token_id]
            types += [0] + [1 if kind == "image" else 2] * n + [0]
            grids[kind].append([t, h, w])
            if kind == "video":
                seconds.append(0.5 * len(seconds) + 0.25)
    ids += [7, 8, 9]
    types += [0, 0, 0]
    input_ids = torch.tensor([ids])
    inputs: dict = {"mm_token_type_ids": torch.tensor([types], dtype=torch.int)}
    for kind, key in (("image", "image_grid_thw"), ("video", "video_grid_thw")):
        if grids[kind]:
            inputs[key] = torch.tensor(grids[kind])
    if seconds:
        inputs["second_per_grid_ts"] = torch.tensor(seconds)
    items = media_mod.media_items(cfg, ids, inputs)
    boundary = cut % len(ids)
    for it in items:  # the session never cuts an item
        if it.start < boundary < it.stop:
            boundary = it.start
    if not (inputs.keys() - {"mm_token_type_ids"}):
        return  # no media: the model's positions are plain 1-D ones (covered by the chat tests)
    want, _ = model.model.get_rope_index(input_ids, **inputs)  # (3, 1, T)
    got = MRopePositions(model).position_ids(input_ids, inputs, items, boundary)  # (4, 1, T)
    assert got is not None
    assert torch.equal(got[0, 0], torch.arange(len(ids)))  # the text row generate builds
    assert torch.equal(got[1:, :, boundary:], want[:, :, boundary:])


# -- where reuse after media is impossible, the session says so -----------------------------------------


def test_a_family_whose_positions_are_not_continued_warns_once_and_stats_say_why(models):
    """A model type whose M-RoPE positions the session cannot continue (here Qwen2-VL's model dressed as
    GLM-4V): reuse stops before the first media item, one warning at construction, and stats() says why."""
    model = models["qwen2-vl"]
    gk = zoo.generate_kwargs("qwen2-vl")
    inputs = zoo.make_inputs(model, prompt_tokens=40, seed=5)
    real = model.config.model_type
    model.config.model_type = "glm4v"
    try:
        with pytest.warns(UserWarning, match="glm4v") as caught:
            session = GovernedSession(model, budget="1GiB")
        reason = session.stats()["prefix_reuse_off_reason"]
        text = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(2))
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # once: serving does not warn again
            ref_text = model.generate(input_ids=text, max_new_tokens=NEW, **gk)
            session.generate(input_ids=text, max_new_tokens=NEW, **gk)
            session.generate(**inputs, max_new_tokens=NEW, **gk)
            session.generate(**inputs, max_new_tokens=NEW, **gk)
            # text reused after an image request: the model's rope_deltas are that request's, not this one's
            text_again = session.generate(input_ids=text, max_new_tokens=NEW, **gk)
        session.close()
    finally:
        model.config.model_type = real
    assert len([w for w in caught if issubclass(w.category, UserWarning)]) == 1
    assert reason is not None and "glm4v" in reason and "before the first" in reason
    image_start = int((inputs["input_ids"][0] == model.config.image_token_id).nonzero()[0])
    assert session.records[2].reused_tokens <= image_start and session.records[2].media_reencoded
    assert session.records[3].reused_tokens > 0 and torch.equal(text_again, ref_text)


def test_prefix_reuse_turned_off_is_the_reason_given(models):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # asked for: no warning
        session = GovernedSession(models["qwen2-vl"], budget="1GiB", config=SessionConfig(prefix_reuse=False))
    assert "prefix_reuse=False" in session.stats()["prefix_reuse_off_reason"]
    session.close()
