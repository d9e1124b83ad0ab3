"""Scenes from dependency trees and from UCCA XML passages."""

from __future__ import annotations

from pathlib import Path

import pytest

from structnmt.data.example import DepTree, Scenes
from structnmt.data.scenes import align_ucca_to_tree, clause_heads, derive_scenes, read_ucca_passage
from structnmt.errors import DataError

UD_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud" / "en_ewt-ud-dev.conllu"


def make_tree(words: list[str], heads: list[int], labels: list[str]) -> DepTree:
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return DepTree(" ".join(words), words, spans, heads, labels)


def by_scene(scenes: Scenes) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in scenes.parent]
    for word, scene in scenes.members:
        out[scene].append(word)
    return out


def test_relative_clause_noun_is_in_both_scenes() -> None:
    #            I        saw     the    dog    that      barked
    t = make_tree(["I", "saw", "the", "dog", "that", "barked"], [1, 1, 3, 1, 5, 3],
                  ["nsubj", "root", "det", "obj", "nsubj", "acl:relcl"])
    scenes = derive_scenes(t)
    assert scenes.source == "dependency"
    assert scenes.parent == [-1, 0]
    assert by_scene(scenes) == [[0, 1, 2, 3], [3, 4, 5]]


def test_conj_of_clause_starts_a_scene_but_conj_of_noun_does_not() -> None:
    verbs = make_tree(["I", "came", "and", "saw"], [1, 1, 3, 1], ["nsubj", "root", "cc", "conj"])
    assert by_scene(derive_scenes(verbs)) == [[0, 1], [2, 3]]
    nouns = make_tree(["dogs", "and", "cats", "bark"], [3, 2, 0, 3], ["nsubj", "cc", "conj", "root"])
    s = derive_scenes(nouns)
    assert s.parent == [-1] and by_scene(s) == [[0, 1, 2, 3]]


def test_coordinated_nouns_under_a_nominal_root_share_its_scene() -> None:
    # UD parse of "A man and a woman sitting on a bench": "man" is the root (a caption with no
    # main verb), "woman" its conj, "sitting" an acl of "man". Two scenes: the root's and the
    # sitting's, which shares "man"; "woman" opens none (it did under a "conj of any clause
    # head" rule, which this pins down).
    words = ["A", "man", "and", "a", "woman", "sitting", "on", "a", "bench"]
    t = make_tree(words, [1, 1, 4, 4, 1, 1, 8, 8, 5],
                  ["det", "root", "cc", "det", "conj", "acl", "case", "det", "obl"])
    assert clause_heads(t) == [False, True, False, False, False, True, False, False, False]
    s = derive_scenes(t)
    assert s.parent == [-1, 0]
    assert by_scene(s) == [[0, 1, 2, 3, 4], [1, 5, 6, 7, 8]]


@pytest.mark.parametrize(("words", "heads", "labels", "scene_heads"), [
    # a conjunct with its own predicate dependent (obl) is a scene
    (["dogs", "run", "and", "jump", "in", "snow"], [1, 1, 3, 1, 5, 3],
     ["nsubj", "root", "cc", "conj", "case", "obl"], [1, 3]),
    # a bare conjunct of a verb is a verb: "a man sits and smiles"
    (["a", "man", "sits", "and", "smiles"], [1, 2, 2, 4, 2], ["det", "nsubj", "root", "cc", "conj"], [2, 4]),
    # a copular predicate's conjunct is a state: "he is tall and thin"
    (["he", "is", "tall", "and", "thin"], [2, 2, 2, 4, 2], ["nsubj", "cop", "root", "cc", "conj"], [2, 4]),
    # a conjunct with a determiner is a noun, even under a verb: "a man holds a cup and a plate"
    (["man", "holds", "a", "cup", "and", "a", "plate"], [1, 1, 3, 1, 6, 6, 1],
     ["nsubj", "root", "det", "obj", "cc", "det", "conj"], [1]),
    # bare nouns under a nominal root: "dogs and cats"
    (["dogs", "and", "cats"], [0, 2, 0], ["root", "cc", "conj"], [0]),
    # a conjunct with its own subject under a nominal root is a clause: "a dog , a man is running"
    (["dog", "man", "is", "running"], [0, 3, 3, 0], ["root", "nsubj", "aux", "conj"], [0, 3]),
])
def test_which_conjuncts_start_a_scene(words, heads, labels, scene_heads) -> None:
    got = clause_heads(make_tree(words, heads, labels))
    assert [i for i, h in enumerate(got) if h] == scene_heads


