"""Supervised heads against gold CoNLL-U trees, beside the parser's UAS on the same sentences
(``structnmt inspect trees --conllu GOLD --parser-uas``, ``studies/gold_readouts.py``).

A tiny DBSA model of the synthetic task (heads in layers 1 and 2 of both stacks) is read
against hand-written CoNLL-U files whose UAS figures are worked out by hand; the "parsers" are
spaCy pipelines whose one component writes a known tree (the gold one, or a chain), so their UAS
is known exactly. No ../shared data is read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import structnmt
from structnmt.cli.main import main
from structnmt.errors import ConfigError, DataError, ParserError

pytestmark = pytest.mark.slow  # one tiny model is trained for the module

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model.d_model": 32, "model.d_ff": 64, "model.enc_layers": 2, "model.dec_layers": 2,
        "training.max_steps": 10, "training.valid_every": 10, "training.warmup": 5, "training.lr": 5e-3,
        "training.max_tokens": 512, "training.tensorboard": False, "training.threads": 2,
        "training.valid_bleu": False, "data.subwords.vocab_size": 400, "decoding.beam": 1,
        "model.methods": [{"name": "dbsa", "stack": ["encoder", "decoder"], "layers": [1, 2], "heads": [0]}]}


def _row(i: int, form: str, head: int | str, rel: str = "dep") -> str:
    return f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_"


# Sentence A: 5 words, heads (0-based, root itself) [1, 2, 2, 2, 2]. Right-branching [0, 0, 1, 2, 3] gets
# word 3 right (1 of 5); left-branching [1, 2, 3, 4, 4] gets words 0 and 1 (2 of 5).
SENT_A = ("the rabbit draws brother .",
          [_row(1, "the", 2), _row(2, "rabbit", 3), _row(3, "draws", 0, "root"), _row(4, "brother", 3),
           _row(5, ".", 3)])
# Sentence B: its gold words do not match its own text ("dog" where the text says "pig"): dropped.
SENT_B = ("a cold pig smiles .",
          [_row(1, "a", 3), _row(2, "cold", 3), _row(3, "dog", 4), _row(4, "smiles", 0, "root"), _row(5, ".", 4)])
# Sentence C: the multi-word token "nextto" (next + to) is one unit of 7; "next" attaches to "clock", so
# the unit does. Units' heads [1, 2, 2, 5, 5, 2, 2]: right-branching [0, 0, 1, 2, 3, 4, 5] gets none,
# left-branching [1, 2, 3, 4, 5, 6, 6] gets words 0, 1 and 4 (3 of 7).
SENT_C = ("my father laughs nextto the clock .",
          [_row(1, "my", 2), _row(2, "father", 3), _row(3, "laughs", 0, "root"),
           "4-5\tnextto\t_\t_\t_\t_\t_\t_\t_\t_", _row(4, "next", 7, "case"), _row(5, "to", 4, "fixed"),
           _row(6, "the", 7), _row(7, "clock", 3), _row(8, ".", 3)])
# Sentence D: SentencePiece's NFKC turns "´" into a space and a combining accent, leaving an empty
# piece inside the word "´m" (EWT test has such a sentence); the piece joins that word, so the tree
# projects. The multi-word token "I´m" is one unit of 6: units' heads [3, 3, 3, 3, 3, 3];
# right-branching gets word 4, left-branching word 2 (1 of 6 each).
SENT_D = ("hi I´m from the clock .",
          [_row(1, "hi", 5), "2-3\tI´m\t_\t_\t_\t_\t_\t_\t_\t_", _row(2, "I", 5), _row(3, "´m", 5),
           _row(4, "from", 5), _row(5, "the", 0, "root"), _row(6, "clock", 5), _row(7, ".", 5)])
#: over the 18 words of A, C and D
RIGHT_BRANCHING, LEFT_BRANCHING = 2 / 18, 6 / 18


def write_conllu(path: Path, sentences: list[tuple[str, list[str]]]) -> Path:
    path.write_text("".join(f"# sent_id = s{k}\n# text = {text}\n" + "\n".join(rows) + "\n\n"
                            for k, (text, rows) in enumerate(sentences, start=1)), encoding="utf-8")
    return path


def chain_parser(kind: str, gold: Path | None = None):
    """A spaCy pipeline whose one component writes a known tree: ``right`` or ``left``
    branching over the words it is given, or ``gold``: the tree of the sentence with those
    words in ``gold`` (so it fails loudly if it is given another sentence's words)."""
    import spacy
    from spacy.language import Language
    from spacy.tokens import Doc

    from structnmt.parsers.ud_train import read_conllu

    table = {tuple(s.words): s.heads for s in read_conllu(gold)} if gold is not None else {}
    name = f"test_tree_{kind}_{id(table)}"

    @Language.component(name)
    def component(doc):
        n = len(doc)
        words = [t.text for t in doc]
        if kind == "gold":
            heads = table[tuple(words)]
        elif kind == "right":
            heads = [0] + list(range(n - 1))
        else:
            heads = [i + 1 for i in range(n - 1)] + [n - 1]
        return Doc(doc.vocab, words=words, spaces=[bool(t.whitespace_) for t in doc], heads=heads, deps=["dep"] * n)

    nlp = spacy.blank("xx")
    nlp.add_pipe(name)
    return nlp


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gold_readouts")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        scores = structnmt.demo("demo", minutes=0, train_size=300, seed=3, overrides=TINY, verbose=False,
                                valid_size=8, test_size=12)
    assert scores["summary"]["status"] == "max_steps"
    write_conllu(root / "gold.conllu", [SENT_A, SENT_B, SENT_C, SENT_D])
    return root


