"""The synthetic demo task: determinism, gold structures, files and the demo config."""

from __future__ import annotations

import json
from pathlib import Path

import conllu
import pytest
import yaml

from structnmt.config import config_from_dict
from structnmt.data.synthetic import (
    LEXICON,
    MAX_LEN,
    MIN_LEN,
    MULTIWORD_PREPOSITIONS,
    SyntheticPair,
    demo_config,
    generate_pairs,
    write_task,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pairs() -> list[SyntheticPair]:
    return generate_pairs(400, seed=7)


def test_same_seed_same_pairs_other_seed_other_pairs() -> None:
    a = generate_pairs(50, seed=3)
    b = generate_pairs(50, seed=3)
    c = generate_pairs(50, seed=4)
    assert a == b
    assert [p.src for p in a] != [p.src for p in c]


def test_lengths_and_lexicon(pairs: list[SyntheticPair]) -> None:
    lengths = [len(p.src_tree) for p in pairs]
    assert min(lengths) >= MIN_LEN and max(lengths) <= MAX_LEN
    assert max(lengths) > 15  # recursion really happens
    assert len(LEXICON) >= 200
    # target words are invented: no lexical word is shared between the two languages
    src_words = {w for p in pairs for w in p.src.split()}
    tgt_words = {w for p in pairs for w in p.tgt.split()}
    assert src_words & tgt_words == {"."}


def test_trees_are_valid_and_match_the_text(pairs: list[SyntheticPair]) -> None:
    for p in pairs:
        for tree, text in ((p.src_tree, p.src), (p.tgt_tree, p.tgt)):
            tree.check()
            assert tree.text == text
            assert [text[s:e] for s, e in tree.spans] == tree.words == text.split(" ")
            assert tree.labels[tree.root] == "root"
            assert tree.words[tree.root] != "."


def test_relative_clauses_move_before_their_noun(pairs: list[SyntheticPair]) -> None:
    # "the dog that barks" -> "barks-t ne the-t dog-t": the relativiser becomes a marker after the verb
    n_rel = 0
    for pair in pairs:
        src, tgt = pair.src_tree, pair.tgt_tree
        links: dict[int, int] = {}  # source word -> its first target word (a light verb has two)
        for i, j in sorted(pair.alignment):
            links.setdefault(i, j)
        for that in (i for i, w in enumerate(src.words) if w == "that"):
            rel_verb = src.heads[that]
            noun = src.heads[rel_verb]
            assert src.labels[that] == "nsubj" and src.labels[rel_verb] == "acl:relcl"
            assert noun < that < rel_verb  # after its noun in the source ...
            assert links[rel_verb] < links[that] < links[noun]  # ... before it in the target
            assert tgt.words[links[that]] == "ne" and tgt.labels[links[that]] == "mark"
            assert tgt.heads[links[that]] == links[rel_verb] and tgt.heads[links[rel_verb]] == links[noun]
            n_rel += 1
    assert n_rel > 30


def test_target_is_verb_final(pairs: list[SyntheticPair]) -> None:
    simple = [p for p in pairs if "conj" not in p.src_tree.labels]
    assert len(simple) > 200
    for p in simple:
        src, tgt = p.src_tree, p.tgt_tree
        # source: the main verb directly follows the subject phrase, so it is rarely late;
        # target: it is the last word before the full stop (an auxiliary may follow a light verb)
        last = len(tgt) - 2
        if tgt.labels[last] == "aux":
            last = tgt.heads[last]
        assert last == tgt.root, p.tgt
        assert tgt.words[-1] == "." and src.words[-1] == "."
    late = sum(p.src_tree.root == len(p.src_tree) - 2 for p in simple)
    assert late < 0.5 * len(simple)  # intransitive clauses without modifiers only


def test_adjectives_follow_nouns_and_postpositions(pairs: list[SyntheticPair]) -> None:
    n_amod = n_case = 0
    for p in pairs:
        for tree, before in ((p.src_tree, True), (p.tgt_tree, False)):
            for i, (h, label) in enumerate(zip(tree.heads, tree.labels)):
                if label in ("amod", "case"):
                    assert (i < h) == before, (tree.text, tree.words[i])
                    n_amod += label == "amod"
                    n_case += label == "case"
    assert n_amod > 100 and n_case > 100


def _translations(word: str) -> list[str]:
    if word == "that":
        return ["ne"]
    parts = [" ".join(mw) for mw in MULTIWORD_PREPOSITIONS if word in mw]
    return [t for key in [word, *parts] for t in LEXICON.get(key, [])]


def test_alignments_in_range_and_not_monotone(pairs: list[SyntheticPair]) -> None:
    non_monotone = 0
    one_to_many = 0
    for p in pairs:
        n, m = len(p.src_tree), len(p.tgt_tree)
        assert p.alignment and all(0 <= i < n and 0 <= j < m for i, j in p.alignment)
        assert len(set(p.alignment)) == len(p.alignment)
        # every target word is aligned; the only unaligned source words are "a"/"an"
        assert {j for _, j in p.alignment} == set(range(m))
        unaligned = set(range(n)) - {i for i, _ in p.alignment}
        assert all(p.src_tree.words[i] in ("a", "an") for i in unaligned)
        # aligned words translate each other
        for i, j in p.alignment:
            assert p.tgt_tree.words[j] in _translations(p.src_tree.words[i]) + ["su"]
        targets = [j for _, j in sorted(p.alignment)]
        non_monotone += targets != sorted(targets)
        src_counts = [sum(1 for a, _ in p.alignment if a == i) for i in range(n)]
        one_to_many += max(src_counts) > 1 or len({i for i, _ in p.alignment}) < len(p.alignment)
    assert non_monotone > 0.8 * len(pairs)
    assert one_to_many > 0.05 * len(pairs)


def _check_brackets(brackets: list[tuple[int, int]], n: int) -> None:
    assert (0, n) in brackets  # the whole sentence
    for s, e in brackets:
        assert 0 <= s < e <= n and e - s >= 2
    for a in brackets:
        for b in brackets:
            disjoint = a[1] <= b[0] or b[1] <= a[0]
            nested = (a[0] <= b[0] and b[1] <= a[1]) or (b[0] <= a[0] and a[1] <= b[1])
            assert disjoint or nested, (a, b)


def test_brackets_nest_and_cover(pairs: list[SyntheticPair]) -> None:
    for p in pairs:
        _check_brackets(p.src_brackets, len(p.src_tree))
        _check_brackets(p.tgt_brackets, len(p.tgt_tree))
        # every bracket is the yield of a subtree plus nothing else (the grammar is projective)
        for tree, brackets in ((p.src_tree, p.src_brackets), (p.tgt_tree, p.tgt_brackets)):
            for s, e in brackets:
                outside_heads = [i for i in range(s, e) if not s <= tree.heads[i] < e or tree.heads[i] == i]
                assert len(outside_heads) == 1 or (s, e) == (0, len(tree)), (tree.text, s, e)


def test_known_brackets() -> None:
    pair = next(p for p in generate_pairs(300, seed=5)
                if p.src_tree.labels == ["det", "nsubj", "root", "det", "obj", "punct"]
                and p.src.split()[0] != "a" and p.src.split()[3] != "a")
    # "the dog sees the cat ." -> "the dog the cat sees ."
    assert pair.src_brackets == [(0, 6), (0, 5), (0, 2), (2, 5), (3, 5)]
    assert pair.tgt_brackets == [(0, 6), (0, 5), (0, 2), (2, 5), (2, 4)]
    assert sorted(pair.alignment) == [(0, 0), (1, 1), (2, 4), (3, 2), (4, 3), (5, 5)]


def test_write_task_files(tmp_path: Path) -> None:
    sizes = {"train": 300, "val": 40, "test": 40}
    paths = write_task(tmp_path, sizes, seed=2)
    assert set(paths) == set(sizes)
    for split, n in sizes.items():
        files = paths[split]
        for kind in ("src", "tgt", "align", "src.brackets", "tgt.brackets"):
            lines = files[kind].read_text(encoding="utf-8").splitlines()
            assert len(lines) == n, (split, kind)
        src = files["src"].read_text(encoding="utf-8").splitlines()
        tgt = files["tgt"].read_text(encoding="utf-8").splitlines()
        for side, texts in (("src", src), ("tgt", tgt)):
            sents = conllu.parse(files[f"{side}.conllu"].read_text(encoding="utf-8"))
            assert len(sents) == n
            for sent, text in zip(sents, texts):
                assert sent.metadata["text"] == text
                assert " ".join(tok["form"] for tok in sent) == text
                assert sum(tok["head"] == 0 for tok in sent) == 1
        for line, s, t in zip(files["align"].read_text().splitlines(), src, tgt):
            for link in line.split():
                i, j = map(int, link.split("-"))
                assert 0 <= i < len(s.split()) and 0 <= j < len(t.split())
        for line, s in zip(files["src.brackets"].read_text().splitlines(), src):
            _check_brackets([tuple(b) for b in json.loads(line)], len(s.split()))
    train = set(paths["train"]["src"].read_text().splitlines())
    held_out = {line for split in ("val", "test") for line in paths[split]["src"].read_text().splitlines()}
    assert not train & held_out
    # the same call writes the same bytes
    again = write_task(tmp_path / "again", sizes, seed=2)
    assert again["test"]["tgt.conllu"].read_bytes() == paths["test"]["tgt.conllu"].read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_conllu_round_trip_gives_the_trees(tmp_path: Path) -> None:
    paths = write_task(tmp_path, {"test": 60}, seed=9)
    from structnmt.data.synthetic import split_seed

    pairs = generate_pairs(60, split_seed(9, "test"))
    for side in ("src", "tgt"):
        sents = conllu.parse(paths["test"][f"{side}.conllu"].read_text(encoding="utf-8"))
        for sent, pair in zip(sents, pairs):
            tree = pair.src_tree if side == "src" else pair.tgt_tree
            heads = [tok["head"] - 1 if tok["head"] else i for i, tok in enumerate(sent)]
            assert [tok["form"] for tok in sent] == tree.words
            assert heads == tree.heads
            assert [tok["deprel"] for tok in sent] == tree.labels
            assert all(tok["upos"] in {"DET", "NOUN", "ADJ", "VERB", "ADP", "PRON", "PART", "CCONJ",
                                       "PUNCT", "AUX"} for tok in sent)


def test_demo_config_validates_and_matches_yaml(tmp_path: Path) -> None:
    raw = demo_config(tmp_path, minutes=3)
    cfg = config_from_dict(raw)
    assert cfg.training.max_minutes == 3.0
    assert cfg.data.src.parser.backend == "conllu" and cfg.data.src.scenes == "dependency"
    assert cfg.data.tgt.parser.conllu["test"] == str(tmp_path / "data" / "test.tgt.conllu")
    assert set(cfg.data.splits) == {"train", "val", "test"}
    assert cfg.decoding.beam == 5 and cfg.training.valid_beam == 1
    assert not cfg.data.moses
    shipped = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text(encoding="utf-8"))
    assert shipped == demo_config(Path("demo"), minutes=3)
    config_from_dict(shipped)
