"""Weight streaming's files in a folder other processes can write: planted symlinks and files are
never written through nor deleted, a file changed after it was written is refused (an error, never
other weights in the model), and without a folder the streamer uses a private one. Real files and
a real model, no mocks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from memwarden.runtime.offload import stream_weights
from memwarden.runtime.offload_files import OffloadFileChanged

GROUPS = 6


def mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(GROUPS)]).eval()
    x = torch.randn(3, 64)
    with torch.no_grad():
        want = model(x)
    return model, x, want, sum(p.nbytes for p in model.parameters())


def run(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def test_planted_symlinks_and_files_are_never_written_through_nor_deleted(tmp_path: Path) -> None:
    model, x, want, total = mlp()
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the victim's data")
    folder = tmp_path / "offload"
    folder.mkdir()
    for i in range(GROUPS):  # every name a group could take
        os.symlink(victim, folder / f"{i}.safetensors")
    (folder / "model.safetensors").write_bytes(b"someone's file")
    planted = {p.name for p in folder.iterdir()}
    with stream_weights(model, total // 2, folder) as streamer:
        assert len(streamer.placement.streamed_names()) >= 2
        assert torch.equal(run(model, x), want)
        ours = {p.name for p in folder.iterdir()} - planted
        assert len(ours) == len(streamer.placement.streamed_names())
        assert all(stat.S_IMODE(os.lstat(folder / name).st_mode) == 0o600 for name in ours)
    assert victim.read_bytes() == b"the victim's data"
    assert (folder / "model.safetensors").read_bytes() == b"someone's file"
    assert {p.name for p in folder.iterdir()} == planted  # detach removed its own files only
    assert all(os.path.islink(folder / f"{i}.safetensors") for i in range(GROUPS))


def _flip(path: Path) -> None:
    with path.open("r+b") as f:  # same inode, same size: only the bytes differ
        f.seek(-4, os.SEEK_END)
        last = f.read(4)
        f.seek(-4, os.SEEK_END)
        f.write(bytes(b ^ 0xFF for b in last))


def test_a_file_modified_after_it_was_written_is_refused_not_used(tmp_path: Path) -> None:
    model, x, want, total = mlp()
    streamer = stream_weights(model, total // 2, tmp_path, prefetch=False)
    try:
        assert torch.equal(run(model, x), want)
        path = tmp_path / f"{streamer.placement.streamed_names()[-1]}.safetensors"
        _flip(path)
        with pytest.raises(OffloadFileChanged, match="modified after it was written"):
            run(model, x)  # before: the flipped bytes reached the model (NaN / wrong outputs)
        with pytest.raises(OffloadFileChanged):
            run(model, x)  # again: the slot the refused copy went to holds nothing usable
        with pytest.raises(OffloadFileChanged):
            streamer.detach()  # nothing is read back from a changed file; the model keeps streaming
        _flip(path)  # the original bytes again: checked on every read, not once
        assert torch.equal(run(model, x), want)
    finally:
        streamer.detach()
    assert not list(tmp_path.iterdir())
    assert torch.equal(run(model, x), want)


@pytest.mark.parametrize("how", ["truncate", "replace", "symlink"])
def test_a_file_truncated_or_swapped_is_refused(tmp_path: Path, how: str) -> None:
    model, x, want, total = mlp()
    streamer = stream_weights(model, total // 2, tmp_path, prefetch=False)
    path = tmp_path / f"{streamer.placement.streamed_names()[-1]}.safetensors"
    good = path.read_bytes()
    other = tmp_path / "other.bin"
    other.write_bytes(good)  # the very same bytes, another file
    if how == "truncate":
        os.truncate(path, len(good) - 8)
    elif how == "replace":
        os.replace(other, path)
    else:
        path.unlink()
        os.symlink(other, path)
    with pytest.raises(OffloadFileChanged):
        run(model, x)
    if how == "truncate":
        with path.open("r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(good[-8:])
        streamer.detach()
        assert torch.equal(run(model, x), want)
    else:  # another inode at the name, even with the same bytes: that group's weights are gone
        with pytest.raises(OffloadFileChanged):
            streamer.detach()
        assert os.path.lexists(path) and other.exists() is (how == "symlink")  # nothing of theirs deleted


def test_without_a_folder_the_files_go_to_a_private_one_removed_on_detach() -> None:
    model, x, want, total = mlp()
    with stream_weights(model, total // 2) as streamer:
        folder = streamer.offload_dir
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.geteuid()
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
        assert torch.equal(run(model, x), want)
    assert not folder.exists()
