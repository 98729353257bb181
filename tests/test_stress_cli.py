"""`memwarden stress` and `memwarden sweep`: bad input is one clear error and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from memwarden.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PLAIN = str(EXAMPLES / "stress" / "plain.toml")


def _run(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["stress", "--a", "missing.toml", "--b", PLAIN, "--runs", "2"], "missing.toml: no such config file"),
        (["stress", "--a", PLAIN, "--b", PLAIN, "--runs", "zero"], "--runs takes an integer"),
        (["stress", "--a", PLAIN, "--b", PLAIN, "--runs", "0"], "--runs must be in"),
        (["stress", "--a", PLAIN, "--b", PLAIN, "--runs", "2", "--inject", "jitter:size=lots"], "bad --inject spec"),
        (["stress", "--a", PLAIN, "--b", PLAIN, "--runs", "2", "--seed", "-1"], "--seed must be in"),
        (["stress", "--a", PLAIN, "--b", PLAIN, "--runs", "2", "--ray-address", "x:1"], "--ray-address needs"),
        (["stress", "--a", PLAIN, "--b", PLAIN, "--runs", "2", "--executor", "spark"], "invalid choice"),
        (["stress", "--a", PLAIN], "required"),
        (["sweep", "missing-grid.toml"], "no such grid file"),
        (["sweep", str(EXAMPLES / "sweep" / "grid.toml"), "--jobs", "many"], "--jobs takes an integer"),
    ],
)
def test_bad_arguments(capsys, argv: list[str], match: str) -> None:
    code, err = _run(capsys, *argv)
    assert code != 0
    assert match in err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("models = 3\n", "models: must be a non-empty list"),
        ('models = ["llava"]\ndevices = ["no-such-device"]\n', "no-such-device"),
        ('models = ["llava"]\n[[requests]]\nimage = "big"\n', "WIDTHxHEIGHT"),
        ('models = ["llava"]\n[[requests]]\ncolour = 1\n', "unknown key"),
        ('models = ["llava"]\nextra = 1\n', "unknown key"),
        ("models = [", "not valid TOML"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_grids(capsys, tmp_path, text, match: str) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, err = _run(capsys, "sweep", str(grid))
    assert code == 2 and match in err and "Traceback" not in err


def test_stress_config_errors_name_the_file(capsys, tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nscenario = "demo-chat"\n[serving]\nbudget = -5\n')
    code, err = _run(capsys, "stress", "--a", str(bad), "--b", PLAIN, "--runs", "1")
    assert code == 2 and "bad.toml: serving.budget" in err


def test_sweep_unknown_model_is_one_error(capsys, tmp_path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text('models = ["no-such-model"]\n[[requests]]\nprompt_tokens = 8\nnew_tokens = 2\n')
    code, err = _run(capsys, "sweep", str(grid), "--jobs", "1")
    assert code == 2 and "unknown model 'no-such-model'" in err and "Traceback" not in err


def test_sweep_runs_a_small_grid(capsys, tmp_path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'models = ["llava"]\ndevices = ["raspberry-pi-5-8gb", "iphone-15-pro"]\n'
        "[[requests]]\nprompt_tokens = 16\nnew_tokens = 2\n[[requests]]\nprompt_tokens = 64\nnew_tokens = 2\n"
    )
    code = main(["sweep", str(grid), "--jobs", "1", "--json"])
    assert code == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert len(data["rows"]) == 2 and data["devices"] == ["raspberry-pi-5-8gb", "iphone-15-pro"]
    assert data["rows"][0]["peak_bytes"] < data["rows"][1]["peak_bytes"]
    assert all(row["peak_bytes"] > 0 and set(row["devices"]) == set(data["devices"]) for row in data["rows"])
