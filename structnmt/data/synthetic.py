"""The built-in demo task: a small dependency grammar translated into a head-final language.

Why a synthetic task: ``structnmt demo`` must run the whole pipeline on two CPU cores with
no parser, data file or network, and the analyses (UAS of supervised heads, AER of
cross-attention, UF of induced trees) need *gold* answers to be scored against. Here every
pair comes with them, because the pair was generated from them.

The source language is English-like (SVO, determiners and adjectives before the noun,
prepositions, relative clauses "that ..." after the noun, coordination). The target
language is a deterministic word-by-word translation into a different order, so that a
model must learn structure, not just a lexicon:

==================== ========================== ===========================================
phrase               source                     target
==================== ========================== ===========================================
clause               subj verb obj obl          subj obl obj verb           (verb-final)
noun phrase          det adj* noun pp rel       rel pp det noun adj*        (adjectives mirrored)
prepositional phrase prep np                    np postposition
relative clause      that verb obj obl          obl obj verb REL
coordination         x and y                    x AND y
==================== ========================== ===========================================

The lexicon is 1:1 except for a few cases that keep alignments from being a permutation:
multi-word prepositions ("next to", "because of": 2:1), light verbs translated as a stem
plus an auxiliary (1:2), and the indefinite article "a", which has no translation (1:0).
All source words are simple English words chosen for this file; all target words are
invented from syllables by a fixed-seed generator. No third-party text is involved.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structnmt.data.example import DepTree
from structnmt.io import atomic_open

MIN_LEN, MAX_LEN = 4, 25  # source words per sentence, the final full stop included
MAX_DEPTH = 2  # how deep noun phrases may nest (PP inside NP, relative clause inside NP)

# ---------------------------------------------------------------------------
# lexicon

DETERMINERS = ["the", "a", "this", "every", "some", "my", "your", "our"]
NOUNS = list(dict.fromkeys("""
dog cat man woman child teacher farmer king queen bird horse fish house tree river garden
city road table chair book letter ship boat car train door window hill forest cloud stone
apple bread cake doctor student baker singer painter sailor soldier friend mother father
sister brother girl boy lion mouse rabbit fox wolf bear owl frog duck goat sheep cow pig
village market school bridge tower lake field island mountain kitchen garden lamp basket
box bell drum clock coat hat shoe cup
""".split()))
ADJECTIVES = """
big small old young red green blue happy sad tall short quiet loud clever lazy brave kind
angry hungry tired rich poor strange famous white black yellow warm cold dark bright gentle
proud busy lucky shy wild calm sweet wise
""".split()
TRANSITIVE = """
sees likes finds follows helps watches calls visits knows loves hears carries pushes pulls
paints builds catches chases feeds meets remembers forgets greets teaches wants holds opens
closes cleans washes draws reads writes buys sells brings takes leaves kicks touches
""".split()
INTRANSITIVE = """
sleeps runs sings dances laughs cries waits swims walks jumps smiles works falls sits
shouts rests plays hides dreams arrives
""".split()
PREPOSITIONS = """
in on near under behind with from without above beside into across toward around
""".split()
MULTIWORD_PREPOSITIONS = [("next", "to"), ("out", "of"), ("because", "of"), ("instead", "of")]
CLAUSE_CONJUNCTIONS = ["and", "but"]
NP_CONJUNCTIONS = ["and", "or"]
LIGHT_VERB_EVERY = 6  # every sixth verb is translated as a stem plus the auxiliary

# target function words (the lexical ones are invented below)
TGT_REL = "ne"
TGT_AUX = "su"
TGT_CONJ = {"and": "ka", "but": "demo", "or": "ya"}
FULL_STOP = "."


def _invent_words(n: int, seed: int, taken: set[str]) -> list[str]:
    """Pronounceable invented words (CV syllables, sometimes a final n), all distinct."""
    rng = random.Random(seed)
    onsets = "b d f g h k l m n p r s t v z".split()
    vowels = "a e i o u".split()
    out: list[str] = []
    while len(out) < n:
        syllables = rng.choice((2, 2, 3))
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(syllables))
        if rng.random() < 0.25:
            word += "n"
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def _build_lexicon() -> dict[str, list[str]]:
    """Source word (or multi-word preposition joined by a space) -> its target words."""
    src_words = (DETERMINERS + NOUNS + ADJECTIVES + TRANSITIVE + INTRANSITIVE + PREPOSITIONS
                 + [" ".join(p) for p in MULTIWORD_PREPOSITIONS])
    src_words = list(dict.fromkeys(src_words))  # drop repeats, keep the order
    taken = set(src_words) | {TGT_REL, TGT_AUX, FULL_STOP, *TGT_CONJ.values()}
    invented = _invent_words(len(src_words), seed=20240601, taken=taken)
    lexicon = {word: [tgt] for word, tgt in zip(src_words, invented)}
    lexicon["a"] = []  # the indefinite article is not translated
    for i, verb in enumerate(TRANSITIVE + INTRANSITIVE):
        if i % LIGHT_VERB_EVERY == LIGHT_VERB_EVERY - 1:
            lexicon[verb] = lexicon[verb] + [TGT_AUX]
    for conj, tgt in TGT_CONJ.items():
        lexicon[conj] = [tgt]
    lexicon[FULL_STOP] = [FULL_STOP]
    return lexicon


LEXICON = _build_lexicon()

# ---------------------------------------------------------------------------
# the abstract sentence: words (translation units) arranged in phrases


class _Word:
    """One translation unit: its source and target words, and its place in the tree."""

    def __init__(self, src: str, upos: str, tgt_upos: str | None = None) -> None:
        self.src_forms = src.split(" ")
        self.tgt_forms = list(LEXICON[src]) if src != "that" else [TGT_REL]
        self.upos = upos
        self.tgt_upos = tgt_upos or upos
        self.head: _Word | None = None  # None: the root
        self.label = "root"
        self.tgt_label = "root"

    def attach(self, head: _Word, label: str, tgt_label: str | None = None) -> None:
        self.head, self.label, self.tgt_label = head, label, tgt_label or label


@dataclass
class _NP:
    noun: _Word
    det: _Word
    adjs: list[_Word]
    pp: _PP | None = None
    rel: _Clause | None = None


@dataclass
class _CoordNP:
    first: _NP
    cc: _Word
    second: _NP

    @property
    def noun(self) -> _Word:
        return self.first.noun


@dataclass
class _PP:
    prep: _Word
    np: _NP


@dataclass
class _Clause:
    verb: _Word
    subj: _NP | None  # None in a relative clause: the relativiser stands for the subject
    obj: _NP | _CoordNP | None
    obl: _PP | None
    relativiser: _Word | None = None


@dataclass
class _Sentence:
    clauses: list[_Clause]
    ccs: list[_Word]
    stop: _Word


class _Grammar:
    """Draws sentences; the probabilities keep sentences short and the task learnable."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def word(self, src: str, upos: str, tgt_upos: str | None = None) -> _Word:
        return _Word(src, upos, tgt_upos)

    def np(self, depth: int) -> _NP:
        r = self.rng
        noun = self.word(r.choice(NOUNS), "NOUN")
        det = self.word(r.choice(DETERMINERS), "DET")
        det.attach(noun, "det")
        n_adj = r.choices((0, 1, 2), weights=(0.6, 0.3, 0.1))[0]
        adjs = [self.word(a, "ADJ") for a in r.sample(ADJECTIVES, n_adj)]
        for adj in adjs:
            adj.attach(noun, "amod")
        phrase = _NP(noun, det, adjs)
        if depth < MAX_DEPTH and r.random() < 0.2:
            phrase.pp = self.pp(depth + 1)
            phrase.pp.np.noun.attach(noun, "nmod")
        if depth < MAX_DEPTH and r.random() < 0.15:
            phrase.rel = self.clause(depth + 1, relative=True)
            phrase.rel.verb.attach(noun, "acl:relcl")
        return phrase

    def pp(self, depth: int) -> _PP:
        r = self.rng
        if r.random() < 0.15:
            prep = self.word(" ".join(r.choice(MULTIWORD_PREPOSITIONS)), "ADP")
        else:
            prep = self.word(r.choice(PREPOSITIONS), "ADP")
        phrase = _PP(prep, self.np(depth))
        prep.attach(phrase.np.noun, "case")
        return phrase

    def clause(self, depth: int, relative: bool = False) -> _Clause:
        r = self.rng
        transitive = r.random() < 0.65
        verb = self.word(r.choice(TRANSITIVE if transitive else INTRANSITIVE), "VERB")
        subj = relativiser = None
        if relative:
            relativiser = self.word("that", "PRON", tgt_upos="PART")
            relativiser.attach(verb, "nsubj", tgt_label="mark")
        else:
            subj = self.np(depth)
            subj.noun.attach(verb, "nsubj")
        obj: _NP | _CoordNP | None = None
        if transitive:
            obj = self.np(depth)
            if depth == 0 and r.random() < 0.1:
                cc = self.word(r.choice(NP_CONJUNCTIONS), "CCONJ")
                second = self.np(MAX_DEPTH)  # keep the coordinated phrase flat
                cc.attach(second.noun, "cc")
                second.noun.attach(obj.noun, "conj")
                obj = _CoordNP(obj, cc, second)
            obj.noun.attach(verb, "obj")
        obl = None
        if r.random() < (0.3 if transitive else 0.6):
            obl = self.pp(depth + 1 if relative else depth)
            obl.np.noun.attach(verb, "obl")
        return _Clause(verb, subj, obj, obl, relativiser)

    def sentence(self) -> _Sentence:
        clauses = [self.clause(0)]
        ccs: list[_Word] = []
        if self.rng.random() < 0.15:
            cc = self.word(self.rng.choice(CLAUSE_CONJUNCTIONS), "CCONJ")
            second = self.clause(0)
            cc.attach(second.verb, "cc")
            second.verb.attach(clauses[0].verb, "conj")
            clauses.append(second)
            ccs.append(cc)
        stop = self.word(FULL_STOP, "PUNCT")
        stop.attach(clauses[0].verb, "punct")
        return _Sentence(clauses, ccs, stop)


