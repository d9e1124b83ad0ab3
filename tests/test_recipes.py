"""Every recipe in configs/ trains and translates end to end (a smoke run on tiny data).

The recipes' data sections point at Multi30k; here each recipe keeps its model and method
sections but is shrunk (d_model 32) and trained for two updates on a small synthetic
corpus with gold trees on both sides, then translates a test split with beam search.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from structnmt.config import _read_yaml, config_from_dict, load_config
from structnmt.data.prepare import prepare
from structnmt.data.synthetic import demo_config, write_task
from structnmt.evaluation.run_eval import evaluate_run
from structnmt.training.trainer import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(p.name for p in CONFIGS.glob("multi30k_*.yaml"))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> dict[bool, dict]:
    """Synthetic data sections, prepared once: plain and C&H multi-task."""
    work = tmp_path_factory.mktemp("recipes")
    write_task(work / "data", sizes={"train": 120, "val": 8, "test": 8}, seed=3)
    out = {}
    for multitask in (False, True):
        data = demo_config(work, 1.0)["data"]
        data["dir"] = str(work / ("dataset_ch" if multitask else "dataset"))
        data["subwords"]["vocab_size"] = 300
        data["multitask_parse"] = multitask
        cfg = config_from_dict({"data": data})
        torch.set_num_threads(1)
        prepare(cfg, force=True, verbose=False)
        out[multitask] = data
    return out


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_a_fixed_number_of_updates_when_asked(recipe):
    """A study sets ``training.max_steps`` and ``training.max_minutes: 0`` on every recipe:
    then the update count alone ends the run (no time budget, epoch limit or early stop)."""
    cfg = load_config(CONFIGS / recipe, {"training.max_steps": 2154, "training.max_minutes": 0})
    t = cfg.training
    assert (t.max_steps, t.max_minutes, t.max_epochs, t.early_stopping) == (2154, 0, 0, 0)
    assert load_config(CONFIGS / recipe).training.max_minutes == 55  # the recipes' own budget


def test_recipe_names_say_what_they_train():
    dbsa = load_config(CONFIGS / "multi30k_en_de_dbsa_src.yaml").model.methods
    assert [m.stacks() for m in dbsa] == [["encoder"]]
    assert load_config(CONFIGS / "multi30k_en_fr_dbsa.yaml").model.methods[0].stacks() == ["encoder", "decoder"]
    plain, rs, wink = (load_config(CONFIGS / f"multi30k_en_de_deps_san_{v}.yaml").model.methods[0]
                       for v in ("plain", "rs", "wink"))
    assert not plain.rs_sparsing and not plain.wink_sparsing
    assert rs.rs_sparsing and not rs.wink_sparsing
    assert wink.wink_sparsing and not wink.rs_sparsing
    assert plain.entry() == {k: v for k, v in rs.entry().items() if not k.startswith("rs_")}
    assert not any((CONFIGS / f"multi30k_en_de_{old}.yaml").exists() for old in ("dbsa", "deps_san"))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_and_translates(recipe, tiny_data, tmp_path):
    raw = _read_yaml(CONFIGS / recipe)
    multitask = bool(raw.get("data", {}).get("multitask_parse", False))
    raw["data"] = copy.deepcopy(tiny_data[multitask])
    raw["model"].update({"d_model": 32, "d_ff": 64, "dropout": 0.0})
    raw["training"].update({
        "out_dir": str(tmp_path / "run"), "max_steps": 2, "max_tokens": 400, "warmup": 1, "valid_every": 2,
        "max_minutes": 0, "progress": False, "tensorboard": False, "threads": 1,
    })
    raw["decoding"] = {"beam": 2, "max_len_a": 1.0, "max_len_b": 5}
    cfg = config_from_dict(raw)
    summary = train(cfg)
    assert summary["status"] == "max_steps" and summary["step"] == 2
    run = Path(cfg.training.out_dir)
    assert (run / "last.pt").exists() and (run / "config.yaml").exists()
    logged = [yaml.safe_load(line) for line in (run / "log.jsonl").read_text().splitlines()]
    train_lines = [r for r in logged if r["kind"] == "train"]
    assert train_lines, "no training step was logged"
    with_loss = {"dbsa", "sisa", "syncattn"}
    expects_aux = any(m.name in with_loss or (m.name == "lpsi" and m.sync != "none")
                      for m in cfg.model.methods)
    standard = {"kind", "step", "epoch", "loss", "nll", "lr", "tgt_tokens_per_s", "ppl", "time", "tokens",
                "sentences", "grad_norm", "seconds", "bad_steps", "skipped"}
    aux = {k for k in train_lines[-1] if k not in standard}
    if expects_aux:  # every auxiliary loss is logged under its own name
        assert aux, f"no auxiliary loss logged: {sorted(train_lines[-1])}"
    scores = evaluate_run(run, checkpoint=str(run / "last.pt"), splits=["test"], device="cpu", quiet=True)
    assert (run / "eval" / "test.hyp").read_text().count("\n") == 8
    assert 0.0 <= scores["test"]["bleu"] <= 100.0
