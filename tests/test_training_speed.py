"""What lets a GPU train small models without waiting on the host, checked on the CPU.

* An update reads nothing from the device: the skip of a non-finite update happens on the device
  (fused Adam's ``found_inf``), the rate comes from a device-side count of applied updates, and the
  statistics are read when the trainer logs. CPU training computes what it computed before, bit
  for bit: against numbers the previous code produced on this kind of machine, and on any machine
  against the previous update's arithmetic written out here.
* A trainer that reads the statistics late logs, validates, saves and stops exactly as one that
  reads each update at once, skipped updates and divergence included.
* ``training.cuda_graphs``: bucketed batch shapes, few of them, that change no loss and no token
  count; ``precision: auto`` picks fp32 with TF32 for small models on a GPU.

Checked against the bugs: with the skip decided on the host (``float(loss)``) the no-read test
fails naming ``__float__``; with the rate advanced by skipped updates too, the comparison with the
previous arithmetic fails; without the guard that stops updates after ``max_bad_steps`` in a row,
a late reader's weights move past the divergence and the ``diverges`` case fails.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_training import V, make_dataset, make_trainer, tiny_cfg  # the tests folder is on sys.path

from structnmt.data.batching import collate
from structnmt.data.dataset import ParallelDataset
from structnmt.model.transformer import Transformer
from structnmt.training.logger import read_log

pytestmark = pytest.mark.usefixtures("one_thread")

FIELDS = {"src": set(), "tgt": set()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data"))


class Flaky(Transformer):
    """A NaN auxiliary loss at the training calls in ``nan_calls`` (1-based)."""

    nan_calls: set[int] = set()

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.calls = 0

    def forward(self, batch, record=None):
        out = super().forward(batch, record)
        if self.training:
            self.calls += 1
            if self.calls in self.nan_calls:
                out.losses["boom"] = out.logits.sum() * float("nan")
        return out


# ---------------------------------------------------------------------------
# CPU numerics: those of the previous code

#: the previous code's runs (``run_digest``), made on an AMD EPYC with AVX-512 BF16, torch
#: 2.13.0+cpu, one thread; other kinds of machines round differently and skip this check
PREVIOUS = {
    "fp32_accum_clip": "abc0798b4a6c09fb",
    "bf16_adamw": "a28d18aa254ef555",
    "fp16_scaler": "df5c2f3a9d01e25e",
    "skips_then_diverges": "e3f29ebd12e6c5fe",
}
PREVIOUS_MACHINE = ("AVX512", True, "2.13.0+cpu", "AuthenticAMD")
RUNS = {
    "fp32_accum_clip": dict(max_steps=6, accumulate=2, clip_norm=0.5, valid_every=3),
    "bf16_adamw": dict(max_steps=5, precision="bf16", weight_decay=0.01, valid_every=0, max_epochs=2),
    "fp16_scaler": dict(max_steps=4, precision="fp16", valid_every=2),
    "skips_then_diverges": dict(max_steps=20, valid_every=1, max_bad_steps=3),
}


def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo: an Intel CPU with AVX-512 BF16 (and AMX) takes other oneDNN paths."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine() -> tuple[str, bool, str, str]:
    bf16 = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    return torch.backends.cpu.get_cpu_capability(), bf16, torch.__version__, cpu_vendor()


def run_digest(data_dir: Path, out: Path, name: str) -> str:
    """Train run ``name`` of ``RUNS``; one hash of its train records (exact floats), events,
    summary, weights and optimiser state. Uses only what the previous code had too."""
    Flaky.nan_calls = {3, 4, 5, 6} if name == "skips_then_diverges" else set()
    trainer = make_trainer(tiny_cfg(out / name, **RUNS[name]), data_dir, model_cls=Flaky)
    summary = trainer.run()
    h = hashlib.sha256()
    for r in read_log(out / name / "log.jsonl"):
        if r["kind"] == "train":
            h.update(repr([r["step"], r["epoch"], r["skipped"], *(float(r[k]).hex() for k in
                                                                   ("loss", "nll", "lr", "grad_norm"))]).encode())
        elif r["kind"] == "event":
            h.update(repr([r["event"], r["step"]]).encode())
    p = trainer.progress
    h.update(repr([summary["status"], p.step, p.epoch, p.batch, p.bad_total, p.tokens]).encode())
    model = trainer.updater.model
    for key, value in sorted(model.state_dict().items()):
        h.update(key.encode() + value.contiguous().numpy().tobytes())
    for i, param in enumerate(model.parameters()):
        for key, value in sorted(trainer.updater.optimizer.state[param].items()):
            h.update(f"{i}.{key}".encode() + value.float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.mark.skipif(machine() != PREVIOUS_MACHINE, reason=f"the previous code's numbers are of {PREVIOUS_MACHINE}")
@pytest.mark.parametrize("name", sorted(RUNS))
def test_cpu_training_is_bit_for_bit_what_the_previous_code_trained(data_dir, tmp_path, name):
    assert run_digest(data_dir, tmp_path, name) == PREVIOUS[name]


def previous_update(model, optimizer, scheduler, cfg, batches, amp):
    """The previous ``Updater._update`` (one process, no gradient scaler): host-side sums, checks
    and ``LambdaLR``. Returns (loss, nll, aux, lr, grad norm, applied) as it reported them."""
    from structnmt.model.losses import label_smoothed_nll

    model.train()
    optimizer.zero_grad(set_to_none=True)
    tokens = float(sum(b.n_tgt_tokens for b in batches))
    lr = float(optimizer.param_groups[0]["lr"])
    loss_sum = torch.zeros((), dtype=torch.float64)
    nll_sum = torch.zeros((), dtype=torch.float64)
    aux_sums: dict[str, torch.Tensor] = {}
    for batch in batches:
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            out = model(batch)
        loss, nll = label_smoothed_nll(out.logits.float(), batch.tgt_out, cfg.label_smoothing, ignore_index=0)
        total = loss
        for name, value in out.losses.items():
            aux_sums[name] = aux_sums.get(name, 0.0) + value.float().detach().double()
            total = total + value.float()
        (total * (1 / tokens)).backward()
        loss_sum += loss.detach().double()
        nll_sum += nll.detach().double()
    loss_tok, nll_tok = float(loss_sum) / tokens, float(nll_sum) / tokens
    aux = {n: float(aux_sums[n]) / tokens for n in sorted(aux_sums)}
    max_norm = cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    if not (math.isfinite(loss_tok) and all(map(math.isfinite, aux.values())) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        return loss_tok, nll_tok, aux, lr, grad_norm, False
    optimizer.step()
    scheduler.step()
    return loss_tok, nll_tok, aux, lr, grad_norm, True


@pytest.mark.parametrize("precision,weight_decay", [("fp32", 0.0), ("bf16", 0.01)])
def test_an_update_computes_what_the_previous_update_did_bit_for_bit(data_dir, precision, weight_decay):
    """On any machine: weights, moments, step counts and every reported number of 7 updates
    (two micro-batches each, clipped, two of them non-finite, one of those the first) equal the
    previous arithmetic's, and the schedule held back for the skipped ones."""
    from structnmt.training.optim import build_optimizer, build_scheduler
    from structnmt.training.updater import Updater

    cfg = tiny_cfg("unused", clip_norm=0.5, weight_decay=weight_decay, precision=precision)
    data = ParallelDataset(data_dir, "train")
    groups = [[collate(data, np.arange(a, a + 4), FIELDS), collate(data, np.arange(a + 4, a + 9), FIELDS)]
              for a in range(0, 35, 5)]
    Flaky.nan_calls = {1, 2, 9, 10}  # updates 1 and 5 (two calls an update)
    torch.manual_seed(2)
    old = Flaky(cfg.model, V, V)
    new = Flaky(cfg.model, V, V)
    new.load_state_dict(old.state_dict())
    optimizer = build_optimizer(old, cfg.training)
    scheduler = build_scheduler(optimizer, cfg.training)
    updater = Updater(new, cfg.training, torch.device("cpu"))
    amp = torch.bfloat16 if precision == "bf16" else None
    for i, group in enumerate(groups):
        torch.manual_seed(100 + i)  # dropout: the same draws in both
        want = previous_update(old, optimizer, scheduler, cfg.training, group, amp)
        torch.manual_seed(100 + i)
        s = updater.update(group)
        assert repr((s.loss, s.nll, s.aux, s.lr, s.grad_norm, s.applied)) == repr(want), f"update {i + 1}"
        assert s.bad == (not want[-1])
    for (name, a), b in zip(old.state_dict().items(), new.state_dict().values()):
        assert torch.equal(a, b), name
    for p_old, p_new in zip(old.parameters(), new.parameters()):
        for key, value in optimizer.state[p_old].items():
            assert torch.equal(value, updater.optimizer.state[p_new][key]), key
    assert updater.state_dict()["scheduler"] == scheduler.state_dict()
    assert updater.state_dict()["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]


def test_the_rates_on_the_device_are_the_schedulers_bit_for_bit():
    from structnmt.config import TrainingConfig
    from structnmt.training.optim import DeviceRates, build_optimizer, build_scheduler

    for warmup in (0, 7, 4000):
        cfg = TrainingConfig(lr=7e-4, warmup=warmup)
        optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg)
        scheduler = build_scheduler(optimizer, cfg)
        rates = DeviceRates(scheduler, torch.device("cpu"))
        seen = []
        for applied in range(10000):  # past the table's first size: it grows
            seen.append(rates.rate(torch.tensor(float(applied), dtype=torch.float64), applied + 3).item())
        for applied, rate in enumerate(seen):
            assert rate == optimizer.param_groups[0]["lr"], (warmup, applied)
            optimizer.step()
            scheduler.step()