# ---------------------------------------------------------------------------
# linearisation: one function per language; each phrase returns its words in order and
# records itself as a bracket (the word objects it spans)

_Phrase = list[_Word]


class _Linearizer:
    def __init__(self, target: bool) -> None:
        self.target = target
        self.phrases: list[_Phrase] = []

    def keep(self, words: _Phrase) -> _Phrase:
        self.phrases.append(words)
        return words

    def np(self, p: _NP | _CoordNP) -> _Phrase:
        if isinstance(p, _CoordNP):
            return self.keep(self.np(p.first) + [p.cc] + self.np(p.second))
        pp = self.pp(p.pp) if p.pp else []
        rel = self.clause(p.rel) if p.rel else []
        if self.target:
            return self.keep(rel + pp + [p.det, p.noun] + p.adjs[::-1])
        return self.keep([p.det] + p.adjs + [p.noun] + pp + rel)

    def pp(self, p: _PP) -> _Phrase:
        np = self.np(p.np)
        return self.keep(np + [p.prep] if self.target else [p.prep] + np)

    def clause(self, c: _Clause) -> _Phrase:
        obj = self.np(c.obj) if c.obj else []
        obl = self.pp(c.obl) if c.obl else []
        vp = self.keep(obl + obj + [c.verb] if self.target else [c.verb] + obj + obl)
        if c.relativiser is not None:
            return self.keep(vp + [c.relativiser] if self.target else [c.relativiser] + vp)
        return self.keep(self.np(c.subj) + vp)  # type: ignore[arg-type]

    def sentence(self, s: _Sentence) -> _Phrase:
        words = self.clause(s.clauses[0])
        for cc, clause in zip(s.ccs, s.clauses[1:]):
            words = words + [cc] + self.clause(clause)
        return self.keep(words + [s.stop])


