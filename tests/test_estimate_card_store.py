"""Estimates kept on disk (estimation/card_store.py): a repeated estimate answers with the same card
(every rendering equal) without running again; anything that changes the answer is a new key; only
shipped configs are kept; a damaged store is a miss, never an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memwarden.estimation import card_store
from memwarden.estimation import run as est
from memwarden.report.estimate import card_text


def _cache_root(tmp_path: Path) -> Path:
    """A cache folder of its own for the store, sharing this machine's build of the native hook (the
    conv probes load it; building it again would take a minute)."""
    native = Path(os.environ.get("MEMWARDEN_CACHE", Path.home() / ".cache" / "memwarden")) / "native"
    root = tmp_path / "cache"
    root.mkdir()
    if native.is_dir():
        (root / "native").symlink_to(native, target_is_directory=True)
    return root


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    root = _cache_root(tmp_path)
    monkeypatch.setenv("MEMWARDEN_CACHE", str(root))
    monkeypatch.delenv("MEMWARDEN_ESTIMATE_CACHE", raising=False)
    return root / "estimates"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models each estimate really ran (not answered from the store)."""
    seen: list[str] = []
    real = est._estimate

    def counting(model: str, *args: Any) -> Any:
        seen.append(model)
        return real(model, *args)

    monkeypatch.setattr(est, "_estimate", counting)
    return seen


# a card with suggestions (re-run and arithmetic), a processor source and a CUDA runtime block
CASES = [
    ("qwen2-vl-2b-instruct", dict(images=[(448, 448)], new_tokens=4, device="iphone-13")),
    ("smolvlm-256m-instruct", dict(images=[(512, 512)], new_tokens=4, device="t4-16gb")),
]


@pytest.mark.parametrize(("model", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_a_kept_card_renders_exactly_as_the_measured_one(
    store: Path, runs: list[str], model: str, kwargs: dict[str, Any]
) -> None:
    measured = est.estimate(model, cache=True, **kwargs)
    kept = est.estimate(model, cache=True, **kwargs)
    assert runs == [model]  # the second answer came from the store
    assert kept is not measured and kept == measured
    assert json.dumps(kept.to_json(), sort_keys=True) == json.dumps(measured.to_json(), sort_keys=True)
    assert card_text(kept, []) == card_text(measured, [])
    assert kept.to_markdown() == measured.to_markdown()
    if model == "qwen2-vl-2b-instruct":
        assert kept.fits is False and kept.suggestions
    else:
        assert kept.runtime is not None and kept.processor is not None


def test_what_changes_the_answer_changes_the_key(store: Path, runs: list[str]) -> None:
    base = dict(images=[(224, 224)], new_tokens=2, prompt_tokens=8)
    est.estimate("smolvlm-256m-instruct", cache=True, **base)
    est.estimate("smolvlm-256m-instruct", cache=True, **{**base, "new_tokens": 3})
    est.estimate("smolvlm-256m-instruct", cache=True, **base, device="pixel-8")
    est.estimate("smolvlm-256m-instruct", cache=True, **base, device="pixel-8")
    est.estimate("smolvlm-256m-instruct", **base)  # not asked to use the store
    assert len(runs) == 4
    assert len(list(store.glob("*.json"))) == 3


def test_only_shipped_configs_are_kept(store: Path, runs: list[str], tmp_path: Path) -> None:
    from memwarden.estimation.resolve import CONFIG_DIR

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIG_DIR / "smolvlm-256m-instruct.json").read_text())
    for _ in range(2):
        est.estimate(str(folder), cache=True, new_tokens=2, prompt_tokens=8)
    assert len(runs) == 2 and not store.exists()


def test_the_store_can_be_turned_off_and_survives_damage(
    store: Path, runs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs: dict[str, Any] = dict(new_tokens=2, prompt_tokens=8, cache=True)
    monkeypatch.setenv("MEMWARDEN_ESTIMATE_CACHE", "off")
    est.estimate("smolvlm-256m-instruct", **kwargs)
    assert not store.exists()
    monkeypatch.delenv("MEMWARDEN_ESTIMATE_CACHE")
    first = est.estimate("smolvlm-256m-instruct", **kwargs)
    (kept,) = store.glob("*.json")
    for damage in ("", "{not json", json.dumps({"format": card_store.FORMAT, "key": kept.stem, "card": {"x": 1}})):
        kept.write_text(damage)
        again = est.estimate("smolvlm-256m-instruct", **kwargs)  # a miss: measured again, and kept again
        assert again == first
    assert len(runs) == 5


def test_the_command_line_answers_a_repeated_estimate_without_torch(tmp_path: Path) -> None:
    env = {**os.environ, "MEMWARDEN_CACHE": str(_cache_root(tmp_path))}
    env.pop("MEMWARDEN_ESTIMATE_CACHE", None)
    probe = (
        "import runpy, sys; sys.argv = ['memwarden', 'estimate', 'smolvlm-256m-instruct', '--image', "
        "'256x256', '--new-tokens', '2', '--json']\n"
        "try:\n    runpy.run_module('memwarden', run_name='__main__')\n"
        "finally:\n    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)"
    )
    outs = [
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
        for _ in range(2)
    ]
    assert [o.returncode for o in outs] == [0, 0], outs[0].stderr
    assert outs[0].stdout == outs[1].stdout and json.loads(outs[1].stdout)["peak_bytes"] > 0
    assert "torch imported: True" in outs[0].stderr
    assert "torch imported: False" in outs[1].stderr