@pytest.fixture
def translator(work: Path):
    return structnmt.load(work / "demo" / "run" / "last.pt", device="cpu")


def test_the_parser_is_scored_on_exactly_the_heads_sentences_and_words(work: Path, translator) -> None:
    from structnmt.evaluation.inspect_gold import inspect_trees_gold

    gold = work / "gold.conllu"
    echo = inspect_trees_gold(translator, gold, work / "out", parser_uas=True, parser=chain_parser("gold", gold))
    assert echo["parser_uas"] == 1.0  # the gold trees, projected as the gold ones are
    assert (echo["sentences"], echo["words"], echo["file_sentences"], echo["merged_words"]) == (3, 18, 4, 0)
    assert echo["syntactic_words"] == 20  # "nextto" and "I´m" are two syntactic words each, one unit
    assert echo["right_branching_uas"] == pytest.approx(RIGHT_BRANCHING)
    assert echo["left_branching_uas"] == pytest.approx(LEFT_BRANCHING)
    reasons = echo["dropped"]["reasons"]
    assert echo["dropped"]["sentences"] == 1 and set(reasons) == {"gold_text"}
    assert reasons["gold_text"]["lines"] == [9] and "'dog' does not match the text" in reasons["gold_text"]["first"][0]
    assert echo["parser"]["match"] == "unknown" and echo["side"] == "src" and echo["layer"] == 1
    # the head's trees and the parser's: one line per scored sentence, the same words
    heads = (work / "out" / "gold.heads").read_text().splitlines()
    parsed = (work / "out" / "gold.parser.heads").read_text().splitlines()
    assert [len(h.split()) for h in heads] == [len(p.split()) for p in parsed] == [5, 7, 6]
    assert (work / "out" / "gold.lines").read_text().split() == ["1", "17", "29"]
    assert parsed == ["1 2 2 2 2", "1 2 2 5 5 2 2", "3 3 3 3 3 3"]
    assert json.loads((work / "out" / "gold.trees.json").read_text()) == echo
    # chains over the parser's words (the syntactic words "next", "to" of C) come out as chains over
    # the units, so they score what the baselines score
    right = inspect_trees_gold(translator, gold, work / "out", parser_uas=True, parser=chain_parser("right"))
    left = inspect_trees_gold(translator, gold, work / "out", parser_uas=True, parser=chain_parser("left"))
    assert right["parser_uas"] == pytest.approx(RIGHT_BRANCHING)
    assert left["parser_uas"] == pytest.approx(LEFT_BRANCHING)
    assert right["uas"] == left["uas"] == echo["uas"]  # the parser changes nothing of the head's figure