# ---------------------------------------------------------------------------
# public API


@dataclass
class SyntheticPair:
    """One generated sentence pair with its gold structures (all word indices 0-based)."""

    src: str
    tgt: str
    src_tree: DepTree
    tgt_tree: DepTree
    alignment: list[tuple[int, int]]  # sure links (source word, target word)
    src_brackets: list[tuple[int, int]]  # phrases of the grammar, (start, end) end exclusive
    tgt_brackets: list[tuple[int, int]]
    src_upos: list[str] = field(default_factory=list)
    tgt_upos: list[str] = field(default_factory=list)


def _realise(sent: _Sentence, target: bool) -> tuple[DepTree, list[str], list[tuple[int, int]], list[int]]:
    """Words in order -> (tree, UPOS tags, brackets, translation unit of each word)."""
    lin = _Linearizer(target)
    units = lin.sentence(sent)
    forms: list[str] = []
    upos: list[str] = []
    owner: list[int] = []  # which unit (position in ``units``) each word belongs to
    first: dict[int, int] = {}  # id(unit) -> its first word (the head of multi-word units)
    for u, unit in enumerate(units):
        unit_forms = unit.tgt_forms if target else unit.src_forms
        for k, form in enumerate(unit_forms):
            if k == 0:
                first[id(unit)] = len(forms)
            forms.append(form)
            upos.append((unit.tgt_upos if target else unit.upos) if k == 0 else
                        ("AUX" if target else "ADP"))
            owner.append(u)
    heads: list[int] = []
    labels: list[str] = []
    for i, u in enumerate(owner):
        unit = units[u]
        if first[id(unit)] != i:  # a later word of a multi-word unit
            heads.append(first[id(unit)])
            labels.append("aux" if target else "fixed")
            continue
        head = unit.head
        while head is not None and id(head) not in first:  # the head has no words on this side
            head = head.head
        heads.append(i if head is None else first[id(head)])
        labels.append(unit.tgt_label if target else unit.label)
    if not target:  # "a" becomes "an" before a vowel, as in English
        forms = ["an" if f == "a" and i + 1 < len(forms) and forms[i + 1][0] in "aeiou" else f
                 for i, f in enumerate(forms)]
    text = " ".join(forms)
    spans, pos = [], 0
    for form in forms:
        spans.append((pos, pos + len(form)))
        pos += len(form) + 1
    tree = DepTree(text, forms, spans, heads, labels, parser="synthetic-gold")
    word_ids = {id(unit): [i for i, o in enumerate(owner) if units[o] is unit] for unit in units}
    brackets = set()
    for phrase in lin.phrases:
        positions = [i for unit in phrase for i in word_ids[id(unit)]]
        if len(positions) >= 2:
            start, end = min(positions), max(positions) + 1
            assert end - start == len(positions), "a phrase must be contiguous"
            brackets.add((start, end))
    return tree, upos, sorted(brackets, key=lambda b: (b[0], -b[1])), [id(units[o]) for o in owner]


