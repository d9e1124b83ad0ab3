"""Trainer: schedule values, exact accumulation, bitwise resume (in process and after SIGKILL),
non-finite updates, run files. Tiny models on a hand-made reversal task (no downloads)."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from structnmt.config import TrainingConfig, config_from_dict
from structnmt.data.batching import collate
from structnmt.data.dataset import DatasetWriter, ParallelDataset
from structnmt.data.example import Example, Side
from structnmt.errors import ConfigError
from structnmt.model.transformer import Transformer
from structnmt.training.checkpoint import load_checkpoint, newest_good_checkpoint
from structnmt.training.logger import read_log
from structnmt.training.optim import build_optimizer, build_scheduler, inverse_sqrt_factor
from structnmt.training.trainer import Trainer, Updater

V = 24  # vocabulary: 4 specials + 20 words


def words(ids: np.ndarray | list[int]) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def make_dataset(root: Path, n_train: int = 48, n_valid: int = 8, seed: int = 0) -> Path:
    """A reversal task stored with the real dataset writer: target = source reversed."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_valid)):
        with DatasetWriter(root, split, {"src": False, "tgt": False}) as writer:
            for _ in range(n):
                src = rng.integers(4, V, size=int(rng.integers(2, 9))).astype(np.int32)
                tgt = src[::-1].copy()
                writer.add(Example(src=Side(ids=src), tgt=Side(ids=tgt),
                                   meta={"src_text": words(src), "tgt_text": words(tgt)}))
    return root


def tiny_cfg(out_dir: Path | str, **training):
    raw = {
        "model": {"enc_layers": 1, "dec_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64,
                  "dropout": 0.1, "max_positions": 64},
        "training": {"out_dir": str(out_dir), "max_tokens": 64, "lr": 3e-3, "warmup": 4, "valid_every": 3,
                     "log_every": 1, "tensorboard": False, "progress": False, "device": "cpu",
                     "precision": "fp32", **training},  # the exactness tests are about fp32 arithmetic
        "decoding": {"max_len_b": 4},
    }
    return config_from_dict(raw)


def make_trainer(cfg, data_dir: Path | str, cls: type[Trainer] = Trainer,
                 model_cls: type[Transformer] = Transformer) -> Trainer:
    torch.manual_seed(cfg.training.seed)
    model = model_cls(cfg.model, V, V)
    return cls(cfg, model, ParallelDataset(Path(data_dir), "train"), ParallelDataset(Path(data_dir), "val"),
               decode=words, vocab={"src_vocab_size": V, "tgt_vocab_size": V, "fingerprint": "test"})


class SlowTrainer(Trainer):
    """Slows each batch down so that a test can kill the process between steps."""

    def collate(self, dataset, indices, fields, pad=False):
        time.sleep(0.03)
        return super().collate(dataset, indices, fields, pad)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data"))


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------
# schedule


def test_inverse_sqrt_factor_values():
    assert inverse_sqrt_factor(1, 4) == pytest.approx(0.25)
    assert inverse_sqrt_factor(4, 4) == pytest.approx(1.0)
    assert inverse_sqrt_factor(16, 4) == pytest.approx(0.5)
    assert inverse_sqrt_factor(100, 0) == 1.0


def test_scheduler_gives_each_update_its_rate():
    cfg = TrainingConfig(lr=1e-3, warmup=4)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3 * math.sqrt(4 / 5), 1e-3 * math.sqrt(4 / 6)]
    assert seen == pytest.approx(expected)
    assert isinstance(opt, torch.optim.Adam) and opt.defaults["betas"] == (0.9, 0.98)
    assert isinstance(build_optimizer(model, TrainingConfig(weight_decay=0.01)), torch.optim.AdamW)


# ---------------------------------------------------------------------------
# one update


def test_accumulated_micro_batches_equal_one_big_batch(data_dir):
    cfg = tiny_cfg("unused", eps=1e-4)
    # eps well above rounding noise: the key bias has a zero gradient in theory, and Adam would blow
    # the summation-order noise of two batch layouts up to full-size steps
    cfg.model.dropout = 0.0
    data = ParallelDataset(data_dir, "train")
    fields = {"src": set(), "tgt": set()}
    a, b = np.arange(0, 5), np.arange(5, 12)  # different token counts
    torch.manual_seed(3)
    m1 = Transformer(cfg.model, V, V)
    m2 = Transformer(cfg.model, V, V)
    m2.load_state_dict(m1.state_dict())
    u1 = Updater(m1, cfg.training, torch.device("cpu"))
    u2 = Updater(m2, cfg.training, torch.device("cpu"))
    for _ in range(3):
        s1 = u1.update([collate(data, a, fields), collate(data, b, fields)])
        s2 = u2.update([collate(data, np.concatenate([a, b]), fields)])
        assert s1.tokens == s2.tokens
        assert s1.loss == pytest.approx(s2.loss, rel=1e-6)
        for p1, p2 in zip(m1.parameters(), m2.parameters()):
            torch.testing.assert_close(p1.grad, p2.grad, atol=1e-6, rtol=1e-5)
    for name, value in m1.state_dict().items():
        torch.testing.assert_close(value, m2.state_dict()[name], atol=1e-6, rtol=0)
    assert s1.lr == pytest.approx(cfg.training.lr * 3 / 4)