class HostReads(torch.overrides.TorchFunctionMode):
    """Records every read of a tensor's value by the host."""

    READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "__format__"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_update_reads_nothing_from_the_device_until_its_statistics_are_read(data_dir, precision, monkeypatch):
    """The condition for a GPU that never waits on the host within an update: no ``.item()``,
    ``float()``, ``bool()`` of a tensor anywhere in ``Updater.update`` (forward, loss, backward,
    clipping, the skip, the optimiser, the scaler), a finite or a skipped one; reading one
    statistic reads them all, in one copy. The model runs as on a GPU, where it passes its padding
    masks without asking whether a batch has padding at all (on the CPU it asks: free there)."""
    from structnmt.training.updater import Updater

    monkeypatch.setattr("structnmt.model.transformer._always_mask", lambda pad: True)

    cfg = tiny_cfg("unused", clip_norm=0.5, precision=precision, accumulate=2)
    data = ParallelDataset(data_dir, "train")
    Flaky.nan_calls = {3}
    torch.manual_seed(0)
    updater = Updater(Flaky(cfg.model, V, V), cfg.training, torch.device("cpu"))
    for start in (0, 10, 20):
        group = [collate(data, np.arange(start, start + 4), FIELDS),
                 collate(data, np.arange(start + 4, start + 9), FIELDS)]
        with HostReads() as mode:
            stats = updater.update(group)
        assert mode.reads == [], f"host reads inside an update: {mode.reads}"
        with HostReads() as mode:
            assert stats.applied == (start != 10) and stats.bad == (start == 10) and stats.tokens > 0
            _ = stats.loss, stats.lr, stats.grad_norm, stats.aux
        assert mode.reads == ["tolist"]


