"""The line to change, read from the script's source: the keeper of a value, where a passed value
was chosen, the handler that forgot no_grad, and the entry script's statement above a helper."""

from __future__ import annotations

import textwrap
from pathlib import Path

from memwarden.analyze.source_lines import entry_files, handler_line, holding_line, keeper_line, script_line
from memwarden.analyze.value_flow import passed_keeper
from memwarden.analyze.value_origin import argument_line, origin_line, tiling_knob
from memwarden.analyze.window_read import window_read


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def _line(path: str, marker: str) -> int:
    return next(i for i, t in enumerate(Path(path).read_text().splitlines(), 1) if marker in t)


def test_the_keeper_is_the_statement_that_keeps_the_value_not_one_computed_from_it(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "loop.py",
        """
        def main(model, batches):
            segments, words, losses = [], [], []
            for b in batches:
                out = model.generate(b)  # CALL
                words.append(align(out))
                losses.append(out.loss.item())
                segments.append(out.sequences.detach().cpu())  # KEEP
            return segments
        """,
    )
    kept = keeper_line(f, _line(f, "# CALL"))
    assert kept is not None and kept.line == _line(f, "# KEEP") and kept.what == "segments.append"


def test_only_a_derived_store_is_named_when_nothing_keeps_the_value_itself(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "derived.py",
        """
        for b in batches:
            out = model(b)  # CALL
            feats.append(pool(out))  # KEEP
        """,
    )
    kept = keeper_line(f, _line(f, "# CALL"))
    assert kept is not None and kept.line == _line(f, "# KEEP")


def test_joining_a_list_once_is_not_an_accumulator(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "join.py",
        """
        def main(paths):
            decoded = [load(p) for p in paths]  # CALL
            index = []
            for chunk in decoded:
                index.append(embed(chunk))
            index = torch.cat(index)
        """,
    )
    assert keeper_line(f, _line(f, "# CALL")) is None


def test_a_helper_that_returns_what_it_built_hands_the_line_to_its_caller(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "video.py",
        """
        def read_video(path):
            frames = [decode(i) for i in range(720)]  # MADE
            return np.stack(frames)

        def fetch(path):
            video = read_video(path)[::45]  # ASKED
            return resize(normalize(video))

        clip = fetch("a.mp4")
        """,
    )
    held = holding_line(f, _line(f, "# MADE"), "read_video", [f])
    assert held is not None and held.line == _line(f, "# ASKED")  # not further: fetch returns a new array


def test_a_keyword_is_followed_through_a_parameter_to_the_assignment_that_chose_it(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "sample.py",
        """
        N = 10

        def sample(model, inputs, n, per_call):
            return model.generate(**inputs, num_return_sequences=per_call)  # CALL

        def main(model, inputs):
            per_call = N  # CHOSEN
            return sample(model, inputs, N, per_call)
        """,
    )
    chosen = origin_line(f, _line(f, "# CALL"), ("num_return_sequences",))
    assert chosen is not None and chosen.line == _line(f, "# CHOSEN")


def test_a_self_attribute_is_followed_to_the_constructor_call_that_set_it(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "reader.py",
        """
        class PageReader:
            def __init__(self, model, max_pixels=1003520):
                self.model = model
                self.max_pixels = max_pixels

            def pixels(self, page):
                return resize(page, max_pixels=self.max_pixels)  # KNOB

        reader = PageReader(model, max_pixels=None)  # CHOSEN
        """,
    )
    knob = argument_line(f, _line(f, "# KNOB"), ("max_pixels",))
    assert knob is not None and knob.line == _line(f, "# KNOB")
    chosen = origin_line(f, knob.line, ("max_pixels",))
    assert chosen is not None and chosen.line == _line(f, "# CHOSEN")
    # a call passing two knobs, one left at its default by the caller: the one the user chose is named
    g = _write(
        tmp_path,
        "reader2.py",
        """
        class PageReader:
            def __init__(self, model, min_pixels=3136, max_pixels=1003520):
                self.min_pixels = min_pixels
                self.max_pixels = max_pixels

            def pixels(self, page):
                return resize(page, min_pixels=self.min_pixels, max_pixels=self.max_pixels)  # KNOB

        reader = PageReader(model, max_pixels=None)  # CHOSEN
        """,
    )
    chosen = origin_line(g, _line(g, "# KNOB"), ("min_pixels", "max_pixels"))
    assert chosen is not None and chosen.line == _line(g, "# CHOSEN")


def test_a_cache_made_anew_each_turn_is_where_the_cache_argument_was_chosen(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "chat.py",
        """
        def turn(model, ids):
            cache = DynamicCache(config=model.config)  # CHOSEN
            return model.generate(ids, past_key_values=cache)  # CALL
        """,
    )
    chosen = origin_line(f, _line(f, "# CALL"), ("past_key_values", "cache"))
    assert chosen is not None and chosen.line == _line(f, "# CHOSEN")
    assert origin_line(f, _line(f, "# CALL"), ("num_beams",)) is None  # no such keyword at the call


def test_no_grad_goes_on_a_handler_without_a_loop_and_around_a_call_in_a_loop(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "embed.py",
        """
        class Embedder:
            def embed_batch(self, pixels):  # DEF
                return self.model.get_image_features(pixel_values=pixels)  # HANDLER_CALL

        def index_all(model, batches):
            for b in batches:
                feats.append(model(b))  # LOOP_CALL
        """,
    )
    handler = handler_line(f, _line(f, "# HANDLER_CALL"))
    assert handler is not None and handler.line == _line(f, "# DEF")
    assert handler_line(f, _line(f, "# LOOP_CALL")) is None