# ---------------------------------------------------------------------------
# whole runs


def test_run_writes_logs_checkpoints_and_run_files(data_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_steps=6, keep_last=1)
    summary = make_trainer(cfg, data_dir).run()
    run = tmp_path / "run"
    assert summary["status"] == "max_steps" and summary["step"] == 6
    assert sorted(p.name for p in run.glob("*.pt")) == ["best.pt", "last.pt", "step_6.pt"]
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == 6
    records = read_log(run / "log.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert {"loss", "nll", "lr", "tgt_tokens_per_s", "epoch"} <= set(train[0])
    assert train[0]["lr"] == pytest.approx(3e-3 / 4)
    assert [r["step"] for r in valid] == [3, 6]
    assert 0.0 <= valid[0]["bleu"] <= 100.0 and valid[0]["loss"] > 0
    info = json.loads((run / "run.json").read_text())
    assert info["parameters"] == sum(p.numel() for p in Transformer(cfg.model, V, V).parameters())
    assert info["torch"] == torch.__version__
    assert "max_steps: 6" in (run / "config.yaml").read_text()
    # trained from pytest, not from the command line: the command that trains it again
    assert info["command"] == ["structnmt", "train", str(run / "config.yaml")]
    # a second run into the same directory must be asked to resume
    with pytest.raises(ConfigError, match="--resume"):
        make_trainer(cfg, data_dir).run()


class TickingClock:
    """Stands in for the trainer's ``time`` module: each reading is one second later."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_resume_is_bitwise_exact_in_process(data_dir, tmp_path, monkeypatch):
    from structnmt.training import trainer as trainer_module

    straight = make_trainer(tiny_cfg(tmp_path / "a", max_steps=6, accumulate=2), data_dir)
    straight.run()
    monkeypatch.setattr(trainer_module, "time", TickingClock())  # the two calls read alike clocks
    first = make_trainer(tiny_cfg(tmp_path / "b", max_steps=3, accumulate=2), data_dir)
    first_summary = first.run()
    assert first_summary["step"] == 3
    second = make_trainer(tiny_cfg(tmp_path / "b", max_steps=6, accumulate=2), data_dir)
    trainer_module.time = TickingClock()  # a fresh process's clock starts anew
    summary = second.run(resume=True)
    assert summary["step"] == 6
    # training time counts both calls (a study records it), not only the resumed one: the
    # second call's 3 steps read the clock at least once each, on top of the first call's time
    assert first.progress.elapsed_s >= 3
    assert second.progress.elapsed_s >= first.progress.elapsed_s + 3
    assert summary["train_seconds"] == round(second.progress.elapsed_s, 1)
    want, got = params(straight.updater.model), params(second.updater.model)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    # the data position and optimiser state travelled too
    a, b = straight.progress, second.progress
    assert (a.epoch, a.batch) == (b.epoch, b.batch)
    assert straight.progress.tokens == second.progress.tokens


class Exploding(Transformer):
    """Returns a NaN auxiliary loss from its third training call on."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls = 0

    def forward(self, batch, record=None):
        out = super().forward(batch, record)
        if self.training:
            self.calls += 1
            if self.calls > 2:
                out.losses["boom"] = out.logits.sum() * float("nan")
        return out


def test_non_finite_updates_are_skipped_and_the_run_stops(data_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_steps=20, valid_every=1, max_bad_steps=3)
    trainer = make_trainer(cfg, data_dir, model_cls=Exploding)
    summary = trainer.run()
    assert summary["status"] == "diverged"
    assert summary["step"] == 2 and summary["bad_steps"] == 3
    saved = load_checkpoint(tmp_path / "run" / "last.pt")
    assert saved["progress"]["step"] == 2
    for name, value in trainer.updater.model.state_dict().items():
        assert torch.isfinite(value).all()
        assert torch.equal(value, saved["model"][name]), name  # skipped updates changed nothing
    skipped = [r for r in read_log(tmp_path / "run" / "log.jsonl") if r.get("event") == "skipped_update"]
    assert len(skipped) == 3


def test_nan_weights_are_never_written(data_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_steps=1)
    trainer = make_trainer(cfg, data_dir)
    with torch.no_grad():
        next(trainer.updater.model.parameters()).fill_(float("nan"))
    summary = trainer.run()
    assert summary["status"] == "diverged"
    assert not list((tmp_path / "run").glob("*.pt"))


class ScriptedValidation(Trainer):
    """Validation results from a list, to test early stopping and best.pt bookkeeping."""

    scores = [10.0, 12.0, 11.0, 11.5, 13.0]

    def validate(self):
        return {"loss": 1.0, "nll": 1.0, "ppl": 2.7, "bleu": self.scores[len(self.progress.history)]}


def test_early_stopping_keeps_the_best_checkpoint(data_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_steps=20, valid_every=1, early_stopping=2)
    summary = make_trainer(cfg, data_dir, cls=ScriptedValidation).run()
    assert summary["status"] == "early_stopped"
    assert summary["step"] == 4 and summary["best_step"] == 2 and summary["best_metric"] == 12.0
    assert load_checkpoint(tmp_path / "run" / "best.pt")["progress"]["step"] == 2
    assert load_checkpoint(tmp_path / "run" / "last.pt")["progress"]["step"] == 4


def test_max_epochs_stops_after_one_pass(data_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_epochs=1, valid_every=0)
    trainer = make_trainer(cfg, data_dir)
    summary = trainer.run()
    n_batches = len(trainer.epoch_batches(1))
    assert summary["status"] == "max_epochs" and summary["step"] == n_batches > 1
    assert trainer.progress.epoch == 2 and trainer.progress.batch == 0
    # every target token (plus its EOS) seen exactly once
    assert trainer.progress.tokens == int((ParallelDataset(data_dir, "train").tgt_lengths + 1).sum())
    valid = [r for r in read_log(tmp_path / "run" / "log.jsonl") if r["kind"] == "valid"]
    assert [r["step"] for r in valid] == [n_batches]  # valid_every 0: once per epoch


# ---------------------------------------------------------------------------
# real processes: SIGKILL and SIGTERM, then --resume

SCRIPT = """
import sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_training import SlowTrainer, make_trainer, tiny_cfg
data, out, steps, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
cfg = tiny_cfg(out, max_steps=steps, valid_every=1, keep_last=2, valid_bleu=False)
print(make_trainer(cfg, data, cls=SlowTrainer).run(resume=resume)["status"], flush=True)
"""


def _start(script: Path, data: Path, out: Path, steps: int, resume: bool) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(script), str(data), str(out), str(steps), "1" if resume else "0"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _newest_step(out: Path) -> int:
    """The newest step checkpoint's step (0 if none); keep_last removes older ones as it goes."""
    return max((int(p.stem.split("_")[1]) for p in out.glob("step_*.pt") if p.stem.split("_")[1].isdigit()),
               default=0)


def _wait_for_step(proc: subprocess.Popen, out: Path, step: int, timeout: float = 90.0) -> None:
    """Until a checkpoint of ``step`` or later is saved: a poll that wakes late still sees it."""
    end = time.monotonic() + timeout
    while _newest_step(out) < step:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < end, "training did not reach the step in time"
        time.sleep(0.005)


@pytest.mark.slow
def test_killed_and_interrupted_runs_resume_exactly(data_dir, tmp_path):
    script = tmp_path / "run_training.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    steps = 8
    straight = _start(script, data_dir, tmp_path / "straight", steps, False)
    kill_at = random.randint(2, 6)
    killed = _start(script, data_dir, tmp_path / "killed", steps, False)
    _wait_for_step(killed, tmp_path / "killed", kill_at)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    kill_at = _newest_step(tmp_path / "killed")  # a poll that woke late killed it a step or two on
    assert killed.returncode == -signal.SIGKILL and kill_at < steps, (killed.returncode, kill_at)
    assert newest_good_checkpoint(tmp_path / "killed") is not None
    resumed = _start(script, data_dir, tmp_path / "killed", steps, True)
    for proc in (straight, resumed):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "max_steps"
    want = load_checkpoint(tmp_path / "straight" / "last.pt")
    got = load_checkpoint(tmp_path / "killed" / "last.pt")
    assert got["progress"]["step"] == steps
    for key, value in want["model"].items():
        assert torch.equal(value, got["model"][key]), f"killed at step {kill_at}: {key}"
    assert got["progress"]["tokens"] == want["progress"]["tokens"]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(data_dir, tmp_path):
    script = tmp_path / "run_training.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    termed = _start(script, data_dir, tmp_path / "termed", 50, False)
    _wait_for_step(termed, tmp_path / "termed", 2)
    termed.send_signal(signal.SIGTERM)
    out, err = termed.communicate(timeout=60)
    assert termed.returncode == 0, err
    assert out.strip() == "interrupted"
    stopped_at = load_checkpoint(tmp_path / "termed" / "last.pt")["progress"]["step"]
    train_steps = [r["step"] for r in read_log(tmp_path / "termed" / "log.jsonl") if r["kind"] == "train"]
    assert 2 <= stopped_at < 50 and stopped_at == train_steps[-1]