# ---------------------------------------------------------------------------
# the trainer reads late and decides as if it read at once

def _records(run: Path) -> list[dict]:
    timing = {"elapsed_s", "tgt_tokens_per_s", "seconds"}
    return [{k: v for k, v in r.items() if k not in timing} for r in read_log(run / "log.jsonl")]


@pytest.mark.parametrize("nan_calls,settings", [
    ({3, 4, 9}, {"max_steps": 12, "log_every": 4, "valid_every": 5, "max_bad_steps": 3}),  # skips inside windows
    # diverges, then would recover: a late reader must not apply the updates after the divergence
    ({3, 4, 5}, {"max_steps": 20, "log_every": 50, "valid_every": 50, "max_bad_steps": 3}),
    (set(), {"max_epochs": 2, "log_every": 3, "valid_every": 0}),  # validation at epoch ends
], ids=["skips", "diverges", "epochs"])
def test_a_trainer_that_reads_late_logs_validates_and_stops_as_one_that_reads_each_update(
        data_dir, tmp_path, nan_calls, settings):
    results = []
    for late in (False, True):
        Flaky.nan_calls = nan_calls
        trainer = make_trainer(tiny_cfg(tmp_path / str(late), **settings), data_dir, model_cls=Flaky)
        trainer.read_every_update = not late
        summary = trainer.run()
        summary.pop("train_seconds")
        summary["run_dir"] = summary["last"] = summary["best"] = None
        results.append((summary, _records(tmp_path / str(late)), trainer))
    (summary, records, eager), (late_summary, late_records, late) = results
    assert late_summary == summary and late_records == records
    late.progress.elapsed_s = eager.progress.elapsed_s
    assert late.progress == eager.progress
    for name, value in eager.updater.model.state_dict().items():
        assert torch.equal(value, late.updater.model.state_dict()[name]), name
    assert late.updater.state_dict()["scheduler"] == eager.updater.state_dict()["scheduler"]
    if nan_calls == {3, 4, 5}:
        assert summary["status"] == "diverged" and late.updater.model.calls > eager.updater.model.calls


