"""User-facing commands: `plot` writes the format its --out names, `methods` describes every
method, `prepare multi30k --from` and `download --from` say what is missing (one line each)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from structnmt.cli.main import main

MAGIC = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error(code: int, err: str) -> str:
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def a_run(tmp_path: Path, loss: object = 4.0) -> Path:
    run_dir = tmp_path / "base"
    run_dir.mkdir()
    records = [{"kind": "train", "step": 10, "loss": 5.0}, {"kind": "train", "step": 20, "loss": loss},
               {"kind": "valid", "step": 20, "loss": 4.5, "bleu": 3.0}]
    # a blank line first: the line named is the file's, not the record's index
    (run_dir / "log.jsonl").write_text("\n" + "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return run_dir


# ---------------------------------------------------------------------------
# plot: the format follows the name


@pytest.mark.parametrize("suffix", ["pdf", "svg", "png", "PDF"])
def test_plot_curves_writes_the_format_its_name_asks_for(tmp_path, capsys, suffix):
    out = tmp_path / f"curves.{suffix}"
    code, _, err = run(capsys, "plot", "curves", str(a_run(tmp_path)), "--out", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(MAGIC[suffix.lower()])  # it was PNG data whatever the name


def test_a_heat_map_is_written_as_its_name_says(tmp_path):
    from structnmt.visualisation.attention import plot_attention

    out = plot_attention([[0.5, 0.5], [0.2, 0.8]], ["a", "b"], ["c", "d"], tmp_path / "map.svg", arcs=[(0, 1), (1, 1)])
    assert out.read_bytes().startswith(MAGIC["svg"])


@pytest.mark.parametrize("name", ["map.txt", "map"])
@pytest.mark.parametrize("what", ["attention", "curves"])
def test_plot_refuses_a_name_that_says_no_picture_format(tmp_path, capsys, name, what):
    out = tmp_path / name
    args = (["--checkpoint", str(tmp_path / "none.pt"), "--line", "1"] if what == "attention"
            else [str(a_run(tmp_path))])
    err = one_error(*run(capsys, "plot", what, *args, "--out", str(out))[::2])
    # named before the checkpoint is looked at: --out, what is wrong and the formats there are
    assert err.startswith(f"error: --out: {out}")
    assert ".pdf" in err and ".svg" in err and ".png" in err
    assert ("no extension" in err) if name == "map" else ("cannot write a .txt picture" in err)
    assert not out.exists()


def test_plot_curves_names_the_line_of_a_value_that_is_not_a_number(tmp_path, capsys):
    log = a_run(tmp_path, loss="high") / "log.jsonl"
    err = one_error(*run(capsys, "plot", "curves", str(log.parent), "--out", str(tmp_path / "c.png"))[::2])
    assert err == f"error: {log}:3: 'loss' of this train record is 'high', not a number\n"
    assert not (tmp_path / "c.png").exists()


def test_plot_curves_takes_the_loggers_spelling_of_a_diverged_loss(tmp_path, capsys):
    code, _, err = run(capsys, "plot", "curves", str(a_run(tmp_path, loss="nan")), "--out", str(tmp_path / "c.png"))
    assert code == 0, err  # RunLogger writes NaN as "nan": a number, not a damaged log


# ---------------------------------------------------------------------------
# methods: a description and the real needs of every method


def test_every_method_has_a_description_and_its_real_needs(capsys):
    from structnmt import api
    from structnmt.config import ModelConfig
    from structnmt.model.methods import METHODS

    model = ModelConfig(enc_layers=6, dec_layers=6, d_model=64, n_heads=8)  # room for every method's defaults
    listed = api.methods()
    for name, cls in METHODS.items():
        assert listed[name]["doc"], f"{name} has no description"
        built = cls(cls.Params(name=name), model)  # what training reads, with the default parameters
        assert listed[name]["needs"] == built.needs, name
        assert listed[name]["needs_at_inference"] == built.needs_at_inference, name
    code, out, _ = run(capsys, "methods", "-v")
    assert code == 0
    for name in ("dbsa", "sisa", "syncattn"):  # they read parent trees: "needs -" was wrong
        block = out.split(f"\n{name}: ", 1)[1]
        assert block.split("\n")[1].strip().startswith("needs {'src': ('valid', 'parent_first')")


# ---------------------------------------------------------------------------
# prepare multi30k --from: the splits it needs, the data config it writes


def multi30k_copy(folder: Path, leave_out: tuple[str, ...] = ()) -> Path:
    words = ["a", "dog", "man", "woman", "runs", "sits", "on", "the", "grass", "in", "red", "shirt", "street"]
    folder.mkdir()
    for split, n in (("train", 60), ("val", 8), ("test_2016_flickr", 8), ("test_2017_flickr", 6),
                     ("test_2017_mscoco", 6)):
        for lang, end in (("en", "."), ("de", "!")):
            if f"{split}.{lang}.gz" in leave_out:
                continue
            lines = [" ".join(words[(k + i) % len(words)] for i in range(3 + k % 5)) + f" {end}" for k in range(n)]
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    return folder


def test_prepare_multi30k_refuses_a_copy_without_val(tmp_path, capsys):
    source = multi30k_copy(tmp_path / "m30k", ("val.en.gz", "val.de.gz"))
    out = tmp_path / "data" / "m30"
    err = one_error(*run(capsys, "prepare", "multi30k", "--from", str(source), "--out", str(out))[::2])
    assert err.startswith(f"error: {source}: val.en.gz and val.de.gz not found: val is the split train validates on")
    assert not (tmp_path / "data").exists()  # refused before anything was written


def test_prepare_multi30k_from_a_folder_that_is_not_there(tmp_path, capsys):
    err = one_error(*run(capsys, "prepare", "multi30k", "--from", str(tmp_path / "nope"),
                         "--out", str(tmp_path / "m30"))[::2])
    assert err.startswith(f"error: {tmp_path / 'nope'}: no such folder")


def test_prepare_multi30k_says_what_it_left_out_and_where_its_config_is(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = multi30k_copy(tmp_path / "m30k", ("test_2017_mscoco.de.gz",))
    code, out, err = run(capsys, "prepare", "multi30k", "--from", str(source), "--out", "data/m30")
    assert code == 0, err
    assert f"warning: {source}: test_2017_mscoco.de.gz not found: split test_2017_mscoco left out" in err
    config = tmp_path / "data" / "m30_raw" / "multi30k.en-de.yaml"
    assert f"data config written to {Path('data/m30_raw/multi30k.en-de.yaml')}" in out
    data = yaml.safe_load(config.read_text())["data"]
    assert data["dir"] == str(tmp_path / "data" / "m30")  # the dataset --out names, not a folder in the raw one
    assert "test_2017_mscoco" not in data["splits"] and "val" in data["splits"]


# ---------------------------------------------------------------------------
# download --from


def test_download_from_a_folder_that_is_not_there_leaves_no_out(tmp_path, capsys):
    err = one_error(*run(capsys, "download", "iwslt14-de-en", "--out", str(tmp_path / "out"),
                         "--from", str(tmp_path / "nope"))[::2])
    assert err.startswith(f"error: {tmp_path / 'nope'}: no such folder")
    assert not (tmp_path / "out").exists()


def test_a_damaged_archive_given_with_from_is_to_be_replaced_not_fetched(tmp_path, capsys):
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w:gz") as tar:
        data = b"x" * 200_000
        info = tarfile.TarInfo("de-en/train.tags.de-en.de")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    local = tmp_path / "local"
    local.mkdir()
    (local / "de-en.tgz").write_bytes(body.getvalue()[: len(body.getvalue()) // 2])  # cut in half
    err = one_error(*run(capsys, "download", "iwslt14-de-en", "--out", str(tmp_path / "out"),
                         "--from", str(local))[::2])
    assert err.startswith(f"error: {local / 'de-en.tgz'}: cannot read the archive: ")
    assert "replace it with a whole copy of the file from http" in err and "fetch it again" not in err
    assert not (tmp_path / "out").exists()