def _pair(sent: _Sentence) -> SyntheticPair:
    src_tree, src_upos, src_brackets, src_units = _realise(sent, target=False)
    tgt_tree, tgt_upos, tgt_brackets, tgt_units = _realise(sent, target=True)
    alignment = [(i, j) for i, su in enumerate(src_units) for j, tu in enumerate(tgt_units) if su == tu]
    return SyntheticPair(src_tree.text, tgt_tree.text, src_tree, tgt_tree, alignment,
                         src_brackets, tgt_brackets, src_upos, tgt_upos)


def generate_pairs(
    n: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()
) -> list[SyntheticPair]:
    """``n`` pairs drawn with ``random.Random(seed)``: the same seed gives the same pairs.

    Sentences outside ``MIN_LEN..MAX_LEN`` source words, or whose source is in ``exclude``
    (a held-out split), are drawn again.
    """
    grammar = _Grammar(random.Random(seed))
    pairs: list[SyntheticPair] = []
    while len(pairs) < n:
        sent = grammar.sentence()
        n_words = sum(len(u.src_forms) for u in _Linearizer(False).sentence(sent))
        if not MIN_LEN <= n_words <= MAX_LEN:
            continue
        pair = _pair(sent)
        if pair.src not in exclude:
            pairs.append(pair)
    return pairs


def to_conllu(tree: DepTree, upos: list[str], sent_id: str) -> str:
    """One sentence block of CoNLL-U (1-based heads, 0 for the root), ending in a blank line."""
    lines = [f"# sent_id = {sent_id}", f"# text = {tree.text}"]
    for i, (form, head, label) in enumerate(zip(tree.words, tree.heads, tree.labels)):
        tag = upos[i] if i < len(upos) else "X"
        head_1 = 0 if head == i else head + 1
        glued = i + 1 < len(tree.words) and tree.spans[i][1] == tree.spans[i + 1][0]
        misc = "SpaceAfter=No" if glued else "_"
        lines.append("\t".join([str(i + 1), form, form, tag, "_", "_", str(head_1), label, "_", misc]))
    return "\n".join(lines) + "\n\n"


DEFAULT_SIZES = {"train": 20000, "val": 500, "test": 500}
FILE_KINDS = ("src", "tgt", "src.conllu", "tgt.conllu", "align", "src.brackets", "tgt.brackets")


def split_seed(seed: int, split: str) -> int:
    """A different, stable seed per split (crc32, not ``hash``: that changes between runs)."""
    return seed * 1_000_003 + zlib.crc32(split.encode("utf-8"))