# ---------------------------------------------------------------------------
# precision: auto


def test_precision_auto_picks_fp32_with_tf32_for_small_models_on_a_gpu_and_bf16_for_large(monkeypatch):
    from structnmt.training.environment import SMALL_MODEL_WIDTH, choose_precision, pick_precision

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    small = choose_precision("auto", cuda, 256)
    assert (small.amp, small.scaler, small.tf32, small.name) == (None, False, True, "tf32")
    assert "d_model 256" in small.reason and "TF32" in small.reason
    large = choose_precision("auto", cuda, SMALL_MODEL_WIDTH)
    assert (large.amp, large.tf32, large.name) == (torch.bfloat16, False, "bfloat16") and "1024" in large.reason
    assert choose_precision("auto", cuda).amp == torch.bfloat16  # width unknown: as a large model
    for spec, amp in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        chosen = choose_precision(spec, cuda, 256)  # what is asked for is what runs, TF32 off
        assert chosen.amp == amp and not chosen.tf32
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))  # V100: no TF32, no bf16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert choose_precision("auto", cuda, 256).name == "float32"
    assert pick_precision("auto", cuda, 2048) == (torch.float16, True)
    # the CPU: as before, whatever the width
    native = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    for width in (None, 256, 4096):
        chosen = choose_precision("auto", cpu, width)
        assert (chosen.amp, chosen.scaler, chosen.tf32) == ((torch.bfloat16 if native else None), False, False)
        assert chosen.reason


def test_tf32_matmuls_hold_only_inside_their_block():
    from structnmt.training.environment import tf32_matmuls

    matmul = torch.backends.cuda.matmul
    read = (lambda: matmul.fp32_precision) if hasattr(torch.backends, "fp32_precision") else (lambda: matmul.allow_tf32)
    before = read()
    with tf32_matmuls():
        assert read() in ("tf32", True)
    assert read() == before
    with tf32_matmuls(False):
        assert read() == before


# ---------------------------------------------------------------------------
# bucketed batches (training.cuda_graphs)


def test_buckets_are_multiples_then_four_a_doubling():
    from structnmt.data.batching import bucket

    assert [bucket(n) for n in (1, 8, 9, 64, 65, 80, 81, 129, 1024)] == [8, 8, 16, 64, 80, 80, 96, 160, 1024]
    assert [bucket(n, 1) for n in (1, 7, 8, 9, 11, 17, 33, 100)] == [1, 7, 8, 10, 12, 20, 40, 112]
    assert len({bucket(n) for n in range(1, 1025)}) == 24
    for n in range(1, 2000):
        assert 0 <= bucket(n) - n < max(8, n / 4) and bucket(n, 16) % 16 == 0


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    from tests.registry_cases import prepare_synthetic

    return prepare_synthetic(tmp_path_factory.mktemp("synthetic"), train=600, test=8)


def test_an_epochs_bucketed_batches_have_few_shapes(synthetic):
    """Three epochs of token batches: each distinct shape would be a CUDA graph recording.
    Bucketed, they are pairs of a length bucket and a batch-size bucket, a third as many."""
    data = ParallelDataset(synthetic, "train")
    fields = {"src": {"valid"}, "tgt": {"valid"}}
    plain, bucketed = set(), set()
    for epoch in (1, 2, 3):
        for indices in token_batches_of(data, 300, epoch):
            a = collate(data, indices, fields)
            b = collate(data, indices, fields, 8, 0, True, True)
            plain.add(tuple(a.src.shape) + tuple(a.tgt_in.shape))
            bucketed.add(tuple(b.src.shape) + tuple(b.tgt_in.shape))
            assert b.tgt_out.ne(0).sum() == a.tgt_out.ne(0).sum()
    from structnmt.data.batching import bucket

    assert all(rows == bucket(rows, 1) and length == bucket(length) for rows, length, *_ in bucketed)
    assert len(bucketed) * 3 < len(plain)


def token_batches_of(data, max_tokens: int, epoch: int):
    from structnmt.data.batching import token_batches

    return token_batches(data.src_lengths, data.tgt_lengths, max_tokens, shuffle=True, seed=1, epoch=epoch)