def test_nested_clauses_and_scene_parents() -> None:
    # "she said that he wanted to leave": said (root) -ccomp-> wanted -xcomp-> leave
    t = make_tree(["she", "said", "that", "he", "wanted", "to", "leave"], [1, 1, 4, 4, 1, 6, 4],
                  ["nsubj", "root", "mark", "nsubj", "ccomp", "mark", "xcomp"])
    s = derive_scenes(t)
    assert s.parent == [-1, 0, 1]
    assert by_scene(s) == [[0, 1], [2, 3, 4], [5, 6]]


@pytest.mark.shared
@pytest.mark.skipif(not UD_DEV.exists(), reason="../shared/data/ud is not present")
def test_real_ud_trees() -> None:
    conllu = pytest.importorskip("conllu")
    clauses = {"ccomp", "xcomp", "advcl", "acl", "parataxis"}
    n_relcl = n_multi = n_noun_conj = n_verb_conj = 0
    with open(UD_DEV, encoding="utf-8") as handle:
        for k, sentence in enumerate(conllu.parse_incr(handle)):
            if k == 300:
                break
            tokens = [t for t in sentence if isinstance(t["id"], int)]
            words = [t["form"] for t in tokens]
            heads = [t["head"] - 1 if t["head"] else t["id"] - 1 for t in tokens]
            labels = [t["deprel"] for t in tokens]
            upos = [t["upos"] for t in tokens]
            scenes = derive_scenes(make_tree(words, heads, labels))
            members = by_scene(scenes)
            # every word is in a scene; every scene holds its clause head; parents precede children
            assert {w for w, _ in scenes.members} == set(range(len(words)))
            assert all(p < s for s, p in enumerate(scenes.parent))
            expected = 1 + sum(lab.split(":")[0] in clauses for lab in labels)
            assert scenes.n_scenes >= expected
            n_multi += scenes.n_scenes > 1
            for i, lab in enumerate(labels):
                if lab == "acl:relcl":
                    n_relcl += 1
                    in_scenes = [s for s, ws in enumerate(members) if heads[i] in ws]
                    assert len(in_scenes) >= 2, (words, heads[i])
                # a word's own scene contains its head unless it heads a clause
                if lab.split(":")[0] not in clauses | {"conj", "root"}:
                    assert any(i in ws and heads[i] in ws for ws in members)
                # a conjunct with a determiner and no subject, copula or auxiliary is a noun:
                # it never starts a scene ("he is the leader" with its own nsubj and cop does)
                deps = {labels[d].split(":")[0] for d in range(len(words)) if heads[d] == i and d != i}
                has_det = "det" in deps
                if lab == "conj" and has_det and not deps & {"nsubj", "cop", "aux"}:
                    n_noun_conj += 1
                    assert any(i in ws and heads[i] in ws for ws in members), (words, i)
                head_rel = "root" if heads[heads[i]] == heads[i] else labels[heads[i]].split(":")[0]
                if lab == "conj" and upos[i] == "VERB" and not has_det and head_rel in clauses | {"root"}:
                    n_verb_conj += 1
                    assert not any(i in ws and heads[i] in ws for ws in members), (words, i)
    assert n_relcl > 5 and n_multi > 50 and n_noun_conj > 10 and n_verb_conj > 20


