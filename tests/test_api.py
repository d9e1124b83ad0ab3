"""The Python API (``structnmt.load``, ``structnmt.train``, ...) against the command line.

A small model of the demo task is trained once through ``structnmt.demo``; the API must then
translate it line for line as ``structnmt translate`` does, and every error the command line
reports must come out of the API as the toolkit's exception with the same message. The
README's "From Python" code runs here as it is written.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

import structnmt
from structnmt.cli.main import main
from structnmt.errors import CheckpointError, ConfigError, DataError

pytestmark = pytest.mark.slow  # one small model is trained for the module

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = "demo/run/best.pt"
#: the demo at a size that trains in seconds: 2+2 layers of width 32, 30 updates
TINY = {"model.d_model": 32, "model.d_ff": 64, "model.enc_layers": 2, "model.dec_layers": 2,
        "training.max_steps": 30, "training.valid_every": 30, "training.warmup": 10, "training.lr": 5e-3,
        "training.max_tokens": 512, "training.tensorboard": False, "training.threads": 2,
        "training.valid_bleu": False, "data.subwords.vocab_size": 400, "decoding.beam": 3}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``demo/`` (task, dataset, trained run) and ``configs/demo.yaml`` (the
    demo's config at the same small size, so that the README's code trains in seconds)."""
    from structnmt.config import set_dotted
    from structnmt.data.synthetic import demo_config

    root = tmp_path_factory.mktemp("api")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        scores = structnmt.demo("demo", minutes=0, train_size=600, seed=3, overrides=TINY, verbose=False,
                                valid_size=16, test_size=12)
    assert scores["summary"]["status"] == "max_steps" and (root / CHECKPOINT).exists()
    raw = demo_config(Path("demo"), 0)
    for key, value in TINY.items():
        set_dotted(raw, key, value)
    (root / "configs").mkdir()
    (root / "configs" / "demo.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    return root


@pytest.fixture
def here(work: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(work)
    return work


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_importing_structnmt_loads_no_torch() -> None:
    code = "import sys, structnmt; print('torch' in sys.modules, structnmt.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded, where = out.split()
    assert loaded == "False" and where.startswith(str(ROOT))
    assert {"load", "load_config", "prepare", "train", "test", "evaluate"} <= set(structnmt.__all__)


def test_every_public_function_of_the_api_is_a_name_of_structnmt() -> None:
    """The README promises every command as one function of ``structnmt``: a function added to
    ``structnmt.api`` but not to the lazy name list would be an AttributeError there."""
    import inspect

    import structnmt.api as api

    public = {name for name, value in vars(api).items()
              if inspect.isfunction(value) and value.__module__ == api.__name__ and not name.startswith("_")}
    assert public <= set(structnmt.__all__), sorted(public - set(structnmt.__all__))
    for name in public:
        assert getattr(structnmt, name) is getattr(api, name)
    assert set(structnmt.__all__) <= set(dir(structnmt))


# ---------------------------------------------------------------------------
# translating


def test_the_api_translates_as_the_cli_does_line_for_line(here: Path, capsys: pytest.CaptureFixture) -> None:
    lines = (here / "demo/data/test.src").read_text(encoding="utf-8").splitlines()[:5] + ["", "the the the ."]
    (here / "in.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    translator = structnmt.load(CHECKPOINT, device="cpu")
    for options, api in (([], translator.translate(lines)),
                         (["--beam", "1", "--length-penalty", "1.0"], translator.translate(lines, beam=1,
                                                                                            length_penalty=1.0))):
        code, _, err = cli(capsys, "translate", "--checkpoint", CHECKPOINT, "--input", "in.txt", "--output",
                           "out.txt", "--device", "cpu", *options)
        assert code == 0, err
        assert (here / "out.txt").read_text(encoding="utf-8").splitlines() == api
        assert len(api) == len(lines)
    nbest = translator.nbest(lines, 2, beam=3)
    code, _, err = cli(capsys, "translate", "--checkpoint", CHECKPOINT, "--input", "in.txt", "--output", "out.txt",
                       "--device", "cpu", "--beam", "3", "--nbest", "2")
    assert code == 0, err
    assert (here / "out.txt").read_text(encoding="utf-8").splitlines() == [
        f"{i}\t{hyp}" for i, hyps in enumerate(nbest) for hyp in hyps]
    assert [hyps[0] for hyps in nbest] == translator.translate(lines, beam=3)
    # one string is one sentence
    assert translator.translate(lines[0]) == translator.translate(lines[:1])


def test_a_checkpoint_loads_from_another_directory(work: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the checkpoint names its dataset relative to where it was trained; it is found from elsewhere
    monkeypatch.chdir(tmp_path)
    translator = structnmt.load(work / CHECKPOINT, device="cpu")
    assert translator.dataset_dir.resolve() == (work / "demo" / "dataset").resolve()
    assert translator.info["step"] == 30


def test_attention_maps_of_every_layer_and_head(here: Path) -> None:
    translator = structnmt.load(CHECKPOINT, device="cpu")
    source = (here / "demo/data/test.src").read_text(encoding="utf-8").splitlines()[0]
    maps = translator.attention(source)
    assert maps.target == translator.translate([source])[0]  # the translation `translate` gives
    pieces = translator.preprocessor.subwords
    n_src = len(pieces["src"].encode(source)[0]) + 1
    assert maps.source_tokens[-1] == "</s>" and len(maps.source_tokens) == n_src
    assert maps.target_tokens[0] == "<s>"
    n_tgt = len(maps.target_tokens)
    assert maps.encoder.shape == (2, 4, n_src, n_src) and maps.encoder.dtype == np.float32
    assert maps.decoder.shape == (2, 4, n_tgt, n_tgt)
    assert maps.cross.shape == (2, 4, n_tgt, n_src)
    for array in (maps.encoder, maps.decoder, maps.cross):  # probabilities over the keys
        assert np.allclose(array.sum(-1), 1.0, atol=1e-4) and array.min() >= 0.0
    assert float(np.abs(np.triu(maps.decoder, 1)).max()) == 0.0  # the decoder never looks ahead
    assert maps.encoder[0, 0].std() > 0  # not uniform: the model attends somewhere

    reference = (here / "demo/data/test.tgt").read_text(encoding="utf-8").splitlines()[0]
    given = translator.attention(source, reference)
    assert given.target == reference
    assert given.target_tokens == ["<s>"] + [pieces["tgt"].piece(int(i)) for i in pieces["tgt"].encode(reference)[0]]
    assert given.cross.shape == (2, 4, len(given.target_tokens), n_src)
    assert np.allclose(given.encoder, maps.encoder)  # the encoder does not see the target


def test_score_is_the_log_probability_greedy_search_reports(here: Path) -> None:
    from structnmt.data.batching import collate_examples
    from structnmt.model.search import greedy_search

    translator = structnmt.load(CHECKPOINT, device="cpu")
    sources = (here / "demo/data/test.src").read_text(encoding="utf-8").splitlines()[:4]
    pre = translator.preprocessor
    batch = collate_examples(pre.encode_sources(sources, with_structure=False), {"src": set(), "tgt": set()})
    found = [hyps[0] for hyps in greedy_search(translator.model, batch, 0.0, 1.5, 10)]
    texts = translator.translate(sources, beam=1)
    for hyp, text in zip(found, texts):  # the greedy output reads back as the same ids
        assert pre.subwords["tgt"].encode(text)[0].tolist() == hyp.tokens
    scores = translator.score(sources, texts)
    assert scores == pytest.approx([h.logprob for h in found], rel=1e-4, abs=1e-4)
    per_token = translator.score(sources, texts, normalise=True)
    assert per_token == pytest.approx([s / (len(h.tokens) + 1) for s, h in zip(scores, found)], rel=1e-4)
    with pytest.raises(DataError, match="4 sources but 3 references"):
        translator.score(sources, texts[:3])


# ---------------------------------------------------------------------------
# testing and scoring


def test_evaluate_scores_ribes_from_the_command_line_as_from_python(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    hyps = ["the cat sat on the mat .", "a dog runs in the park ."]
    refs = ["the cat sat on a mat .", "a dog runs through the park ."]
    _write(tmp_path / "h.txt", "".join(h + "\n" for h in hyps))
    _write(tmp_path / "r.txt", "".join(r + "\n" for r in refs))
    code, out, _ = cli(capsys, "evaluate", "--hyp", str(tmp_path / "h.txt"), "--ref", str(tmp_path / "r.txt"),
                       "--metrics", "bleu", "ribes")
    ribes = structnmt.evaluate(hyps, refs, metrics="ribes")["ribes"]
    assert code == 0 and 50.0 < ribes < 100.0  # word order kept, some words differ
    assert f"RIBES = {ribes:.2f}   nltk.corpus_ribes" in out


def test_test_and_evaluate_give_the_cli_scores(here: Path, capsys: pytest.CaptureFixture) -> None:
    scores = structnmt.test("demo/run", splits=["test"], device="cpu")
    hyp, ref = here / "demo/run/eval/test.hyp", here / "demo/run/eval/test.ref"
    assert set(scores) >= {"test"} and scores["test"]["sentences"] == 12
    code, out, _ = cli(capsys, "evaluate", "--hyp", str(hyp), "--ref", str(ref), "--allow-empty")
    assert code == 0
    assert f"BLEU = {scores['test']['bleu']:.2f}" in out
    from_files = structnmt.evaluate(hyp, ref, allow_empty=True)
    hyps, refs = hyp.read_text().splitlines(), ref.read_text().splitlines()
    from_lists = structnmt.evaluate(hyps, refs, allow_empty=True)
    assert from_files["bleu"] == from_lists["bleu"] == scores["test"]["bleu"]
    # two references: a list of files (Path) or of sentence lists
    assert structnmt.evaluate(hyps, [refs, hyps], allow_empty=True)["bleu"] == \
        structnmt.evaluate(hyp, [ref, hyp], allow_empty=True)["bleu"]
    assert structnmt.evaluate(hyps, [refs, hyps], allow_empty=True)["bleu"] == pytest.approx(100.0)


def test_inspect_align_reads_talp_gold_as_pharaoh(here: Path, capsys: pytest.CaptureFixture) -> None:
    pharaoh = here / "demo/data/test.align"
    talp = here / "gold.talp"
    talp.write_text("".join(" ".join(f"{int(i) + 1}-{int(j) + 1}" for i, j in (t.split("-") for t in line.split()))
                            + "\n" for line in pharaoh.read_text().splitlines()))
    as_pharaoh = structnmt.inspect("demo/run", "align", gold=pharaoh, out=here / "inspect")
    as_talp = structnmt.inspect("demo/run", "align", gold=talp, gold_format="talp", out=here / "inspect")
    recognised = structnmt.inspect("demo/run", "align", gold=talp, out=here / "inspect")
    assert as_pharaoh == as_talp == recognised
    assert 0.0 <= as_pharaoh["grow_diag_final"]["aer"] <= 1.0 and as_pharaoh["sentences"] == 12
    code, out, err = cli(capsys, "inspect", "align", "demo/run", "--gold", str(talp), "--gold-format", "talp",
                         "--out", "inspect")
    assert code == 0, err
    assert '"aer": ' in out


def test_inspect_align_against_gold_files_equals_the_prepared_split(here: Path, capsys) -> None:
    """Without a dataset: the test files and their gold links give the prepared split's scores
    (the synthetic task's words are its whitespace words)."""
    gold = here / "demo/data/test.align"
    split = structnmt.inspect("demo/run", "align", gold=gold, out=here / "inspect")
    files = structnmt.inspect("demo/run", "align", gold=gold, src="demo/data/test.src", tgt="demo/data/test.tgt",
                              out=here / "inspect_gold")
    assert {k: files[k] for k in split} == split and files["sentences"] == 12
    assert (here / "inspect_gold" / "test.align").read_text() == (here / "inspect" / "test.align").read_text()
    short = here / "short.tgt"
    short.write_text("".join((here / "demo/data/test.tgt").read_text().splitlines(keepends=True)[:5]))
    code, _, err = cli(capsys, "inspect", "align", "demo/run", "--src", "demo/data/test.src", "--tgt", str(short),
                       "--gold", str(gold))
    assert code == 2 and "short.tgt: 5 lines of targets for 12 sentences" in err


def test_a_gold_conllu_sentence_is_its_text_or_its_surface_tokens() -> None:
    from structnmt.evaluation.inspect_gold import _gold_text

    block = "# text = Il va au marché.\n1\tIl\n2\tva\n3-4\tau\n3\tà\n4\tle\n5\tmarché\n6\t.\n"
    assert _gold_text(block, moses=False) == "Il va au marché."
    assert _gold_text(block, moses=True) == "Il va au marché ."  # a multi-word token once, as written


def test_inspect_trees_against_a_conllu_file_equals_the_prepared_split(here: Path, capsys) -> None:
    """A DBSA head on both sides held against the test split's CoNLL-U trees given as files:
    the same trees and UAS as against the trees the dataset stored from those files."""
    overrides = {**TINY, "training.max_steps": 10, "training.out_dir": "dbsa_run",
                 "model.methods": [{"name": "dbsa", "stack": ["encoder", "decoder"], "heads": [0]}]}
    structnmt.train("configs/demo.yaml", overrides)
    for side, extra in (("src", {}), ("tgt", {"src": "demo/data/test.src"})):
        split = structnmt.inspect("dbsa_run", "trees", side=side, out=here / "inspect")
        files = structnmt.inspect("dbsa_run", "trees", side=side, conllu=f"demo/data/test.{side}.conllu",
                                  out=here / "inspect_gold", **extra)
        assert files["uas"] == split["uas"] and files["sentences"] == split["sentences"] == 12
        assert files["merged_words"] == 0 and files["right_branching_uas"] == split["right_branching_uas"]
        assert (here / "inspect_gold" / f"test.{side}.heads").read_text() == \
            (here / "inspect" / f"test.{side}.heads").read_text()
    code, out, err = cli(capsys, "inspect", "trees", "dbsa_run", "--side", "tgt", "--conllu",
                         "demo/data/test.tgt.conllu")
    assert code == 2 and "give --src FILE" in err


def test_inspect_heads_scores_every_encoder_head_against_the_stored_trees(here: Path, capsys) -> None:
    import json

    found = structnmt.inspect("demo/run", "heads", out=here / "inspect")
    layers = len(found["accuracy"])
    assert layers == 2 and len(found["best_head_per_layer"]) == layers and found["sentences"] == 12
    for best in found["best_head_per_layer"]:
        row = found["accuracy"][best["layer"] - 1]
        assert best["accuracy"] == max(row) == row[best["head"] - 1]
    assert found["best_offset"] != 0 and 0.0 < found["best_offset_accuracy"] <= 1.0
    assert json.loads((here / "inspect" / "test.heads.json").read_text()) == found
    code, _, err = cli(capsys, "inspect", "heads", "demo/run", "--side", "tgt", "--out", "inspect")
    assert code == 2 and "side" in err


def test_inspect_builds_the_tree_distances_a_deps_san_model_needs(here: Path) -> None:
    """``dist`` is computed at collate time from stored word_index and heads, never stored: the
    inspect batches once dropped it, and a Deps-SAN (or UDISCAL, SASA) model failed with KeyError."""
    from structnmt.config import ModelConfig
    from structnmt.data.dataset import ParallelDataset
    from structnmt.evaluation.inspect_run import inspect_split
    from structnmt.model.transformer import Transformer

    cfg = ModelConfig(enc_layers=2, dec_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                      methods=[{"name": "deps_san", "layers": [1], "heads": "all", "variance": 1.0}])
    model = Transformer(cfg, 1100, 1100)
    found = inspect_split(model, ParallelDataset(here / "demo" / "dataset", "test"), "heads", here / "inspect_ds")
    assert found["sentences"] == 12 and len(found["accuracy"]) == 2


# ---------------------------------------------------------------------------
# every error of the command line is an exception of the API


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def _truncated(tmp: Path) -> str:
    data = Path(CHECKPOINT).read_bytes()
    (tmp / "cut.pt").write_bytes(data[: len(data) // 2])
    return str(tmp / "cut.pt")


def _bad_talp(tmp: Path) -> str:
    return _write(tmp / "gold.talp", "1-1\n" * 11 + "1-99\n")


#: case -> (setup(tmp) -> (API call, command line)), the exception and a part of its message
ERROR_CASES: dict[str, tuple[Callable[[Path], tuple[Callable[[], object], list[str]]], type, str]] = {
    "config_not_found": (lambda t: (lambda: structnmt.train("missing.yaml"), ["train", "missing.yaml"]),
                         ConfigError, "missing.yaml: config file not found"),
    "bad_override": (lambda t: (lambda: structnmt.train("configs/demo.yaml", {"model.n_heads": 5}),
                                ["train", "configs/demo.yaml", "--set", "model.n_heads=5"]),
                     ConfigError, "configs/demo.yaml: model.n_heads: n_heads (5) must divide d_model (32)"),
    "method_layer_past_depth": (
        lambda t: (lambda: structnmt.prepare("configs/demo.yaml", ["model.methods=[{name: pascal, layers: [9]}]"]),
                   ["prepare", "configs/demo.yaml", "--set", "model.methods=[{name: pascal, layers: [9]}]"]),
        ConfigError, "model.methods[0].layers: layer 9 is outside the encoder's layers 1..2"),
    "no_data_section": (lambda t: (lambda: structnmt.prepare(str(t / "c.yaml")),
                                   ["prepare", _write(t / "c.yaml", "model: {d_model: 64}\n")]),
                        ConfigError, "data: this config has no data section"),
    "no_run_directory": (lambda t: (lambda: structnmt.test("no_run"), ["test", "no_run"]),
                         DataError, "no_run: no such run directory"),
    "a_checkpoint_for_the_run": (lambda t: (lambda: structnmt.test(CHECKPOINT), ["test", CHECKPOINT]),
                                 DataError, f"{CHECKPOINT}: is a file, not a run folder: give the run's folder "
                                            "(demo/run), and this file as its checkpoint (--checkpoint; "
                                            "checkpoint= in Python)"),
    "no_checkpoint": (lambda t: (lambda: structnmt.test("demo/run", checkpoint="demo/run/nope.pt"),
                                 ["test", "demo/run", "--checkpoint", "demo/run/nope.pt"]),
                      CheckpointError, "demo/run/nope.pt: no such checkpoint"),
    "truncated_checkpoint": (lambda t: (lambda: structnmt.load(str(t / "cut.pt")),
                                        ["translate", "--checkpoint", _truncated(t), "--input", "in.txt"]),
                             CheckpointError, "truncated checkpoint"),
    "not_a_checkpoint": (lambda t: (lambda: structnmt.average(["configs/demo.yaml"], t / "avg.pt"),
                                    ["average", "configs/demo.yaml", "--out", str(t / "avg.pt")]),
                         CheckpointError, "configs/demo.yaml: not a structnmt checkpoint"),
    "not_a_device": (lambda t: (lambda: structnmt.load(CHECKPOINT, device="gpu0"),
                                ["translate", "--checkpoint", CHECKPOINT, "--input", "in.txt", "--device", "gpu0"]),
                     ConfigError, "device: not a device: 'gpu0'"),
    "impossible_beam": (lambda t: (lambda: structnmt.load(CHECKPOINT, "cpu").translate(["a"], beam=0),
                                   ["translate", "--checkpoint", CHECKPOINT, "--input", "in.txt", "--beam", "0",
                                    "--device", "cpu"]),
                        ConfigError, "beam: must be at least 1, got 0"),
    "hypotheses_and_references_differ": (
        lambda t: (lambda: structnmt.evaluate(Path(t / "h.txt"), Path(t / "r.txt")),
                   ["evaluate", "--hyp", _write(t / "h.txt", "a\nb\n"), "--ref", _write(t / "r.txt", "a\nb\nc\n")]),
        DataError, "2 hypothesis lines but 3 lines in reference"),
    "empty_hypothesis": (lambda t: (lambda: structnmt.evaluate(Path(t / "h.txt"), Path(t / "r.txt")),
                                    ["evaluate", "--hyp", _write(t / "h.txt", "a\n\n"),
                                     "--ref", _write(t / "r.txt", "a\nb\n")]),
                         DataError, "h.txt:2: empty hypothesis line"),
    "inspect_without_gold": (lambda t: (lambda: structnmt.inspect("demo/run", "align", out=t),
                                        ["inspect", "align", "demo/run", "--out", str(t)]),
                             DataError, "give --gold FILE"),
    "inspect_trees_of_a_plain_model": (lambda t: (lambda: structnmt.inspect("demo/run", "trees", out=t),
                                                  ["inspect", "trees", "demo/run", "--out", str(t)]),
                                       ConfigError, "the model has no dbsa/sisa/syncattn layer on the src side"),
    "gold_link_outside_the_sentence": (
        lambda t: (lambda: structnmt.inspect("demo/run", "align", gold=t / "gold.talp", gold_format="talp", out=t),
                   ["inspect", "align", "demo/run", "--gold", _bad_talp(t), "--gold-format", "talp", "--out", str(t)]),
        DataError, "gold.talp:12: link '1-99' is outside the sentence"),
    "attention_line_outside_the_split": (
        lambda t: (lambda: structnmt.plot_attention(CHECKPOINT, t / "a.png", line=99),
                   ["plot", "attention", "--checkpoint", CHECKPOINT, "--line", "99", "--out", str(t / "a.png")]),
        DataError, "line 99 is outside 1..12"),
    "attention_of_an_empty_sentence": (
        lambda t: (lambda: structnmt.plot_attention(CHECKPOINT, t / "a.png", sentence="  "),
                   ["plot", "attention", "--checkpoint", CHECKPOINT, "--sentence", "  ", "--out", str(t / "a.png")]),
        ConfigError, "sentence: the sentence is empty: there is no attention to draw"),
    "attention_layer_outside_the_model": (
        lambda t: (lambda: structnmt.plot_attention(CHECKPOINT, t / "a.png", line=1, layer=7),
                   ["plot", "attention", "--checkpoint", CHECKPOINT, "--line", "1", "--layer", "7",
                    "--out", str(t / "a.png")]),
        ConfigError, "layer: layer 7 is outside 1..2"),
    "study_file_not_found": (lambda t: (lambda: structnmt.run_study("nope.yaml"), ["study", "nope.yaml"]),
                             ConfigError, "nope.yaml: study file not found"),
    "parser_without_files": (lambda t: (lambda: structnmt.train_parser(lang="en"), ["parser", "train", "--lang", "en"]),
                             ConfigError, "conllu: missing"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_each_cli_error_is_the_api_exception(case: str, here: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    setup, kind, message = ERROR_CASES[case]
    (here / "in.txt").write_text("a b c\n", encoding="utf-8")
    call, argv = setup(tmp_path)
    code, _, err = cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    with pytest.raises(kind) as raised:
        call()
    assert type(raised.value) is kind  # the exact class, not only some StructNMTError
    assert message in str(raised.value)
    # the same message, naming the option where the API names its argument (--beam: / beam:)
    assert re.sub(r"^error: --([a-z-]+): ", lambda m: f"error: {m[1].replace('-', '_')}: ", lines[0]) == \
        f"error: {raised.value}"
    # and where the API names an argument the user gave on the command line as an option, the
    # command line names that option (`--layer: ...`, not `layer: ...`)
    first = re.match(r"([a-z_]+): ", str(raised.value))
    if first and f"--{first[1].replace('_', '-')}" in argv:
        assert lines[0].startswith(f"error: --{first[1].replace('_', '-')}: "), lines[0]
    assert not (tmp_path / "avg.pt").exists() and not (tmp_path / "a.png").exists()


# ---------------------------------------------------------------------------
# the README


def test_the_readme_python_section_runs(here: Path, capsys: pytest.CaptureFixture) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    assert namespace["summary"]["status"] == "max_steps" and namespace["summary"]["step"] == 10
    assert namespace["maps"].encoder.shape[:2] == (2, 4)
    assert len(namespace["hypotheses"]) == 8 and "max_steps" in out
    assert (here / "demo/more/eval/test.hyp").exists()