def _losses(case: str, synthetic: Path, indices, bucketed: bool, fill_rows: bool):
    from structnmt.model.losses import label_smoothed_nll
    from tests.registry_cases import make_model, vocab_size

    torch.manual_seed(0)
    model = make_model(case, vocab_size(synthetic), dropout=0.0).eval().double()
    needs = model.structure_needs()
    fields = {"src": needs["src"] | {"valid"}, "tgt": needs["tgt"] | {"valid"}}
    batch = collate(ParallelDataset(synthetic, "train"), indices, fields, 8 if bucketed else 1, 0, bucketed, fill_rows)
    out = model(batch)
    loss, nll = label_smoothed_nll(out.logits, batch.tgt_out, 0.1)
    return batch, [loss.item(), nll.item()], {k: v.item() for k, v in out.losses.items()}


def test_bucketed_batches_change_no_loss_and_no_token_count(synthetic):
    """Every method, in float64 (a padded position reaching a loss moves it by far more than
    float64's rounding; the sums' order changes with the shape, so they agree to rounding):
    lengths bucketed for all; filler rows too for the models without auxiliary losses, as the
    trainer does. LPSI's synchronisation loss reads every target position that is not padding,
    a filler's BOS included: the reason the trainer fills rows only without auxiliary losses."""
    from structnmt.data.batching import bucket
    from tests.registry_cases import all_cases

    data = ParallelDataset(synthetic, "train")
    indices = next(b for b in token_batches_of(data, 300, 1) if bucket(len(b), 1) != len(b))
    for case in sorted(all_cases()):
        plain, losses, aux = _losses(case, synthetic, indices, False, False)
        fill = not aux
        padded, padded_losses, padded_aux = _losses(case, synthetic, indices, True, fill)
        assert padded.src.shape != plain.src.shape and (padded.size > plain.size) == fill
        assert padded.tgt_out.ne(0).sum() == plain.tgt_out.ne(0).sum()
        assert padded_losses == pytest.approx(losses, rel=1e-12), case
        assert padded_aux == pytest.approx(aux, rel=1e-12), case
    _, _, lpsi = _losses("lpsi_mse", synthetic, indices, True, True)
    assert lpsi != pytest.approx(_losses("lpsi_mse", synthetic, indices, False, False)[2], rel=1e-6)


def test_a_trainer_with_bucketed_batches_fills_rows_once_an_update_showed_no_auxiliary_loss(data_dir, tmp_path):
    """What ``training.cuda_graphs`` turns on, run on the CPU: bucketed shapes, counted in the
    ``train`` records, the losses of unbucketed training (no dropout: the same draws)."""
    results = []
    for bucketed in (False, True):
        cfg = tiny_cfg(tmp_path / str(bucketed), max_steps=5, log_every=1, valid_every=0)
        cfg.model.dropout = 0.0
        trainer = make_trainer(cfg, data_dir)
        trainer.bucketed = bucketed
        trainer.run()
        results.append((trainer, [r for r in read_log(tmp_path / str(bucketed) / "log.jsonl") if r["kind"] == "train"]))
    (plain, plain_records), (bucketed, records) = results
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in plain_records], rel=1e-5)
    assert bucketed.progress.tokens == plain.progress.tokens
    assert "batch_shapes" not in plain_records[0] and records[-1]["batch_shapes"] == len(bucketed.shapes) >= 1
    # a model with an auxiliary loss keeps its batch sizes
    bucketed.updater.aux_names = ["lpsi_synch"]
    data = ParallelDataset(data_dir, "train")
    assert bucketed.collate(data, np.arange(9), bucketed.fields, pad=True).size == 9
    bucketed.updater.aux_names = []
    assert bucketed.collate(data, np.arange(9), bucketed.fields, pad=True).size == 10


def test_a_run_says_which_precision_it_took_and_that_cuda_graphs_need_cuda(data_dir, tmp_path, capsys):
    import json

    trainer = make_trainer(tiny_cfg(tmp_path / "run", max_steps=1, cuda_graphs="on", precision="auto"), data_dir)
    assert trainer.run()["status"] == "max_steps"
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("training.cuda_graphs:")] == \
        ["training.cuda_graphs: off (CUDA graphs need CUDA; training without them)"]
    precision = [line for line in err if line.startswith("training.precision:")]
    assert len(precision) == 1 and "(auto: this CPU" in precision[0]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["precision"] == trainer.updater.precision.name
    assert not trainer.bucketed and "batch_shapes" not in read_log(tmp_path / "run" / "log.jsonl")[0]
