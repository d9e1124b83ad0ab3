"""Runs that cannot corrupt each other and data that cannot go stale (issue 17), trainer and CLI side.

Each test reproduces one way a run used to go wrong silently and asserts what happens now.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from structnmt.errors import CheckpointError, DataError
from structnmt.io import atomic_write_text
from structnmt.locks import DirectoryLock, LockedError, holder, lock_file
from structnmt.training.checkpoint import verify_checkpoint
from structnmt.training.logger import read_log

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bad_input import block, cli, experiment, one_error, tiny_checkpoint  # noqa: E402
from test_training import SCRIPT, V, _start, make_dataset, make_trainer, tiny_cfg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data"))


# -- locks --------------------------------------------------------------------------------------


def test_a_held_directory_is_refused_at_once_naming_the_holder(tmp_path):
    with DirectoryLock(tmp_path / "run", "train"):
        assert holder(tmp_path / "run")["pid"] == os.getpid()
        with pytest.raises(LockedError, match=rf"in use by another process \(PID {os.getpid()} on "):
            DirectoryLock(tmp_path / "run", "train").acquire()
    assert holder(tmp_path / "run") is None
    DirectoryLock(tmp_path / "run", "train").acquire().release()  # free again


def test_the_lock_of_a_dead_process_is_taken_over_and_said_so(tmp_path):
    lock_file(tmp_path / "run").write_text(json.dumps({"pid": 999999, "host": "gone", "purpose": "train"}))
    said = []
    with DirectoryLock(tmp_path / "run", "train", messages=said.append):
        pass
    assert len(said) == 1 and "taking over the lock left by PID 999999 on gone" in said[0]


@pytest.mark.slow
def test_two_trainings_on_one_out_dir_exactly_one_runs(data_dir, tmp_path):
    script = tmp_path / "run_training.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    out = tmp_path / "shared_run"
    first = _start(script, data_dir, out, 2000, False)
    deadline = time.time() + 120
    while holder(out) is None and time.time() < deadline:
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.01)
    assert holder(out) is not None, "the first training took no lock within 120 s"
    with pytest.raises(LockedError, match=rf"PID {first.pid} "):
        make_trainer(tiny_cfg(out, max_steps=2000), data_dir).run(resume=True)
    # the lock is taken before the trainer catches signals: stop it once it is training
    log = out / "log.jsonl"
    while not (log.is_file() and any(r["kind"] == "train" for r in read_log(log))) and time.time() < deadline:
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.01)
    assert log.is_file() and any(r["kind"] == "train" for r in read_log(log)), "the first training logged no update"
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=180)
    assert stdout.strip() == "interrupted", stderr
    steps = [r["step"] for r in read_log(out / "log.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, len(steps) + 1))  # one writer: no step twice, none out of order


# -- resume -------------------------------------------------------------------------------------


def test_resume_on_another_dataset_is_refused(data_dir, tmp_path):
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=3), data_dir).run()
    cfg = tiny_cfg(tmp_path / "run", max_steps=6)
    other = make_trainer(cfg, data_dir)
    other.vocab = {"src_vocab_size": V, "tgt_vocab_size": V, "fingerprint": "another-vocabulary"}
    with pytest.raises(CheckpointError, match="vocabulary fingerprint test.*another-voca"):
        other.run(resume=True)


def test_resume_with_a_changed_model_names_the_fields_in_one_line(data_dir, tmp_path):
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=3), data_dir).run()
    cfg = tiny_cfg(tmp_path / "run", max_steps=6)
    cfg.model.d_model, cfg.model.d_ff = 48, 96
    with pytest.raises(CheckpointError) as err:
        make_trainer(cfg, data_dir).run(resume=True)
    message = str(err.value)
    assert "\n" not in message
    assert "model.d_model: 32 in the checkpoint, 48 now" in message and "model.d_ff" in message


def test_resume_with_a_changed_rate_applies_it_and_says_so(data_dir, tmp_path, capsys):
    """The checkpoint's optimiser and schedule states hold the rate and Adam's settings they were
    saved with; the config in force sets them, and the change is named (the rate was silently the old one)."""
    from structnmt.training.optim import inverse_sqrt_factor

    make_trainer(tiny_cfg(tmp_path / "run", max_steps=4, valid_every=4), data_dir).run()
    capsys.readouterr()
    trainer = make_trainer(tiny_cfg(tmp_path / "run", max_steps=6, valid_every=4, lr=0.2, weight_decay=0.01),
                           data_dir)
    trainer.run(resume=True)
    err = capsys.readouterr().err
    assert ("warning: resuming with training fields changed since the checkpoint (training.lr: 0.003 -> 0.2; "
            "training.weight_decay: 0.0 -> 0.01); they apply from the next update") in err
    rates = {r["step"]: r["lr"] for r in read_log(tmp_path / "run" / "log.jsonl") if r["kind"] == "train"}
    assert rates[4] == pytest.approx(3e-3 * inverse_sqrt_factor(4, 4))
    assert rates[5] == pytest.approx(0.2 * inverse_sqrt_factor(5, 4))
    assert all(group["weight_decay"] == 0.01 for group in trainer.updater.optimizer.param_groups)
    # an unchanged config says nothing
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=7, valid_every=4, lr=0.2, weight_decay=0.01),
                 data_dir).run(resume=True)
    assert "warning: resuming with" not in capsys.readouterr().err


def test_a_fallback_from_a_damaged_checkpoint_is_announced(data_dir, tmp_path, capsys):
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=6, keep_last=3), data_dir).run()
    last = tmp_path / "run" / "last.pt"
    damaged = last.read_bytes()[:-100]
    os.unlink(last)  # last.pt is a hard link of step_6.pt: damage this name only
    last.write_bytes(damaged)
    capsys.readouterr()
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=7, keep_last=3), data_dir).run(resume=True)
    err = capsys.readouterr().err
    assert "not resuming from last.pt: " in err and "truncated checkpoint" in err and "falling back to step_6.pt" in err


def test_after_a_resume_the_log_holds_each_step_once(data_dir, tmp_path):
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=6, valid_every=3), data_dir).run()
    log = tmp_path / "run" / "log.jsonl"
    # steps 7 and 8 were logged, then the process died before its next checkpoint
    with open(log, "a") as handle:
        for step in (7, 8):
            handle.write(json.dumps({"kind": "train", "step": step, "loss": 99.0}) + "\n")
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=9, valid_every=3), data_dir).run(resume=True)
    train = [r for r in read_log(log) if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 10))
    assert all(r["loss"] != 99.0 for r in train)
    superseded = read_log(tmp_path / "run" / "log.superseded.jsonl")
    assert [r["step"] for r in superseded] == [7, 8]


def test_a_run_killed_before_its_first_checkpoint_starts_a_clean_log(data_dir, tmp_path):
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / "log.jsonl", "w") as handle:  # logged, then killed before any save
        for step in (1, 2):
            handle.write(json.dumps({"kind": "train", "step": step, "loss": 99.0}) + "\n")
        handle.write('{"kind": "train", "st')  # torn by the kill
    make_trainer(tiny_cfg(tmp_path / "run", max_steps=3), data_dir).run(resume=True)
    train = [r for r in read_log(tmp_path / "run" / "log.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3] and all(r["loss"] != 99.0 for r in train)


def test_a_word_longer_than_the_model_reads_is_cut_inside_the_word():
    from structnmt.decoding.translate import shorten_to_fit

    class OnePiecePerCharacter:
        def encode(self, text):
            return list(text.replace(" ", "")), None

    class Pre:
        task_tag = None
        subwords = {"src": OnePiecePerCharacter()}

        def tokenise(self, side, text):
            return text

    assert shorten_to_fit(Pre(), "ab cd ef", 4) == "ab cd"
    assert shorten_to_fit(Pre(), "abcdefgh ij", 3) == "abc"


def test_the_summary_names_the_metric_it_holds(data_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_steps=3, valid_bleu=False, early_stopping_metric="bleu")
    summary = make_trainer(cfg, data_dir).run()
    assert summary["metric"] == "loss" and summary["best_metric"] > 0.5  # a loss, not a BLEU score


# -- the command line -----------------------------------------------------------------------------


def test_training_on_a_dataset_prepared_from_another_data_section_is_refused(tmp_path, capsys):
    config = experiment(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    code, _, err = cli(capsys, "train", str(config), "--set", "data.subwords.vocab_size=26")
    message = one_error(code, err)
    assert "data.subwords.vocab_size: 26 asked, 28 in the dataset" in message and "--force" in message


def test_translate_refuses_an_output_that_is_its_input(tmp_path, capsys):
    config = experiment(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    checkpoint = tiny_checkpoint(config, tmp_path / "model.pt")
    text = "The dog sees a cat.\n"
    (tmp_path / "in.txt").write_text(text)
    os.link(tmp_path / "in.txt", tmp_path / "same.txt")  # another name, the same file
    for output in ("in.txt", "same.txt"):
        code, _, err = cli(capsys, "translate", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "in.txt"),
                           "--output", str(tmp_path / output), "--device", "cpu")
        assert "is the input file" in one_error(code, err)
    assert (tmp_path / "in.txt").read_text() == text


def test_written_files_get_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "out.txt", "x\n")
    finally:
        os.umask(old)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o640


def _with_long_test_line(tmp_path: Path) -> Path:
    lines = ["The dog sees a cat.", "The dog " * 60 + "sees a cat.", "A cat likes the bird."]
    (tmp_path / "test.en").write_text("".join(s + "\n" for s in lines))
    (tmp_path / "test.de").write_text("".join(s.replace("The", "Der") + "\n" for s in lines))
    config = experiment(tmp_path, model={"max_positions": 64}, data={
        "src": {"lang": "en"},
        "splits": {"train": {"src": str(tmp_path / "train.en"), "tgt": str(tmp_path / "train.de")},
                   "test": {"src": str(tmp_path / "test.en"), "tgt": str(tmp_path / "test.de")}}})
    raw = yaml.safe_load(config.read_text())
    raw["decoding"] = {"beam": 1, "max_len_a": 0.0, "max_len_b": 3}
    config.write_text(yaml.safe_dump(raw))
    return config


def test_a_test_line_longer_than_the_model_reads_is_translated_truncated_and_scored(tmp_path, capsys):
    from structnmt.evaluation.run_eval import evaluate_run

    config = _with_long_test_line(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    (tmp_path / "run").mkdir()
    tiny_checkpoint(config, tmp_path / "run" / "last.pt")
    scores = evaluate_run(tmp_path / "run", splits=["test"], device="cpu", quiet=True)
    err = capsys.readouterr().err
    assert scores["test"]["truncated_lines"] == [2] and scores["test"]["sentences"] == 3
    assert "1 line longer than the model's 63 source positions was translated" in err and "(line 2)" in err
    assert len((tmp_path / "run" / "eval" / "test.hyp").read_text().splitlines()) == 3


def test_a_test_line_with_an_empty_source_is_scored_in_its_place(tmp_path, capsys):
    """A test set is scored whole: line 2 (empty source) gets an empty translation in its place, as
    the user's own sacreBLEU run on the files would; line 4 (empty reference) cannot be scored and
    prepare says so; the long-dependency subset's lines count in the scored set."""
    import sacrebleu

    from structnmt.data.dataset import ParallelDataset
    from structnmt.evaluation.run_eval import evaluate_run

    src = ["The dog sees a cat .", "", "a b c d e f g h i", "A cat likes the bird .", "The bird sees a dog .",
           "The dog " * 40 + "sees a cat ."]
    tgt = ["Der Hund sieht eine Katze .", "Ein Hund schläft .", "a b c", "", "Der Vogel sieht einen Hund .", "Hund"]
    (tmp_path / "test.en").write_text("".join(s + "\n" for s in src))
    (tmp_path / "test.de").write_text("".join(s + "\n" for s in tgt))
    trees = []
    for line in src:  # as a parser run over the file writes it: no sentence for the blank line
        if not (words := line.split()):
            continue
        trees.append(block([(i, w, 0 if i == 1 else 1, "root" if i == 1 else "dep") for i, w in enumerate(words, 1)]))
    (tmp_path / "test.conllu").write_text("".join(trees))
    config = experiment(tmp_path, model={"max_positions": 64})
    raw = yaml.safe_load(config.read_text())
    raw["data"]["src"]["parser"]["conllu"]["test"] = str(tmp_path / "test.conllu")
    raw["data"]["splits"]["test"] = {"src": str(tmp_path / "test.en"), "tgt": str(tmp_path / "test.de")}
    raw["decoding"] = {"beam": 1, "max_len_a": 0.0, "max_len_b": 3}
    config.write_text(yaml.safe_dump(raw))
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    assert f"test: {tmp_path / 'test.en'} line 2 has an empty source: `structnmt test` scores it in its place" in out
    assert f"test: warning: {tmp_path / 'test.de'} line 4 has an empty reference: dropped, and not scored" in out
    assert "test: kept 4 of 6 pairs; dropped empty 2; the 1 with an empty source kept aside for `test`" in out
    data = ParallelDataset(tmp_path / "dataset", "test")
    assert len(data) == 4 and [p["line"] for p in data.set_aside()] == [2]
    assert data.scored_raw("tgt") == [tgt[0], tgt[1], tgt[2], tgt[4], tgt[5]]
    assert data.scored_positions() == [0, 2, 3, 4]
    (tmp_path / "run").mkdir()
    tiny_checkpoint(config, tmp_path / "run" / "last.pt")
    scores = evaluate_run(tmp_path / "run", splits=["test"], device="cpu", quiet=True, long_dependency=7)
    hyps = (tmp_path / "run" / "eval" / "test.hyp").read_text().splitlines()
    refs = (tmp_path / "run" / "eval" / "test.ref").read_text().splitlines()
    assert len(hyps) == 5 and hyps[1] == "" and refs == data.scored_raw("tgt")
    assert scores["test"]["sentences"] == 5 and scores["test"]["empty_source_lines"] == [2]
    assert scores["test"]["truncated_lines"] == [5]  # line 5 of eval/test.hyp, the 4th stored pair
    assert scores["test"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    # the sentences with an arc of 7+ words are lines 3 and 5 of the scored set (stored pairs 2 and 4)
    assert scores["test_longdep"]["lines"] == [3, 5] and scores["test_longdep"]["sentences"] == 2
    assert (tmp_path / "run" / "eval" / "test_longdep.ref").read_text() == "a b c\nHund\n"
    # a line of the scored set, as eval/test.* number them, is what `plot attention --line` draws
    import structnmt
    from structnmt.visualisation.model_attention import plot_model_attention

    translator = structnmt.load(tmp_path / "run" / "last.pt", "cpu")
    with pytest.raises(DataError, match="line 2 has an empty source: there is no attention to draw"):
        plot_model_attention(translator, tmp_path / "two.png", line=2)
    with pytest.raises(DataError, match=r"line 6 is outside 1\.\.5"):
        plot_model_attention(translator, tmp_path / "six.png", line=6)
    assert plot_model_attention(translator, tmp_path / "three.png", line=3).stat().st_size > 0
    # a dataset prepared before empty sources were kept aside: its test says what it leaves out
    meta = json.loads((tmp_path / "dataset" / "meta.json").read_text())
    del meta["splits"]["test"]["set_aside"]
    (tmp_path / "dataset" / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert evaluate_run(tmp_path / "run", splits=["test"], device="cpu", quiet=True)["test"]["sentences"] == 4
    assert "warning: test: 2 pairs with an empty side were dropped when this dataset was prepared and are not " \
           "scored; `structnmt prepare --force` keeps" in capsys.readouterr().err
    meta["splits"]["test"]["set_aside"] = [{"line": 2, "at": 5, "src": "", "tgt": "x"}]  # past the 4 stored rows
    (tmp_path / "dataset" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"splits.test.set_aside is damaged \(each needs its place 'at'"):
        evaluate_run(tmp_path / "run", splits=["test"], device="cpu", quiet=True)


def test_translating_a_long_raw_line_warns_and_keeps_every_line(tmp_path, capsys):
    config = _with_long_test_line(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    checkpoint = tiny_checkpoint(config, tmp_path / "model.pt")
    code, _, err = cli(capsys, "translate", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "test.en"),
                       "--output", str(tmp_path / "out.txt"), "--device", "cpu", "--beam", "1")
    assert code == 0 and f"{tmp_path / 'test.en'}: 1 line longer" in err and "(line 2)" in err
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 3


@pytest.mark.slow
def test_sigterm_stops_train_with_the_resumable_status(tmp_path, capsys):
    config = experiment(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["training"].update({"max_steps": 100000, "valid_every": 0, "keep_last": 1})
    config.write_text(yaml.safe_dump(raw))
    assert cli(capsys, "prepare", str(config))[0] == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "structnmt.cli.main", "train", str(config)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "run" / "last.pt").exists() and time.time() < deadline:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    assert "status: interrupted" in out
    assert verify_checkpoint(tmp_path / "run" / "last.pt")["step"] >= 1


def test_replace_dir_swaps_in_the_new_directory_and_sweeps_a_crashed_swap_s_leftover(tmp_path):
    from structnmt.io import replace_dir

    target = tmp_path / "plan"
    target.mkdir()
    (target / "v").write_text("1")
    crashed = tmp_path / ".plan.old.999999"  # what a crash between the two renames leaves
    crashed.mkdir()
    (crashed / "v").write_text("0")
    other = tmp_path / ".planner.old.1"  # another directory's leftover is not ours to remove
    other.mkdir()
    new = tmp_path / "plan.tmp"
    new.mkdir()
    (new / "v").write_text("2")
    replace_dir(new, target)
    assert (target / "v").read_text() == "2" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".planner.old.1", "plan"]
