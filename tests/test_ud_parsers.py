"""UD parser training and scoring: CoNLL-U reading, UAS/LAS arithmetic, a tiny spaCy training run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import spacy
from spacy.language import Language
from spacy.tokens import Doc

from structnmt.data.example import DepTree
from structnmt.errors import ConfigError, DataError, ParserError
from structnmt.parsers import evaluate_parser, read_conllu, score_trees, train_ud_parser

SHARED = Path(__file__).resolve().parents[2] / "shared"

# Hand-written English trees: "word/UPOS/head/deprel", heads 1-based with 0 for the root (CoNLL-U).
TINY = """\
The/DET/2/det cat/NOUN/3/nsubj sleeps/VERB/0/root ./PUNCT/3/punct
A/DET/2/det dog/NOUN/3/nsubj barks/VERB/0/root loudly/ADV/3/advmod ./PUNCT/3/punct
The/DET/2/det man/NOUN/3/nsubj sees/VERB/0/root the/DET/5/det dog/NOUN/3/obj ./PUNCT/3/punct
She/PRON/2/nsubj reads/VERB/0/root a/DET/4/det book/NOUN/2/obj ./PUNCT/2/punct
We/PRON/2/nsubj like/VERB/0/root green/ADJ/4/amod apples/NOUN/2/obj ./PUNCT/2/punct
The/DET/2/det kids/NOUN/3/nsubj play/VERB/0/root in/ADP/6/case the/DET/6/det park/NOUN/3/obl ./PUNCT/3/punct
He/PRON/2/nsubj gave/VERB/0/root her/PRON/2/iobj a/DET/6/det red/ADJ/6/amod ball/NOUN/2/obj ./PUNCT/2/punct
My/PRON/2/nmod:poss sister/NOUN/3/nsubj lives/VERB/0/root in/ADP/5/case Paris/PROPN/3/obl ./PUNCT/3/punct
They/PRON/2/nsubj eat/VERB/0/root bread/NOUN/2/obj and/CCONJ/5/cc cheese/NOUN/3/conj ./PUNCT/2/punct
The/DET/3/det old/ADJ/3/amod car/NOUN/4/nsubj stopped/VERB/0/root ./PUNCT/4/punct
I/PRON/2/nsubj saw/VERB/0/root a/DET/5/det small/ADJ/5/amod bird/NOUN/2/obj ./PUNCT/2/punct
You/PRON/3/nsubj can/AUX/3/aux swim/VERB/0/root fast/ADV/3/advmod ./PUNCT/3/punct
The/DET/2/det boy/NOUN/3/nsubj writes/VERB/0/root on/ADP/6/case the/DET/6/det board/NOUN/3/obl ./PUNCT/3/punct
Birds/NOUN/2/nsubj fly/VERB/0/root south/ADV/2/advmod in/ADP/5/case winter/NOUN/2/obl ./PUNCT/2/punct
She/PRON/3/nsubj quickly/ADV/3/advmod opened/VERB/0/root the/DET/5/det door/NOUN/3/obj ./PUNCT/3/punct
The/DET/2/det train/NOUN/3/nsubj arrives/VERB/0/root at/ADP/5/case noon/NOUN/3/obl ./PUNCT/3/punct
He/PRON/2/nsubj bought/VERB/0/root new/ADJ/4/amod shoes/NOUN/2/obj yesterday/NOUN/2/obl:tmod ./PUNCT/2/punct
The/DET/2/det girl/NOUN/6/nsubj with/ADP/5/case a/DET/5/det hat/NOUN/2/nmod smiles/VERB/0/root ./PUNCT/6/punct
We/PRON/2/nsubj walked/VERB/0/root to/ADP/5/case the/DET/5/det river/NOUN/2/obl ./PUNCT/2/punct
The/DET/2/det sun/NOUN/3/nsubj shines/VERB/0/root brightly/ADV/3/advmod today/NOUN/3/obl:tmod ./PUNCT/3/punct
"""


def conllu_text(spec: str) -> str:
    """CoNLL-U for the compact lines above; the word before a final '.' gets SpaceAfter=No."""
    blocks = []
    for n, line in enumerate(spec.strip().splitlines(), start=1):
        items = [item.split("/") for item in line.split()]
        rows = [f"# sent_id = s{n}"]
        for i, (form, upos, head, deprel) in enumerate(items, start=1):
            next_is_dot = i < len(items) and items[i][0] == "."  # items[i] is the next word
            misc = "SpaceAfter=No" if next_is_dot else "_"
            rows.append("\t".join([str(i), form, form.lower(), upos, "_", "_", head, deprel, "_", misc]))
        blocks.append("\n".join(rows) + "\n")
    return "\n".join(blocks) + "\n"


# A 10-word sentence and a prediction with known errors (1-based heads as in CoNLL-U):
# "house" attached to the verb (wrong head), "." attached to "car" (wrong head, punctuation),
# "car" labelled nsubj (right head, wrong label), "his" labelled nmod instead of nmod:poss
# (same universal relation: right for LAS).
GOLD10 = "The/DET/3/det old/ADJ/3/amod man/NOUN/7/nsubj in/ADP/6/case the/DET/6/det house/NOUN/3/nmod " \
    "sold/VERB/0/root his/PRON/9/nmod:poss car/NOUN/7/obj ./PUNCT/7/punct"
PRED10 = "The/DET/3/det old/ADJ/3/amod man/NOUN/7/nsubj in/ADP/6/case the/DET/6/det house/NOUN/7/obl " \
    "sold/VERB/0/ROOT his/PRON/9/nmod car/NOUN/7/nsubj ./PUNCT/9/punct"


def zero_based(spec: str) -> tuple[list[int], list[str]]:
    heads, labels = [], []
    for i, item in enumerate(spec.split()):
        _, _, head, label = item.split("/")
        heads.append(int(head) - 1 if head != "0" else i)
        labels.append(label)
    return heads, labels


# ---------------------------------------------------------------- reading CoNLL-U


def test_read_conllu_converts_heads_and_skips_ranges_and_empty_nodes(tmp_path: Path) -> None:
    path = tmp_path / "fr.conllu"
    path.write_text(
        "# text = Il va au marché.\n"
        "1\tIl\til\tPRON\t_\t_\t2\tnsubj\t_\t_\n"
        "2\tva\taller\tVERB\t_\t_\t0\troot\t_\t_\n"
        "3-4\tau\t_\t_\t_\t_\t_\t_\t_\t_\n"
        "3\tà\tà\tADP\t_\t_\t5\tcase\t_\t_\n"
        "4\tle\tle\tDET\t_\t_\t5\tdet\t_\t_\n"
        "5\tmarché\tmarché\tNOUN\t_\t_\t2\tobl:arg\t_\tSpaceAfter=No\n"
        "5.1\tva\taller\tVERB\t_\t_\t_\t_\t2:conj\t_\n"
        "6\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_\n"
        "\n",
        encoding="utf-8",
    )
    (s,) = read_conllu(path)
    assert s.words == ["Il", "va", "à", "le", "marché", "."]
    assert s.heads == [1, 1, 4, 4, 1, 1]  # 0-based, the root (va) points to itself
    assert s.deprels[4] == "obl:arg"
    assert s.spaces == [True, True, False, True, False, True]  # "à" sits inside "au"
    assert s.upos[-1] == "PUNCT"
    assert s.line == 1


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("2\tsleeps\tsleep\tVERB\t_\t_\tx\troot\t_\t_", "head"),
        ("2\tsleeps\tsleep\tVERB\t_\t_\t0\troot\t_", "10 tab-separated"),
        ("2\tsleeps\tsleep\tVERB\t_\t_\t7\troot\t_\t_", "outside"),
        ("3\tsleeps\tsleep\tVERB\t_\t_\t0\troot\t_\t_", "out of order"),
    ],
)
def test_read_conllu_bad_line_names_file_and_line(tmp_path: Path, row: str, needle: str) -> None:
    path = tmp_path / "bad.conllu"
    good = conllu_text("The/DET/2/det cat/NOUN/0/root")
    path.write_text(good + "# sent_id = x\n1\tCats\tcat\tNOUN\t_\t_\t2\tnsubj\t_\t_\n" + row + "\n\n")
    with pytest.raises(DataError, match=needle) as info:
        read_conllu(path)
    assert info.value.path == str(path)
    assert info.value.line == 7  # the bad word's line: sentence 1 on lines 1-3, blank 4, then 5-7


def test_read_conllu_two_roots_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "roots.conllu"
    path.write_text(conllu_text("The/DET/0/root cat/NOUN/0/root"))
    with pytest.raises(DataError, match="2 roots") as info:
        read_conllu(path)
    assert info.value.line == 1
    with pytest.raises(DataError, match="not found"):
        read_conllu(tmp_path / "absent.conllu")


# ---------------------------------------------------------------- scoring


def test_score_trees_perfect_and_known_errors() -> None:
    gold_heads, gold_labels = zero_based(GOLD10)
    pred_heads, pred_labels = zero_based(PRED10)
    punct = [label == "punct" for label in gold_labels]

    perfect = score_trees(gold_heads, gold_labels, gold_heads, gold_labels, punct)
    assert perfect["uas"] == perfect["las"] == perfect["uas_no_punct"] == perfect["las_no_punct"] == 1.0

    s = score_trees(gold_heads, gold_labels, pred_heads, pred_labels, punct)
    assert (s["words"], s["words_no_punct"]) == (10, 9)
    assert s["uas"] == pytest.approx(8 / 10)
    assert s["uas_no_punct"] == pytest.approx(8 / 9)
    # Labels compared as given: "root"/"ROOT" and "nmod:poss"/"nmod" count as wrong here.
    assert s["las"] == pytest.approx(5 / 10)
    assert s["las_no_punct"] == pytest.approx(5 / 9)


def test_score_trees_unlabelled_concatenated_and_empty() -> None:
    # Two sentences concatenated word by word; heads are within-sentence indices.
    gold = [1, 1, 0, 0, 1]
    pred = [1, 1, 1, 0, 0]
    s = score_trees(gold, None, pred, None)
    assert s["uas"] == pytest.approx(3 / 5) and s["las"] is None and s["words_no_punct"] == 5
    s = score_trees([0], None, [0], None, [True])
    assert math.isnan(s["uas_no_punct"])
    with pytest.raises(ValueError):
        score_trees([0, 1], None, [0], None)


# ---------------------------------------------------------------- evaluate_parser with an oracle

ORACLE: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}


@Language.component("structnmt_test_oracle")
def oracle(doc: Doc) -> Doc:
    """Sets the heads and labels stored for the doc's words: a 'parser' with known output."""
    heads, labels = ORACLE[tuple(t.text for t in doc)]
    spaces = [bool(t.whitespace_) for t in doc]
    return Doc(doc.vocab, words=[t.text for t in doc], spaces=spaces, heads=heads, deps=labels)