def write_task(
    out_dir: Path, sizes: dict[str, int] | None = None, seed: int = 1
) -> dict[str, dict[str, Path]]:
    """Write every split's text, gold CoNLL-U, alignments and brackets; return their paths.

    Held-out splits are drawn first and the training split avoids their source sentences,
    so that test BLEU measures translation, not memory.
    """
    out_dir = Path(out_dir)
    sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
    order = [s for s in sizes if s != "train"] + [s for s in sizes if s == "train"]
    seen: set[str] = set()
    paths: dict[str, dict[str, Path]] = {}
    for split in order:
        pairs = generate_pairs(sizes[split], split_seed(seed, split), exclude=seen)
        if split != "train":
            seen.update(p.src for p in pairs)
        paths[split] = {kind: out_dir / f"{split}.{kind}" for kind in FILE_KINDS}
        _write_split(pairs, split, paths[split])
    return {split: paths[split] for split in sizes}


def _write_split(pairs: list[SyntheticPair], split: str, paths: dict[str, Path]) -> None:
    def lines(make) -> str:
        return "".join(make(p) + "\n" for p in pairs)

    def conllu_blocks(side: str) -> str:
        return "".join(to_conllu(getattr(p, f"{side}_tree"), getattr(p, f"{side}_upos"), f"{split}-{k}")
                       for k, p in enumerate(pairs, 1))

    texts = {
        "src": lines(lambda p: p.src),
        "tgt": lines(lambda p: p.tgt),
        "align": lines(lambda p: " ".join(f"{i}-{j}" for i, j in p.alignment)),
        "src.brackets": lines(lambda p: json.dumps([list(b) for b in p.src_brackets])),
        "tgt.brackets": lines(lambda p: json.dumps([list(b) for b in p.tgt_brackets])),
        "src.conllu": conllu_blocks("src"),
        "tgt.conllu": conllu_blocks("tgt"),
    }
    for kind, text in texts.items():
        with atomic_open(paths[kind]) as handle:
            handle.write(text)


# ---------------------------------------------------------------------------
# the demo experiment


def demo_config(work_dir: Path, minutes: float) -> dict[str, Any]:
    """The demo's experiment config (a plain dict, as a YAML file would give it).

    Files live under ``work_dir``: the generated task in ``data/``, the prepared dataset in
    ``dataset/``, the training run in ``run/``. ``configs/demo.yaml`` is this dict for
    ``work_dir = "demo"`` and ``minutes = 3``.
    """
    work_dir = Path(work_dir)
    data = work_dir / "data"
    splits = ("train", "val", "test")

    def side(name: str, lang: str, scenes: str) -> dict[str, Any]:
        return {
            "lang": lang,
            "parser": {
                "backend": "conllu",
                "conllu": {s: str(data / f"{s}.{name}.conllu") for s in splits},
                "convention": "ud",
            },
            "scenes": scenes,
        }

    return {
        "data": {
            "src": side("src", "en", "dependency"),
            "tgt": side("tgt", "xx", "none"),
            "splits": {s: {"src": str(data / f"{s}.src"), "tgt": str(data / f"{s}.tgt")} for s in splits},
            "dir": str(work_dir / "dataset"),
            "train_split": "train",
            "valid_split": "val",
            "moses": False,
            # ~430 word types in all: 1000 BPE pieces keep 98% of words whole (unigram cannot
            # reach that size on so small a lexicon: SentencePiece refuses more than ~360 pieces)
            "subwords": {"kind": "sentencepiece", "model_type": "bpe", "vocab_size": 1000, "joint": True},
        },
        "model": {
            "enc_layers": 3,
            "dec_layers": 3,
            "d_model": 128,  # small enough for ~500 updates in three CPU-minutes
            "n_heads": 4,
            "d_ff": 512,
            "dropout": 0.1,
            "norm": "pre",
            "share_embeddings": True,
            "tie_output": True,
        },
        "training": {
            "out_dir": str(work_dir / "run"),
            "seed": 1,
            "max_tokens": 2048,
            "max_minutes": float(minutes),
            "lr": 2e-3,
            "warmup": 300,
            "clip_norm": 1.0,
            "label_smoothing": 0.1,
            "valid_every": 300,
            "valid_bleu": True,
            "valid_beam": 1,
            "keep_last": 1,
            "log_every": 50,
        },
        "decoding": {"beam": 5, "length_penalty": 0.6, "max_len_a": 1.5, "max_len_b": 10},
    }
