"""``training.precision: fp16`` on the CPU: the path of a GPU without bf16 (V100, T4), run here.

float16 autocast with a gradient scaler, for every registered method: finite losses and
gradients and a scale that does not collapse (a mask written as ``-1e9`` overflows float16 and
fails here, see ``test_no_constant_in_the_model_code_overflows_float16``), and beam search under
the fp16 autocast (as validation BLEU runs in an fp16 training) gives the fp32 output.

Checked against the bugs: with ``pick_precision`` refusing fp16 on the CPU, as it did, every
test here but the source scan fails with "fp16 training needs a CUDA GPU"; with local_window's
bias written as ``zeros(...).masked_fill(outside, -1e9)``, its training test fails with "value
cannot be converted to type c10::Half without overflow" and the source scan names the line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from structnmt.config import TrainingConfig
from structnmt.model.search import beam_search
from structnmt.training.environment import pick_precision
from structnmt.training.updater import Updater
from tests.registry_cases import (
    all_cases,
    batches,
    covered_methods,
    make_model,
    prepare_synthetic,
    registered_methods,
    vocab_size,
)

ROOT = Path(__file__).resolve().parents[1]
FP16_MAX = float(torch.finfo(torch.float16).max)
#: a number literal with an exponent (``1e9``, ``-1.0e4``)
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?[eE][+-]?\d+)")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return prepare_synthetic(tmp_path_factory.mktemp("fp16"), train=400, test=100)


def _updater(model, precision: str = "fp16", lr: float = 1e-3, warmup: int = 5) -> Updater:
    cfg = TrainingConfig(lr=lr, warmup=warmup, clip_norm=1.0, label_smoothing=0.1, precision=precision)
    return Updater(model, cfg, torch.device("cpu"))


def test_fp16_on_the_cpu_is_float16_autocast_with_a_gradient_scaler():
    assert pick_precision("fp16", torch.device("cpu")) == (torch.float16, True)
    updater = _updater(torch.nn.Linear(2, 2))
    assert updater.scaler.is_enabled()
    with updater.autocast():
        assert torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype == torch.float16


def test_every_registered_method_is_covered():
    assert registered_methods() == covered_methods()


@pytest.mark.parametrize("case", sorted(all_cases()))
def test_every_method_trains_twenty_fp16_updates(dataset, case):
    torch.manual_seed(0)
    model = make_model(case, vocab_size(dataset))
    updater = _updater(model)
    start = updater.scaler.get_scale()
    data = batches(dataset, "train", model, max_tokens=300)
    applied = []
    for step in range(20):
        stats = updater.update([data[step % len(data)]])
        assert torch.isfinite(torch.tensor(stats.loss)), f"update {step}: loss {stats.loss}"
        assert all(torch.isfinite(torch.tensor(v)) for v in stats.aux.values()), f"update {step}: {stats.aux}"
        assert not stats.bad
        applied.append(stats.applied)
    # an overflow now and then only lowers the scale; a collapsing scale skips update after update
    assert sum(applied) >= 17, f"{20 - sum(applied)} of 20 updates skipped"
    assert updater.scaler.get_scale() >= start / 8
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_no_constant_in_the_model_code_overflows_float16():
    """Masks are ``-inf`` or the dtype's own limits: ``-1e9`` cannot be stored in float16."""
    found = []
    tensor_code = [ROOT / "structnmt" / part for part in ("model", "decoding", "training")]
    for path in sorted(p for folder in tensor_code for p in folder.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if any(abs(float(m)) > FP16_MAX for m in NUMBER.findall(code)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "constants beyond float16's range:\n" + "\n".join(found)


def test_beam_search_under_fp16_gives_the_fp32_output(dataset):
    torch.manual_seed(0)
    model = make_model("vanilla", vocab_size(dataset), dropout=0.0)
    updater = _updater(model, precision="fp32", lr=3e-3, warmup=20)
    data = batches(dataset, "train", model, max_tokens=400)
    for step in range(120):
        updater.update([data[step % len(data)]])
    fp16 = _updater(model, precision="fp16")
    lines = {"fp32": [], "fp16": []}
    for batch in batches(dataset, "test", model, inference=True):
        lines["fp32"] += [h[0].tokens for h in beam_search(model, batch, beam=4)]
        with fp16.autocast():
            lines["fp16"] += [h[0].tokens for h in beam_search(model, batch, beam=4)]
    same = sum(a == b for a, b in zip(lines["fp32"], lines["fp16"]))
    assert len(lines["fp32"]) == 100 and len({tuple(t) for t in lines["fp32"]}) > 50  # not a degenerate model
    assert same >= 95, f"{same} of 100 lines equal"  # 98 at commit time; the rest are near-ties


def test_a_training_run_in_fp16_validates_saves_its_scaler_and_resumes(dataset, tmp_path):
    """The trainer's whole path under fp16: updates, validation loss and BLEU under the autocast,
    the scaler in the checkpoint, and a resume that carries it on."""
    from structnmt.config import config_from_dict
    from structnmt.data.synthetic import demo_config
    from structnmt.training.checkpoint import load_checkpoint
    from structnmt.training.trainer import train

    raw = demo_config(dataset.parent, 0)
    raw["data"]["subwords"]["vocab_size"] = 300
    raw["model"].update({"enc_layers": 1, "dec_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64})
    raw["training"].update({"out_dir": str(tmp_path / "run"), "precision": "fp16", "device": "cpu", "max_steps": 4,
                            "max_tokens": 400, "warmup": 2, "valid_every": 2, "valid_beam": 2, "log_every": 1,
                            "tensorboard": False, "progress": False, "threads": 1})
    raw["decoding"].update({"max_len_a": 1.0, "max_len_b": 5})
    cfg = config_from_dict(raw)
    assert train(cfg)["step"] == 4
    scaler = load_checkpoint(tmp_path / "run" / "last.pt")["scaler"]
    assert scaler and scaler["scale"] >= 2.0**14  # the GradScaler's state, not an empty (disabled) one
    raw["training"]["max_steps"] = 6
    summary = train(config_from_dict(raw), resume=True)
    assert summary["status"] == "max_steps" and summary["step"] == 6
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    valid = [r for r in logged if r["kind"] == "valid"]
    assert valid and all(math.isfinite(r["loss"]) and "bleu" in r for r in valid)

