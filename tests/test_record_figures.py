"""studies/record_figures.py: the write-up's figures that the report does not print."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("record_figures", ROOT / "studies" / "record_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def _record(folder: Path, recipe: str, seed: int, valid: list[tuple[int, float, float]], **extra) -> None:
    run = folder / recipe / f"seed{seed}"
    run.mkdir(parents=True)
    record = {"recipe": recipe, "seed": seed, "valid": [{"step": s, "bleu": b, "loss": loss} for s, b, loss in valid],
              "cpu_info": {"model": "Test CPU"}, "precision": "bfloat16", "train_seconds": 600.0,
              "calls": [{"from_step": 0, "threads": 1}, {"from_step": 400, "threads": 2}],
              "finished": "2026-01-01T00:00:00+0000", "scores": {}, **extra}
    (run / "record.json").write_text(json.dumps(record))


def test_validation_and_runs_figures_come_from_the_records(tmp_path):
    kept, held = tmp_path / "study", tmp_path / "pending"
    # vanilla: lowest loss at 800, then 3.1 (higher) and 3.05 (higher, though it falls): best BLEU at 1200
    _record(kept, "vanilla", 1, [(400, 10.0, 4.0), (800, 20.0, 3.0), (1200, 23.5, 3.1), (1600, 21.0, 3.05)])
    _record(held, "lpsi", 2, [(400, 11.0, 3.9), (800, 22.0, 2.9), (1200, 21.0, 2.8)], gpu="NVIDIA H200")
    records = figures.read_records([(kept, False), (held, True)])
    assert [(r, s, h) for r, s, _, h in records] == [("vanilla", 1, False), ("lpsi", 2, True)]

    text = "\n".join(figures.validation(records, late=800))
    assert "lowest loss at 800 (3.0000, higher at every later check), best BLEU at 1200" in text
    assert "lpsi seed 2 (held)" in text and "lowest loss at 1200 (2.8000, the last check)" in text
    assert "Lowest losses 2.8000–3.0000, at updates 800, 1200; best BLEU at the last check in 0 of 2 runs." in text
    assert "Largest move between checks from update 800 on: +3.50 (vanilla seed 1, 800→1200), " \
           "-2.50 (vanilla seed 1, 1200→1600)." in text
    late = "\n".join(figures.validation(records, late=1200))  # every move from 1200 on is down
    # the whole listing: lpsi's -1.00 (800→1200) starts before 1200 and is left out
    assert "from update 1200 on: -2.50 (vanilla seed 1, 1200→1600), -2.50 (vanilla seed 1, 1200→1600)." in late

    rows = figures.runs_table(records)
    assert "| 1 | vanilla | Test CPU | 1/2 | bfloat16 | 10.0 | 400 | 23.50 (1200) | 2026-01-01T00:00 |" in rows
    restarted = [{**records[0][2], "calls": [{"from_step": 0, "threads": 1}, {"from_step": 0, "threads": 1}]}]
    assert "| restarted at 0 |" in figures.runs_table([("vanilla", 1, restarted[0], False)])[-1]
    assert any(row.startswith("| 2 | lpsi (held) | Test CPU + NVIDIA H200 |") for row in rows)


def test_it_runs_on_the_committed_study(capsys, monkeypatch):
    # a fresh clone has the records and no dataset: the subset section says so instead of failing
    monkeypatch.chdir(ROOT)
    assert figures.main(["studies/multi30k_en_de_converged.yaml"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | transformer | AMD EPYC | 1 | bfloat16 |" in out
    assert "- transformer seed 1: 400: 18.35/3.9816  800: 29.35/3.1853" in out  # the budget run's curve
