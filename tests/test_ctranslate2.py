"""``structnmt export ctranslate2``: the exported model's beam search gives structnmt's output.

A small vanilla model and a DBSA model (whose bilinear heads fold into the query weights) are
trained for 300 updates of 1,024-token batches on the synthetic task, exported, and both engines translate
the test split with beam 5 and no length normalisation (the two engines' length penalties
are different formulas; at alpha 0 both rank by the summed log-probability). Methods that read
trees or change attention at translation time are refused, naming the method.

Checked against the bugs (by mutation): with our interleaved sinusoidal table left out
(CTranslate2's own encodings), none of the 60 lines matches; with DBSA's ``U`` not folded into
the queries, 52% of the DBSA model's lines do, under the bar of 95% (the unmutated export: 100%
and 98%).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from structnmt import api
from structnmt.config import config_from_dict
from structnmt.data.synthetic import demo_config, write_task
from structnmt.errors import ConfigError

ct2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install structnmt[ctranslate2])")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("ct2")
    write_task(work / "data", sizes={"train": 3000, "val": 20, "test": 60}, seed=3)
    return work


def _run(work: Path, name: str, methods: list[dict], steps: int = 300) -> Path:
    cfg = copy.deepcopy(demo_config(work, 0.0))
    cfg["model"].update({"enc_layers": 2, "dec_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128,
                         "methods": methods})
    cfg["training"].update({"out_dir": str(work / name), "max_steps": steps, "max_minutes": 0, "valid_every": steps,
                            "valid_bleu": False, "progress": False, "tensorboard": False, "threads": 1,
                            "precision": "fp32", "keep_last": 0, "warmup": 100, "max_tokens": 1024})
    api.train(config_from_dict(cfg), prepare_missing=True)
    return work / name / "last.pt"


def _agreement(work: Path, checkpoint: Path, out: Path) -> float:
    from structnmt.decoding.ctranslate2_export import CTranslate2Translator

    api.export_ctranslate2(checkpoint, out)
    translator = api.load(checkpoint, device="cpu")
    sources = (work / "data" / "test.src").read_text(encoding="utf-8").splitlines()
    ours = translator.translate(sources, beam=5, length_penalty=0.0)
    theirs = CTranslate2Translator(out, translator.preprocessor, threads=1).translate(sources, beam=5)
    assert any(ours), "the model translates to nothing: the test would prove nothing"
    return sum(a == b for a, b in zip(ours, theirs)) / len(sources)


def test_an_exported_vanilla_model_translates_as_structnmt_does(work):
    checkpoint = _run(work, "vanilla", [])
    assert _agreement(work, checkpoint, work / "ct2_vanilla") >= 0.95
    assert (work / "ct2_vanilla" / "model.bin").is_file()
    with pytest.raises(ConfigError, match="exists and is not empty"):
        api.export_ctranslate2(checkpoint, work / "ct2_vanilla")
    assert api.export_ctranslate2(checkpoint, work / "ct2_vanilla", force=True) == work / "ct2_vanilla"


def test_force_replaces_an_earlier_export_only(work, monkeypatch):
    """--force replaces OUT_DIR whole: a run folder (the checkpoint itself), a user's files or
    the directory the command runs in are refused before anything is read."""
    checkpoint = _run(work, "vanilla_force", [], steps=2)
    run = sorted(p.name for p in checkpoint.parent.iterdir())
    with pytest.raises(ConfigError, match=r"holds files that are not a CTranslate2 model \(.*last\.pt.*\): --force "
                                          "replaces only an earlier export"):
        api.export_ctranslate2(checkpoint, checkpoint.parent, force=True)
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == run
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"\(notes\.txt\)"):
        api.export_ctranslate2(checkpoint, work / "mine", force=True)
    assert (work / "mine" / "notes.txt").read_text() == "keep me"
    (work / "here").mkdir()
    monkeypatch.chdir(work / "here")
    for out in (".", ".."):
        with pytest.raises(ConfigError, match="is the current directory or holds it"):
            api.export_ctranslate2(checkpoint, out, force=True)


def test_dbsa_heads_fold_into_plain_attention(work):
    checkpoint = _run(work, "dbsa", [{"name": "dbsa", "sides": ["src", "tgt"], "heads": [0]}])
    import torch

    from structnmt.training.checkpoint import load_checkpoint

    u = load_checkpoint(checkpoint, map_location="cpu")["model"]
    learned = [v for k, v in u.items() if k.endswith(".U")]
    assert learned and any(not torch.allclose(x, torch.eye(x.size(-1)).expand_as(x), atol=1e-3) for x in learned)
    assert _agreement(work, checkpoint, work / "ct2_dbsa") >= 0.95


@pytest.mark.parametrize("methods, refusal", [
    ([{"name": "deps_san", "layers": [1]}], "'deps_san' reads"),
    ([{"name": "localness", "layers": [1]}], "'localness' changes attention at translation time"),
])
def test_methods_that_act_at_translation_time_are_refused(work, methods, refusal):
    checkpoint = _run(work, methods[0]["name"], methods, steps=2)
    with pytest.raises(ConfigError, match=refusal):
        api.export_ctranslate2(checkpoint, work / f"ct2_{methods[0]['name']}")
    assert not (work / f"ct2_{methods[0]['name']}").exists()
