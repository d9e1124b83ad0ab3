"""The Markdown report from hand-made run directories."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF

from structnmt.errors import DataError
from structnmt.evaluation.report import build_report


def make_run(root: Path, name: str, hyps: list[str], refs: list[str], speeds: list[float],
             params: int, with_json: bool = True) -> Path:
    run = root / name
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "test.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (run / "eval" / "test.ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
    if with_json:
        bleu = BLEU()
        scores = {"bleu": bleu.corpus_score(hyps, [refs]).score,
                  "chrf": CHRF().corpus_score(hyps, [refs]).score,
                  "signature": {"bleu": str(bleu.get_signature())}}
        (run / "eval" / "test.json").write_text(json.dumps(scores), encoding="utf-8")
    (run / "run.json").write_text(json.dumps({
        "command": f"structnmt train configs/{name}.yaml", "parameters": params, "dataset": "toy",
        "method": [] if name == "base" else ["pascal"],
        "versions": {"python": "3.11.9", "torch": "2.13.0", "sacrebleu": "2.6.0", "structnmt": "0.1.0"},
    }), encoding="utf-8")
    log = [{"kind": "train", "step": i + 1, "epoch": 1, "loss": 3.0, "nll": 3.0, "lr": 1e-3,
            "tgt_tokens_per_s": s} for i, s in enumerate(speeds)]
    log.append({"kind": "valid", "step": len(speeds), "loss": 2.5, "bleu": 10.0})
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log), encoding="utf-8")
    return run


@pytest.fixture
def runs(tmp_path):
    rng = random.Random(0)
    vocab = "the a cat dog sat ran on under mat house red big".split()
    refs = [" ".join(rng.choices(vocab, k=8)) for _ in range(60)]
    base = [" ".join("xx" if i % 3 == 0 else w for i, w in enumerate(r.split())) for r in refs]
    better = [" ".join("xx" if i == 0 else w for i, w in enumerate(r.split())) for r in refs]
    return (make_run(tmp_path, "base", base, refs, [1000.0, 3000.0], 12_345_678),
            make_run(tmp_path, "pascal", better, refs, [1500.0], 12_345_678, with_json=False),
            refs, base, better)


def test_report_table_has_the_right_numbers(runs, tmp_path):
    base_dir, pascal_dir, refs, base, better = runs
    out = tmp_path / "report.md"
    text = build_report([base_dir, pascal_dir], baseline="base", test_sets=None, out=out, n_samples=200)
    assert out.read_text(encoding="utf-8") == text
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.split("## Commands")[0].splitlines() if line.startswith(("| base", "| pascal"))}
    base_row, pascal_row = rows["base (baseline)"], rows["pascal"]
    assert base_row[1] == f"{BLEU().corpus_score(base, [refs]).score:.2f}"
    assert base_row[2] == f"{CHRF().corpus_score(base, [refs]).score:.2f}"
    # pascal has no test.json: its scores are computed from the files, and it is significant
    assert pascal_row[0] == "pascal"
    assert pascal_row[1] == f"{BLEU().corpus_score(better, [refs]).score:.2f}†"
    assert base_row[3] == pascal_row[3] == "12.3M"
    assert base_row[4] == "2,000" and pascal_row[4] == "1,500"
    assert "`structnmt train configs/pascal.yaml`" in text
    assert "| pascal | 3.11.9 | 2.13.0 | 2.6.0 | 0.1.0 |" in text
    assert "nrefs:1|case:mixed" in text


def test_missing_run_dir_and_missing_eval(runs, tmp_path):
    base_dir = runs[0]
    with pytest.raises(DataError, match="run directory not found"):
        build_report([base_dir, tmp_path / "nope"], baseline=None, test_sets=None, out=None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no evaluation outputs"):
        build_report([tmp_path / "empty"], baseline=None, test_sets=None, out=None)
    with pytest.raises(DataError, match="test set 'wmt' has no eval"):
        build_report([base_dir], baseline=None, test_sets=["wmt"], out=None)
    with pytest.raises(DataError, match="baseline run 'x'"):
        build_report([base_dir], baseline="x", test_sets=None, out=None)


def test_bad_log_line_is_named(runs):
    base_dir = runs[0]
    with open(base_dir / "log.jsonl", "a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    with pytest.raises(DataError) as err:
        build_report([base_dir], baseline=None, test_sets=None, out=None)
    assert err.value.line == 4 and "log.jsonl" in str(err.value)


def test_a_significantly_worse_run_gets_a_double_dagger(runs, tmp_path):
    base_dir, _pascal_dir, refs, _base, _better = runs
    worse = [" ".join("xx" if i % 3 else w for i, w in enumerate(r.split())) for r in refs]
    worse_dir = make_run(tmp_path, "worse", worse, refs, [1000.0], 1, with_json=False)
    text = build_report([base_dir, worse_dir], baseline="base", test_sets=None, out=None, n_samples=200)
    [row] = [line for line in text.split("## Commands")[0].splitlines() if line.startswith("| worse |")]
    assert f"| {BLEU().corpus_score(worse, [refs]).score:.2f}‡ |" in row
    assert "† / ‡: BLEU better / worse than the baseline (base) with p < 0.05 (sacreBLEU paired bootstrap" in text


def test_runs_of_one_folder_name_are_told_apart_by_their_parents(tmp_path):
    """Two seeds' runs are often both ``run``: the report names them by as many parent folders as
    it takes, and the baseline is one of those names (a dict keyed by ``run`` kept the last one)."""
    rng = random.Random(1)
    vocab = "the a cat dog sat ran on under mat".split()
    refs = [" ".join(rng.choices(vocab, k=6)) for _ in range(30)]
    worse = [" ".join("xx" if i % 2 else w for i, w in enumerate(r.split())) for r in refs]
    first = make_run(tmp_path / "seed1", "run", refs, refs, [1000.0], 10)
    second = make_run(tmp_path / "seed2", "run", worse, refs, [1000.0], 10)
    from structnmt.evaluation.report import run_names

    assert run_names([first, second, tmp_path / "x" / "other"]) == ["seed1/run", "seed2/run", "other"]
    info = json.loads((second / "run.json").read_text())  # run.json as the trainer writes it: argv, a list
    (second / "run.json").write_text(json.dumps({**info, "command": ["structnmt", "train", "my dir/config.yaml"]}))
    text = build_report([first, second], baseline="seed1/run", n_samples=50)
    assert "| seed1/run (baseline) |" in text and "| seed2/run |" in text
    assert "- seed2/run: `structnmt train 'my dir/config.yaml'`" in text  # one line to paste, quoted
    with pytest.raises(DataError, match="baseline run 'run' is not among the runs \\(seed1/run, seed2/run\\)"):
        build_report([first, second], baseline="run", n_samples=50)
    with pytest.raises(DataError, match="is given more than once"):
        build_report([first, tmp_path / "seed1" / "run" / "."], n_samples=50)


def test_runs_on_other_references_are_refused_and_a_missing_set_is_a_dash(runs, tmp_path):
    base_dir, _pascal_dir, refs, base, _better = runs
    other = make_run(tmp_path, "other", base, ["x " + r for r in refs], [1000.0], 1, with_json=False)
    said = "run other and baseline base have different references for test set 'test'"
    with pytest.raises(DataError, match=said) as err:
        build_report([base_dir, other], baseline="base", n_samples=50)
    assert err.value.path == str(other / "eval" / "test.ref")
    (other / "eval" / "test.hyp").rename(other / "eval" / "dev.hyp")
    (other / "eval" / "test.ref").rename(other / "eval" / "dev.ref")
    text = build_report([base_dir, other], baseline="base", n_samples=50)
    [row] = [line for line in text.split("## Commands")[0].splitlines() if line.startswith("| other |")]
    cells = [c.strip() for c in row.split("|")[2:-1]]
    # columns by test set name: dev (this run only: scored, nothing to compare with), then test (absent)
    assert cells[3:5] == ["–", "–"]
    assert cells[1] == f"{BLEU().corpus_score(base, [['x ' + r for r in refs]]).score:.2f}"