UCCA_XML = """<root passageID="1" annotationID="0">
  <attributes/>
  <layer layerID="0">
    <node ID="0.1" type="Word"><attributes paragraph="1" paragraph_position="1" text="I"/></node>
    <node ID="0.2" type="Word"><attributes paragraph="1" paragraph_position="2" text="saw"/></node>
    <node ID="0.3" type="Word"><attributes paragraph="1" paragraph_position="3" text="the"/></node>
    <node ID="0.4" type="Word"><attributes paragraph="1" paragraph_position="4" text="dog"/></node>
    <node ID="0.5" type="Word"><attributes paragraph="1" paragraph_position="5" text="that"/></node>
    <node ID="0.6" type="Word"><attributes paragraph="1" paragraph_position="6" text="barked"/></node>
    <node ID="0.7" type="Punctuation"><attributes paragraph="1" paragraph_position="7" text="."/></node>
  </layer>
  <layer layerID="1">
    <node ID="1.1" type="FN"><edge toID="1.2" type="H"/><edge toID="1.9" type="U"/></node>
    <node ID="1.2" type="FN"><edge toID="1.3" type="A"/><edge toID="1.4" type="P"/>
      <edge toID="1.5" type="A"/></node>
    <node ID="1.3" type="FN"><edge toID="0.1" type="Terminal"/></node>
    <node ID="1.4" type="FN"><edge toID="0.2" type="Terminal"/></node>
    <node ID="1.5" type="FN"><edge toID="1.6" type="E"/><edge toID="1.7" type="C"/>
      <edge toID="1.8" type="E"/></node>
    <node ID="1.6" type="FN"><edge toID="0.3" type="Terminal"/></node>
    <node ID="1.7" type="FN"><edge toID="0.4" type="Terminal"/></node>
    <node ID="1.8" type="FN"><edge toID="1.7" type="A"><attributes remote="True"/></edge>
      <edge toID="1.10" type="R"/><edge toID="1.11" type="P"/></node>
    <node ID="1.9" type="PNCT"><edge toID="0.7" type="Terminal"/></node>
    <node ID="1.10" type="FN"><edge toID="0.5" type="Terminal"/></node>
    <node ID="1.11" type="FN"><edge toID="0.6" type="Terminal"/></node>
  </layer>
</root>
"""


def test_read_ucca_passage(tmp_path: Path) -> None:
    path = tmp_path / "1.xml"
    path.write_text(UCCA_XML, encoding="utf-8")
    terminals, scenes = read_ucca_passage(path)
    assert terminals == ["I", "saw", "the", "dog", "that", "barked", "."]
    assert scenes.source == "ucca"
    assert scenes.parent == [-1, 0]
    # the final "." hangs from the non-scene top unit: in no scene; "dog" is shared (remote A)
    assert by_scene(scenes) == [[0, 1, 2, 3], [3, 4, 5]]


def test_align_ucca_to_tree_with_different_tokenisation(tmp_path: Path) -> None:
    path = tmp_path / "1.xml"
    path.write_text(UCCA_XML, encoding="utf-8")
    terminals, scenes = read_ucca_passage(path)
    # the parser split "barked." differently: "bark" "ed." is silly but must still line up
    tree = make_tree(["I", "saw", "the", "dog", "that", "bark", "ed."], [1, 1, 3, 1, 5, 3, 5],
                     ["nsubj", "root", "det", "obj", "nsubj", "acl:relcl", "punct"])
    aligned = align_ucca_to_tree(terminals, scenes, tree, path)
    assert by_scene(aligned) == [[0, 1, 2, 3], [3, 4, 5, 6]]
    wrong = make_tree(["I", "saw", "a", "dog", "that", "barked", "."], [1, 1, 3, 1, 5, 3, 1],
                      ["nsubj", "root", "det", "obj", "nsubj", "acl:relcl", "punct"])
    with pytest.raises(DataError, match=r"1\.xml: UCCA terminals and parsed words differ"):
        align_ucca_to_tree(terminals, scenes, wrong, path)


def test_bad_ucca_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.xml"
    path.write_text("<root><layer layerID='0'>", encoding="utf-8")
    with pytest.raises(DataError, match="broken.xml"):
        read_ucca_passage(path)