def test_a_helper_modules_line_leads_to_the_entry_scripts_statement(tmp_path: Path) -> None:
    helper = _write(
        tmp_path,
        "_common.py",
        """
        def fake_rgb(h, w):
            return np.zeros((h, w, 3), np.uint8)  # MADE
        """,
    )
    script = _write(
        tmp_path,
        "gallery.py",
        """
        import _common as c

        def load_image(path):
            return c.fake_rgb(384, 384)

        def main(paths):
            decoded = [load_image(p) for p in paths]  # ASKED
            return decoded[0]
        """,
    )
    entries = entry_files([helper, script])
    assert entries == [script]
    assert entry_files([helper, script], script="/elsewhere/_common.py") == [helper]  # the trace's own word
    up = script_line(helper, _line(helper, "# MADE"), entries)
    assert up is not None and up.file == script and up.line == _line(script, "# ASKED")
    assert script_line(script, _line(script, "# ASKED"), entries) is None  # already in the script


def test_a_loss_summed_by_hand_is_kept_by_the_sum(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "accum.py",
        """
        def train(model, batches, opt):
            for step in range(2):
                step_loss = 0.0
                for b in batches:
                    loss = model(**b).loss / 4  # CALL
                    print(float(loss))
                    step_loss = step_loss + loss  # KEEP
                step_loss.backward()
        """,
    )
    kept = keeper_line(f, _line(f, "# CALL"))
    assert kept is not None and kept.line == _line(f, "# KEEP")
    # a sum of something else does not keep it
    g = _write(tmp_path, "other.py", "for b in bs:\n    loss = m(b)\n    total = total + 1\n")
    assert keeper_line(g, 2) is None


def test_a_container_read_through_its_last_items_is_a_window(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "camera.py",
        """
        WINDOW = 3

        def main(model, frames):
            context = []  # BIND
            for frame in frames:
                context.append(model(frame))  # APPEND
                window = list(context)[-WINDOW:]  # READ
                caption(window)
            history = []
            for frame in frames:
                history.append(model(frame))  # WHOLE
            summarize(history)
        """,
    )
    w = window_read(f, _line(f, "# APPEND"))
    assert w is not None and (w.container, w.size, w.items) == ("context", "WINDOW", 3)
    assert (w.binding_line, w.read_line) == (_line(f, "# BIND"), _line(f, "# READ"))
    assert window_read(f, _line(f, "# WHOLE")) is None  # read whole: every item is needed


def test_a_tiling_setting_applied_to_each_frame_is_found_and_one_image_is_not(tmp_path: Path) -> None:
    f = _write(
        tmp_path,
        "tiles.py",
        """
        MAX_NUM = 12

        def main(frames, page):
            video = torch.cat([load_image(f, max_num=MAX_NUM) for f in frames])  # VIDEO
            single = load_image(page, max_num=12)  # PAGE
            once = torch.cat([load_image(f, max_num=1) for f in frames])  # ONE
        """,
    )
    knob = tiling_knob(f, _line(f, "# VIDEO"), ("max_num",))
    assert knob is not None and (knob.name, knob.value) == ("max_num", 12)
    assert tiling_knob(f, _line(f, "# PAGE"), ("max_num",)) is None  # one image, tiled as its card says
    assert tiling_knob(f, _line(f, "# ONE"), ("max_num",)) is None  # one tile per frame


def test_a_tiling_setting_in_the_loop_that_fed_the_joined_pixels(tmp_path: Path) -> None:
    """``torch.cat(pix)`` in the generate call, the tiles appended to ``pix`` in the loop above it:
    the setting is the one the loop passed (two names back), not one of the call's own."""
    f = _write(
        tmp_path,
        "dashcam.py",
        """
        MAX_NUM = 12

        def ask(model, frames):
            pix, ids = [], []
            for k, rgb in enumerate(frames):
                tiles = load_tiles(rgb, 448, max_num=MAX_NUM)  # TILES
                pix.append(tiles)
                ids += [k] * tiles.shape[0]
            return model.generate(input_ids=ids, pixel_values=torch.cat(pix))  # CALL

        def one(model, frames):
            pix = []
            for rgb in frames:
                pix.append(load_tiles(rgb, 448, max_num=1))
            return model.generate(pixel_values=torch.cat(pix))  # SINGLE
        """,
    )
    knob = tiling_knob(f, _line(f, "# CALL"), ("max_num",))
    assert knob is not None and (knob.name, knob.value, knob.line) == ("max_num", 12, _line(f, "# TILES"))
    assert tiling_knob(f, _line(f, "# SINGLE"), ("max_num",)) is None  # one tile per frame


def test_a_value_handed_to_a_method_that_stores_it_is_kept_there(tmp_path: Path) -> None:
    """``stream.on_frame(i, frame)`` whose method appends its parameter to ``self.history``: the
    line that keeps the frame is that append, one call down; a comparison added to a counter
    (``alerts += label != "none"``) keeps nothing of the frame."""
    script = tmp_path / "doorbell.py"
    script.write_text(
        "class Stream:\n"
        "    def __init__(self):\n"
        "        self.history = []\n"
        "\n"
        "    def on_frame(self, frame_id, pixels):\n"
        "        score = float(pixels.mean())\n"
        "        self.history.append({'id': frame_id, 'pixels': pixels})\n"
        "        return 'alert' if score > 0.5 else 'none'\n"
        "\n"
        "\n"
        "def main(make):\n"
        "    stream, alerts = Stream(), 0\n"
        "    for i in range(10):\n"
        "        frame = make(i)\n"
        "        label = stream.on_frame(i, frame)\n"
        "        alerts += label != 'none'\n"
    )
    assert keeper_line(str(script), 14) is None
    kept = passed_keeper(str(script), 14)
    assert kept is not None and kept.line == 7
    assert passed_keeper(str(script), 15) is None  # the label is no value handed on