def test_target_side_trees_without_sources_only_where_the_head_cannot_read_them(work: Path, translator) -> None:
    """A decoder head in layer 1 attends before any cross-attention: empty sources give the trees the
    real sources give (checked on every call). In layer 2 the source reaches the head: refused."""
    from structnmt.evaluation.inspect_gold import inspect_trees_gold

    gold, sources = work / "demo" / "data" / "test.tgt.conllu", work / "demo" / "data" / "test.src"
    echo = chain_parser("gold", gold)
    without = inspect_trees_gold(translator, gold, work / "tgt", side="tgt", without_src=True, parser_uas=True,
                                 parser=echo)
    given = inspect_trees_gold(translator, gold, work / "tgt_src", side="tgt", src=sources, parser_uas=True,
                               parser=echo)
    assert without["uas"] == given["uas"] and without["parser_uas"] == given["parser_uas"] == 1.0
    assert without["sentences"] == 12 and without["dropped"]["sentences"] == 0
    assert (work / "tgt" / "test.tgt.heads").read_text() == (work / "tgt_src" / "test.tgt.heads").read_text()
    assert "empty sources" in without["reads"] and 0.0 < without["causal_reach"] < 1.0
    with pytest.raises(DataError, match="the tgt head reads the source"):
        inspect_trees_gold(translator, gold, work / "tgt2", side="tgt", layer=1, without_src=True)
    assert inspect_trees_gold(translator, gold, work / "tgt2", side="tgt", layer=1, src=sources)["layer"] == 2
    with pytest.raises(DataError, match="give --src FILE"):
        inspect_trees_gold(translator, gold, work / "tgt2", side="tgt")


def test_the_datasets_own_parser_and_how_another_stands_to_it(work: Path, translator, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser comes from the run's dataset; a stored-parse dataset (the demo's) has none to run.
    A given parser is matched against the recorded one: same files, same recipe, or other."""
    import spacy

    from structnmt.config import ParserConfig
    from structnmt.data.identity import parser_identity, parser_recipe_identity
    from structnmt.evaluation.inspect_gold import inspect_trees_gold, run_parser

    with pytest.raises(ConfigError, match="has the conllu back end on the src side: give the parser"):
        inspect_trees_gold(translator, work / "gold.conllu", work / "out", parser_uas=True)
    model = tmp_path / "model"
    spacy.blank("en").to_disk(model)
    identity = parser_identity(ParserConfig(backend="spacy", model=str(model)))
    recipe = parser_recipe_identity(str(model))
    for recorded, match in (({"digest": identity["digest"]}, "exact"),
                            ({"digest": "0" * 64, "recipe": recipe}, "same recipe"),
                            ({"digest": "0" * 64, "recipe": {**recipe, "max_steps": 2500}}, "other")):
        monkeypatch.setattr("structnmt.data.dataset.read_meta",  # what the dataset recorded
                            lambda _dir, r=recorded: {"inputs": {"parsers": {"src": r}}})
        _, about = run_parser(translator, "src", str(model))
        assert about["match"] == match and about["digest"] == identity["digest"]
    with pytest.raises(ParserError, match="not on this machine"):
        run_parser(translator, "src", str(tmp_path / "parsers" / "en_ud" / "model-best"))


def test_the_command_line_and_the_study_script(work: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(work)
    right = chain_parser("right")
    right.to_disk(tmp_path / "right")  # its component is registered in this process, so it loads
    code = main(["inspect", "trees", "demo/run", "--conllu", "gold.conllu", "--parser", str(tmp_path / "right"),
                 "--out", "cli"])
    out, err = capsys.readouterr()
    assert code == 0, err
    scores = json.loads(out)
    assert scores["parser_uas"] == pytest.approx(RIGHT_BRANCHING) and scores["parser"]["match"] == "other"
    code = main(["inspect", "trees", "demo/run", "--parser-uas", "--out", "cli"])
    assert code == 2 and "go with trees --conllu GOLD" in capsys.readouterr().err

    sys.path.insert(0, str(ROOT / "studies"))
    try:
        import gold_readouts
    finally:
        sys.path.remove(str(ROOT / "studies"))
    code = gold_readouts.main(["demo/run", "--gold", "en=gold.conllu", "--gold", "xx=demo/data/test.tgt.conllu",
                               "--parser", f"en={tmp_path / 'right'}", "--out", "table.md",
                               "--inspect-dir", "readouts"])
    text = (work / "table.md").read_text()
    rows = json.loads((work / "table.json").read_text())
    # the target side has no parser to run (stored parses) and says so; the source side is scored
    assert code == 1 and [row["side"] for row in rows] == ["src", "tgt"]
    assert rows[0]["parser_uas"] == pytest.approx(RIGHT_BRANCHING) and rows[0]["sentences"] == 3
    assert "give the parser" in rows[1]["error"]
    assert f"| {100 * RIGHT_BRANCHING:.2f} |" in text and "3 of 4 (1)" in text and "not scored" in text
    assert "structnmt inspect trees demo/run --side src --conllu" in text and "1 gold_text (lines 9" in text