def oracle_nlp(predictions: list[str]) -> Language:
    ORACLE.clear()
    for spec in predictions:
        heads, labels = zero_based(spec)
        ORACLE[tuple(item.split("/")[0] for item in spec.split())] = (heads, labels)
    nlp = spacy.blank("en")
    nlp.add_pipe("structnmt_test_oracle")
    return nlp


def test_evaluate_parser_gold_against_itself_and_known_errors(tmp_path: Path, capsys) -> None:
    gold = tmp_path / "gold.conllu"
    first = TINY.splitlines()[2]
    gold.write_text(conllu_text(GOLD10 + "\n" + first))

    s = evaluate_parser(oracle_nlp([GOLD10, first]), gold)
    assert s["uas"] == s["las"] == s["uas_no_punct"] == s["las_no_punct"] == 1.0
    assert "UAS 100.00" in capsys.readouterr().out

    s = evaluate_parser(oracle_nlp([PRED10, first]), gold, quiet=True)
    n, n_punct = 10 + 6, 2
    assert (s["words"], s["words_no_punct"], s["sentences"]) == (n, n - n_punct, 2)
    assert s["uas"] == pytest.approx((n - 2) / n)
    assert s["uas_no_punct"] == pytest.approx((n - n_punct - 1) / (n - n_punct))
    # Universal relations: ROOT = root and nmod = nmod:poss; only "car"'s label is wrong.
    assert s["las"] == pytest.approx((n - 3) / n)
    assert s["las_no_punct"] == pytest.approx((n - n_punct - 2) / (n - n_punct))


