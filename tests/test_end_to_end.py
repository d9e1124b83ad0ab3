"""The whole path on the synthetic task: raw text -> prepare -> train -> save -> load -> translate.

Checks what only the assembled toolkit can show: training learns (the validation loss falls
far below its start), a model written to disk and read back translates exactly as before,
and raw text run through the translate pipeline gives the same output as the stored split.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from structnmt.config import config_from_dict, to_dict
from structnmt.data.dataset import ParallelDataset
from structnmt.data.pipeline import Preprocessor
from structnmt.data.prepare import prepare
from structnmt.data.synthetic import demo_config, write_task
from structnmt.decoding.translate import translate_lines, translate_split
from structnmt.training.checkpoint import load_checkpoint, load_model, save_checkpoint
from structnmt.training.logger import read_log
from structnmt.training.trainer import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("e2e")
    write_task(work / "data", sizes={"train": 1500, "val": 60, "test": 40}, seed=7)
    raw = demo_config(work, 0)
    raw["data"]["subwords"]["vocab_size"] = 400
    raw["model"].update({"d_model": 64, "d_ff": 128, "enc_layers": 2, "dec_layers": 2})
    raw["training"].update({"max_steps": 120, "max_tokens": 1024, "warmup": 40, "lr": 3e-3, "valid_every": 60,
                            "progress": False, "tensorboard": False, "threads": 2, "max_minutes": 0})
    raw["decoding"]["beam"] = 3
    cfg = config_from_dict(raw)
    prepare(cfg, force=True, verbose=False)
    assert train(cfg)["status"] == "max_steps"
    return work


@pytest.mark.slow
def test_training_learns_the_task(trained):
    valid = [r for r in read_log(trained / "run" / "log.jsonl") if r["kind"] == "valid"]
    assert len(valid) == 2
    # the synthetic vocabulary has ~400 pieces: an untrained model is near ln(400) = 6
    assert valid[-1]["nll"] < 3.0 and valid[-1]["nll"] < valid[0]["nll"]


@pytest.mark.slow
def test_a_saved_and_loaded_model_translates_identically(trained, tmp_path):
    dataset = trained / "dataset"
    model, cfg, _ = load_model(trained / "run" / "last.pt", "cpu", dataset_dir=dataset)
    pre = Preprocessor.from_dataset(dataset)
    test = ParallelDataset(dataset, "test")
    before = translate_split(model, test, pre, cfg.decoding)
    state = load_checkpoint(trained / "run" / "last.pt")
    raw = to_dict(cfg)
    raw.pop("path")
    copy = save_checkpoint(tmp_path / "copy.pt", {"model": model.state_dict(), "config": raw,
                                                   "vocab": state["vocab"]})
    again, _, _ = load_model(copy, "cpu", dataset_dir=dataset)
    assert translate_split(again, test, pre, cfg.decoding) == before
    assert sum(bool(h.strip()) for h in before) == len(before)  # a trained model says something


@pytest.mark.slow
def test_raw_text_and_the_stored_split_translate_the_same(trained):
    dataset = trained / "dataset"
    model, cfg, _ = load_model(trained / "run" / "last.pt", "cpu", dataset_dir=dataset)
    pre = Preprocessor.from_dataset(dataset)
    test = ParallelDataset(dataset, "test")
    stored = translate_split(model, test, pre, cfg.decoding)
    torch.manual_seed(0)
    raw = translate_lines(model, pre, test.raw("src"), cfg.decoding)
    assert [n[0] for n in raw] == stored


@pytest.mark.slow
def test_report_and_pictures_from_a_trained_model(trained, tmp_path, capsys):
    import shutil

    import matplotlib.image as mpimg

    from structnmt.cli.main import main

    run = trained / "run"
    assert main(["test", str(run), "--splits", "test", "--device", "cpu"]) == 0
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    out = tmp_path / "report.md"
    assert main(["report", str(run), str(twin), "--baseline", "run", "--out", str(out), "--samples", "200",
                 "--plots", str(tmp_path / "pictures")]) == 0
    text = out.read_text()
    assert "| run |" in text and "| twin |" in text and "test" in text
    assert "structnmt" in text and "torch" in text  # commands and versions are stated
    assert main(["plot", "attention", "--checkpoint", str(run / "last.pt"), "--split", "test", "--line", "3",
                 "--out", str(tmp_path / "pictures" / "attention.png")]) == 0
    for name in ("curves.png", "bleu_by_length_test.png", "attention.png"):
        image = mpimg.imread(tmp_path / "pictures" / name)
        assert image.shape[0] > 100 and image.shape[1] > 100 and float(image.std()) > 0.01, name


@pytest.mark.slow
def test_inspect_align_writes_links_that_score_as_reported(trained, tmp_path, capsys):
    import json

    from structnmt.cli.main import main
    from structnmt.evaluation.alignment import corpus_aer, read_pharaoh

    run, gold = trained / "run", trained / "data" / "test.align"
    out = tmp_path / "inspect"
    assert main(["inspect", "align", str(run), "--gold", str(gold), "--out", str(out)]) == 0
    scores = json.loads(capsys.readouterr().out)
    written = read_pharaoh(out / "test.align")
    assert len(written) == 40 and any(sure for sure, _ in written)
    links = [sure for sure, _ in written]
    golds = read_pharaoh(gold)
    again = corpus_aer([s for s, _ in golds], [p for _, p in golds], links)
    assert scores["grow_diag_final"]["aer"] == pytest.approx(again["aer"])
    assert 0.0 < scores["diagonal"]["aer"] < 1.0 and scores["sentences"] == 40
    # asking for phrase trees of a model without LPSI, or scores without gold, is a clear error
    assert main(["inspect", "align", str(run), "--out", str(out)]) == 2
    assert "give --gold" in capsys.readouterr().err
    assert main(["inspect", "phrases", str(run), "--gold", str(gold), "--out", str(out)]) != 0
