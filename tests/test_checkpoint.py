"""Checkpoints: checksums catch corruption and truncation, resume falls back to the newest good
file, averaging is the mean, a full disk leaves the old file, load_model checks the vocabulary."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

import structnmt.io
from structnmt.config import config_from_dict, to_dict
from structnmt.errors import CheckpointError
from structnmt.model.transformer import Transformer
from structnmt.training.checkpoint import (
    average_checkpoints,
    dataset_fingerprint,
    load_checkpoint,
    load_model,
    newest_good_checkpoint,
    save_checkpoint,
    write_averaged_checkpoint,
)


def state(step: int, value: float = 0.0) -> dict:
    return {"model": {"w": torch.full((2, 3), value), "n": torch.tensor(step)}, "progress": {"step": step}}


def test_round_trip_keeps_tensors_and_plain_values(tmp_path):
    s = {**state(7, 1.5), "rng": {"python": (3, tuple(range(5)), None)}, "note": "x"}
    path = save_checkpoint(tmp_path / "a.pt", s)
    back = load_checkpoint(path)
    assert torch.equal(back["model"]["w"], s["model"]["w"])
    assert back["rng"]["python"][1] == tuple(range(5)) and back["note"] == "x"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_flipped_byte_truncation_and_foreign_files_are_refused(tmp_path):
    path = save_checkpoint(tmp_path / "a.pt", state(1, 2.0))
    data = bytearray(path.read_bytes())
    flipped = tmp_path / "flipped.pt"
    data[-10] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(flipped)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(cut)
    plain = tmp_path / "plain.pt"
    torch.save({"model": {}}, plain)
    with pytest.raises(CheckpointError, match="not a structnmt checkpoint"):
        load_checkpoint(plain)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")


def test_newest_good_checkpoint_falls_back_past_a_damaged_last(tmp_path):
    save_checkpoint(tmp_path / "step_2.pt", state(2))
    save_checkpoint(tmp_path / "step_4.pt", state(4))
    save_checkpoint(tmp_path / "best.pt", state(2))
    save_checkpoint(tmp_path / "last.pt", state(4))
    assert newest_good_checkpoint(tmp_path).name == "last.pt"
    last = tmp_path / "last.pt"
    last.write_bytes(last.read_bytes()[:-1])  # truncated
    assert newest_good_checkpoint(tmp_path).name == "step_4.pt"
    step4 = tmp_path / "step_4.pt"
    raw = bytearray(step4.read_bytes())
    raw[len(raw) // 2] ^= 1
    step4.write_bytes(bytes(raw))
    assert newest_good_checkpoint(tmp_path).name == "step_2.pt"
    assert newest_good_checkpoint(tmp_path / "nowhere") is None


def test_average_is_the_parameter_mean(tmp_path):
    paths = [save_checkpoint(tmp_path / f"{i}.pt", state(i, float(v))) for i, v in enumerate([1.0, 2.0, 6.0])]
    averaged = average_checkpoints(paths)
    assert torch.equal(averaged["w"], torch.full((2, 3), 3.0))
    assert averaged["w"].dtype == torch.float32
    assert int(averaged["n"]) == 2  # integer buffers come from the last checkpoint
    other = tmp_path / "other.pt"
    save_checkpoint(other, {"model": {"w": torch.zeros(3, 2), "n": torch.tensor(0)}})
    with pytest.raises(CheckpointError, match="different architecture"):
        average_checkpoints([paths[0], other])
    renamed = tmp_path / "renamed.pt"
    save_checkpoint(renamed, {"model": {"v": torch.zeros(2, 3), "n": torch.tensor(0)}})
    with pytest.raises(CheckpointError, match="different architecture"):
        average_checkpoints([paths[0], renamed])


def test_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.pt", state(1, 1.0))

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(structnmt.io.os, "fsync", no_space)
    with pytest.raises(CheckpointError, match="no space left.*previous checkpoint .* intact"):
        save_checkpoint(path, state(2, 2.0))
    monkeypatch.undo()
    assert load_checkpoint(path)["progress"]["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_non_finite_weights_are_refused(tmp_path):
    bad = state(1)
    bad["model"]["w"][0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="non-finite"):
        save_checkpoint(tmp_path / "x.pt", bad)
    assert not (tmp_path / "x.pt").exists()


def _dataset(root: Path, spm: bytes, labels: list[str]) -> Path:
    root.mkdir()
    (root / "spm.model").write_bytes(spm)
    (root / "meta.json").write_text(json.dumps({"labels": labels, "splits": {"train": 1}}))
    return root


def test_load_model_rebuilds_and_checks_the_vocabulary(tmp_path):
    good = _dataset(tmp_path / "d1", b"sentencepiece-one", ["<none>", "nsubj"])
    same = tmp_path / "d2"
    _dataset(same, b"sentencepiece-one", ["<none>", "nsubj"])
    (same / "meta.json").write_text('{"labels": ["<none>", "nsubj"], "splits": {"test": 9}}')
    other = _dataset(tmp_path / "d3", b"sentencepiece-two", ["<none>", "nsubj"])
    assert dataset_fingerprint(good) == dataset_fingerprint(same) != dataset_fingerprint(other)

    cfg = config_from_dict({"model": {"enc_layers": 1, "dec_layers": 1, "d_model": 16, "n_heads": 2,
                                      "d_ff": 32}})
    model = Transformer(cfg.model, 20, 20)
    raw = to_dict(cfg)
    raw.pop("path")
    vocab = {"src_vocab_size": 20, "tgt_vocab_size": 20, "fingerprint": dataset_fingerprint(good)}
    path = save_checkpoint(tmp_path / "m.pt", {"model": model.state_dict(), "config": raw, "vocab": vocab,
                                               "progress": {"step": 5, "epoch": 2}})
    rebuilt, cfg2, info = load_model(path, "cpu", dataset_dir=same)
    assert cfg2.model.d_model == 16 and info["step"] == 5 and info["epoch"] == 2
    assert not rebuilt.training
    for name, value in model.state_dict().items():
        assert torch.equal(value, rebuilt.state_dict()[name])
    with pytest.raises(CheckpointError) as err:
        load_model(path, "cpu", dataset_dir=other)
    message = str(err.value)
    assert str(other) in message and vocab["fingerprint"][:12] in message
    assert dataset_fingerprint(other)[:12] in message

    averaged = write_averaged_checkpoint([path, path], tmp_path / "avg.pt")
    again, _, info = load_model(averaged)
    assert info["averaged_from"] == [str(path), str(path)]
    assert torch.equal(again.state_dict()["src_embed.weight"], model.state_dict()["src_embed.weight"])


def test_no_temporary_files_survive_a_failed_write(tmp_path, monkeypatch):
    def broken(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(CheckpointError, match="cannot write"):
        save_checkpoint(tmp_path / "a.pt", state(1))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_runs_dataset_is_found_from_the_run_not_from_the_current_directory(tmp_path, monkeypatch):
    """A user's own ``./demo/dataset`` (from ``structnmt demo``) must not stand in for the dataset
    a checkpoint of another project was trained on under the same relative name."""
    from structnmt.decoding.translator import dataset_of_checkpoint

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for root in (project, elsewhere):
        (root / "demo" / "dataset").mkdir(parents=True)
        (root / "demo" / "dataset" / "meta.json").write_text("{}")
    (project / "demo" / "run").mkdir()
    config = {"data": {"dir": "demo/dataset"}, "training": {"out_dir": "demo/run"}}
    monkeypatch.chdir(elsewhere)
    found = dataset_of_checkpoint(project / "demo" / "run" / "best.pt", config)
    assert found.resolve() == (project / "demo" / "dataset").resolve()
    # a checkpoint copied out of its run: the absolute path training recorded, still not the cwd's
    (tmp_path / "copied").mkdir()
    vocab = {"dataset": str(project / "demo" / "dataset")}
    found = dataset_of_checkpoint(tmp_path / "copied" / "best.pt", config, vocab)
    assert found.resolve() == (project / "demo" / "dataset").resolve()
    # nothing recorded and not in its run (an old checkpoint): the current directory, the last resort
    assert dataset_of_checkpoint(tmp_path / "copied" / "best.pt", config) == Path("demo/dataset")