def test_evaluate_parser_missing_model(tmp_path: Path) -> None:
    gold = tmp_path / "gold.conllu"
    gold.write_text(conllu_text(GOLD10))
    with pytest.raises(ParserError, match="cannot load"):
        evaluate_parser(tmp_path / "no-such-model", gold)


# ---------------------------------------------------------------- training


def test_train_ud_parser_tiny_run_gives_loadable_ud_model(tmp_path: Path) -> None:
    train = tmp_path / "tiny.conllu"
    train.write_text(conllu_text(TINY), encoding="utf-8")
    best = train_ud_parser("en", [train], None, tmp_path / "out", max_steps=8, eval_frequency=4, seed=1)
    assert best == tmp_path / "out" / "model-best"
    meta = json.loads((best / "meta.json").read_text())
    assert meta["convention"] == "UD" and meta["name"] == "ud" and meta["lang"] == "en"
    assert meta["version"] and meta["structnmt"]["train_sentences"] == 18  # 2 of 20 held out
    assert meta["structnmt"]["dev_sentences"] == 2

    nlp = spacy.load(best)
    assert nlp.pipe_names == ["tok2vec", "tagger", "parser"]
    for text in ["The dog sees a bird.", "We walked to the park in winter.", "She reads."]:
        doc = nlp(text)
        assert doc.has_annotation("DEP")
        for sent in doc.sents:
            roots = [t for t in sent if t.head.i == t.i]
            assert len(roots) == 1
            tree = DepTree(
                text=sent.text,
                words=[t.text for t in sent],
                spans=[(t.idx - sent.start_char, t.idx - sent.start_char + len(t)) for t in sent],
                heads=[t.head.i - sent.start for t in sent],
                labels=[t.dep_ for t in sent],
            )
            tree.check()

    scores = evaluate_parser(best, train, quiet=True)
    assert scores["words"] == sum(len(line.split()) for line in TINY.splitlines())
    assert 0.0 <= scores["las"] <= scores["uas"] <= 1.0


def test_train_ud_parser_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lang"):
        train_ud_parser("xx-nonsense", [tmp_path / "a.conllu"], None, tmp_path / "out")
    with pytest.raises(DataError, match="not found"):
        train_ud_parser("en", [tmp_path / "a.conllu"], None, tmp_path / "out")


def test_train_ud_parser_names_the_bad_count(tmp_path: Path) -> None:
    for kwargs, field in (({"max_steps": 0}, "max_steps"), ({"eval_frequency": 0}, "eval_frequency"),
                          ({"threads": 0}, "threads")):
        with pytest.raises(ConfigError, match=f"^{field}: must be at least 1"):
            train_ud_parser("en", [tmp_path / "a.conllu"], None, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_dev_split_holds_out_every_tenth_sentence_or_reads_the_dev_file(tmp_path: Path) -> None:
    from structnmt.parsers.ud_train import _train_and_dev

    train = tmp_path / "tiny.conllu"
    train.write_text(conllu_text(TINY), encoding="utf-8")
    everything = read_conllu(train)
    kept, held = _train_and_dev([train], None)
    assert held == [everything[9], everything[19]] and len(kept) == 18 and everything[9] not in kept
    dev = tmp_path / "dev.conllu"
    dev.write_text(conllu_text("\n".join(TINY.splitlines()[:3])), encoding="utf-8")
    kept, held = _train_and_dev([train], dev)
    assert len(kept) == 20 and [s.words for s in held] == [s.words for s in read_conllu(dev)]


def test_parser_train_names_its_options_as_typed(tmp_path: Path, capsys) -> None:
    from structnmt.cli.main import main

    for argv, said in ((["--steps", "-5"], "--steps: must be at least 1, got -5"),
                       (["--eval-frequency", "0"], "--eval-frequency: must be at least 1, got 0")):
        code = main(["parser", "train", "--lang", "en", "--conllu", str(tmp_path / "a.conllu"),
                     "--out", str(tmp_path / "out"), *argv])
        err = capsys.readouterr().err
        assert code == 2 and err == f"error: {said}\n"
    assert not (tmp_path / "out").exists()


def test_parser_train_from_python_names_its_arguments(tmp_path: Path) -> None:
    """The checks the command line shares, named as the Python caller wrote them."""
    import structnmt

    for kwargs, said in (({"steps": -5}, "steps: must be at least 1, got -5"),
                         ({"eval_frequency": 0}, "eval_frequency: must be at least 1, got 0"),
                         ({"conllu": None}, "conllu: missing (give it or use a preset)")):
        arguments = {"lang": "en", "conllu": [tmp_path / "a.conllu"], "out": tmp_path / "out", **kwargs}
        with pytest.raises(ConfigError, match=f"^{re.escape(said)}$"):
            structnmt.train_parser(**arguments)
    assert not (tmp_path / "out").exists()
