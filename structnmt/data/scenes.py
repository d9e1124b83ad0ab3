"""Scenes for SASA / SACrA: derived from dependency trees, or read from UCCA passages.

The paper (sasa-sacra-semantics) takes scenes from a UCCA parser. Where none is installed
they are derived from the dependency tree: every clause head starts a scene (docs/structures.md
"Scenes", docs/methods_source.md "Scenes from the dependency tree"). UCCA passages a user
already has (e.g. TUPA output) are read here with the standard library and
mapped onto the words of the dependency tree, so both sources give the same ``Scenes``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import deque
from pathlib import Path

from structnmt.data.example import DepTree, Scenes
from structnmt.errors import DataError

#: UD relations (compared before any ':' subtype) whose dependent heads its own clause
CLAUSE_RELATIONS = frozenset({"ccomp", "xcomp", "advcl", "acl", "parataxis"})
#: relations whose head noun is shared with the clause (the relativised 'dog')
RELATIVE_RELATIONS = frozenset({"acl"})
#: dependents that UD attaches to predicates (verbs, copular predicates), never to nominals
PREDICATE_DEPENDENTS = frozenset({"nsubj", "csubj", "aux", "cop", "expl", "obj", "iobj", "obl",
                                  "ccomp", "xcomp", "advcl", "mark", "compound:prt"})
#: dependents that UD attaches to nominals, never to predicates
NOMINAL_DEPENDENTS = frozenset({"det", "amod", "nmod", "nummod", "case", "appos", "clf", "acl"})


def _base(label: str) -> str:
    return label.split(":", 1)[0].lower()


def _kind(label: str) -> str:
    """The relation as the dependent sets above name it: ``compound:prt`` whole, others by base."""
    return "compound:prt" if label.lower().startswith("compound:prt") else _base(label)


def _top_down(heads: list[int]) -> list[int]:
    """Words in breadth-first order from the root, so a head comes before its dependents."""
    children: list[list[int]] = [[] for _ in heads]
    root = -1
    for i, h in enumerate(heads):
        if h == i:
            root = i
        else:
            children[h].append(i)
    order, queue = [], deque([root])
    while queue:
        w = queue.popleft()
        order.append(w)
        queue.extend(children[w])
    return order


def clause_heads(tree: DepTree) -> list[bool]:
    """Which words start a scene (docs/methods_source.md, "Scenes from the dependency tree"):
    the root, dependents by a clause relation, and conjuncts of a clause head that are
    predicates themselves.

    "A conj of a verb" must be decided from the tree's relations alone: trees carry no part of
    speech (stored datasets, CoNLL-U without UPOS, every parser back end alike), and one rule
    for all keeps scenes identical however a tree was made. A conjunct is a predicate when it
    has a dependent UD gives only predicates (nsubj, aux, cop, obj, obl, mark, ...); otherwise
    when its first conjunct is a predicate and it has no dependent UD gives only nominals
    (det, amod, nmod, case, ...): "came and saw" is two scenes, "a man and a woman sitting"
    one, whether "man" is the root or not. Copular predicates count ("is tall and thin":
    UCCA's states are scenes too). docs/methods_source.md gives the agreement with UPOS.
    """
    tree.check()
    heads = list(tree.heads)
    kinds: list[set[str]] = [set() for _ in heads]
    for w, h in enumerate(heads):
        if h != w:
            kinds[h].add(_kind(tree.labels[w]))
    predicate = [False] * len(heads)
    is_head = [False] * len(heads)
    for w in _top_down(heads):
        h, rel = heads[w], _base(tree.labels[w])
        own = bool(kinds[w] & PREDICATE_DEPENDENTS)
        if rel == "conj" and h != w:
            predicate[w] = own or (predicate[h] and not kinds[w] & NOMINAL_DEPENDENTS)
        else:
            predicate[w] = own or rel in CLAUSE_RELATIONS or rel == "csubj"
        is_head[w] = h == w or rel in CLAUSE_RELATIONS or (rel == "conj" and is_head[h] and predicate[w])
    return is_head


def scenes_from_clause_heads(tree: DepTree, is_head: list[bool]) -> Scenes:
    """Each clause head's scene holds its subtree minus nested clause heads' subtrees; the
    noun an acl clause modifies is in both its own scene and the clause's. Scenes are
    numbered top-down (root scene 0), so a scene's parent always has a smaller number."""
    heads = list(tree.heads)
    order = _top_down(heads)
    scene_of: dict[int, int] = {}  # clause-head word -> scene number
    owner = [0] * len(heads)  # word -> its (primary) scene
    parent: list[int] = []
    for w in order:
        h = heads[w]
        if is_head[w] or h == w:
            scene_of[w] = len(parent)
            parent.append(-1 if h == w else owner[h])
            owner[w] = scene_of[w]
        else:
            owner[w] = owner[h]
    members = {(w, owner[w]) for w in range(len(heads))}
    for w, s in scene_of.items():
        if heads[w] != w and _base(tree.labels[w]) in RELATIVE_RELATIONS:
            members.add((heads[w], s))
    return Scenes(members=sorted(members), parent=parent, source="dependency")


def derive_scenes(tree: DepTree) -> Scenes:
    """Scenes of a UD tree (docs/structures.md "Scenes"): a scene per clause head (``clause_heads``)."""
    return scenes_from_clause_heads(tree, clause_heads(tree))


# ---------------------------------------------------------------------------
# UCCA


def _flag(elem: ET.Element, name: str) -> bool:
    attrs = elem.find("attributes")
    return attrs is not None and attrs.get(name, "").lower() in ("true", "1")


def _edge_tags(edge: ET.Element) -> set[str]:
    """An edge's categories: its ``type`` plus any ``<category tag=...>`` (UCCA >= 1.2 files)."""
    tags = {edge.get("type", "")}
    tags.update(c.get("tag", "") for c in edge.findall("category"))
    return tags - {""}


def read_ucca_passage(path: str | Path) -> tuple[list[str], Scenes]:
    """Terminals and scenes of one UCCA XML passage (the standard format TUPA writes).

    Layer 0 gives the terminals in order; layer 1 the foundational units. A unit is a scene
    if it has a P or S child or is the target of an H edge. Over primary (non-remote) edges
    a terminal belongs to its nearest scene above it; a remote edge from a scene (or from a
    unit inside one) to a unit adds that unit's terminals, outside any scene nested in it, to
    the scene as well: UCCA's way of sharing the relativised noun, matching what
    ``derive_scenes`` does. Linkage nodes (LKG) and implicit units carry no terminals and
    are skipped. Scene ``parent`` is the nearest scene above, -1 for top-level scenes.
    Member word indices are terminal positions.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as err:
        raise DataError(f"cannot read UCCA passage: {err}", path) from err
    layers = {layer.get("layerID"): layer for layer in root.iter("layer")}
    if "0" not in layers or "1" not in layers:
        raise DataError("UCCA passage needs layers 0 (terminals) and 1 (foundational units)", path)

    def id_key(node_id: str) -> tuple[int, ...]:
        try:
            return tuple(int(p) for p in node_id.split("."))
        except ValueError as err:
            raise DataError(f"malformed node ID {node_id!r}", path) from err

    terms = sorted(layers["0"].iter("node"), key=lambda n: id_key(n.get("ID", "")))
    terminal_pos = {node.get("ID"): i for i, node in enumerate(terms)}
    terminals = []
    for node in terms:
        attrs = node.find("attributes")
        text = attrs.get("text") if attrs is not None else None
        if text is None:
            raise DataError(f"terminal {node.get('ID')} has no text", path)
        terminals.append(text)

    # unit id -> list of (child id, tags, remote)
    edges: dict[str, list[tuple[str, set[str], bool]]] = {}
    for node in layers["1"].iter("node"):
        if node.get("type") == "LKG":
            continue
        edges[node.get("ID", "")] = [(e.get("toID", ""), _edge_tags(e), _flag(e, "remote"))
                                     for e in node.findall("edge")]
    for uid, out in edges.items():
        for child, _tags, _remote in out:
            if child not in edges and child not in terminal_pos:
                raise DataError(f"unit {uid} has an edge to unknown node {child!r}", path)

    is_scene = {uid: any(tags & {"P", "S"} for _c, tags, remote in out if not remote)
                for uid, out in edges.items()}
    for out in edges.values():
        for child, tags, remote in out:
            if "H" in tags and not remote and child in is_scene:
                is_scene[child] = True
    primary_parent: dict[str, str] = {}
    for uid, out in edges.items():
        for child, _tags, remote in out:
            if not remote and child in edges:
                primary_parent.setdefault(child, uid)

    def enclosing_scene(uid: str | None) -> str | None:
        seen = 0
        while uid is not None and not is_scene.get(uid, False):
            uid = primary_parent.get(uid)
            seen += 1
            if seen > len(edges):
                raise DataError("UCCA units form a cycle", path)
        return uid

    def own_terminals(uid: str) -> set[int]:
        """Terminals under ``uid`` by primary edges, not inside a scene nested below it."""
        found, stack = set(), [uid]
        while stack:
            u = stack.pop()
            for child, _tags, remote in edges.get(u, []):
                if remote:
                    continue
                if child in terminal_pos:
                    found.add(terminal_pos[child])
                elif not is_scene.get(child, False):
                    stack.append(child)
        return found

    scene_ids = sorted((u for u, s in is_scene.items() if s), key=id_key)
    number = {u: i for i, u in enumerate(scene_ids)}
    members: set[tuple[int, int]] = set()
    parent = []
    for uid in scene_ids:
        above = enclosing_scene(primary_parent.get(uid))
        parent.append(number[above] if above is not None else -1)
        members.update((t, number[uid]) for t in own_terminals(uid))
    for uid, out in edges.items():
        for child, _tags, remote in out:
            scene = enclosing_scene(uid)
            if remote and scene is not None and child in edges:
                members.update((t, number[scene]) for t in own_terminals(child))
    return terminals, Scenes(members=sorted(members), parent=parent, source="ucca")


def align_ucca_to_tree(
    terminals: list[str], scenes: Scenes, tree: DepTree, path: str | Path | None = None
) -> Scenes:
    """Re-index UCCA scenes from terminals onto the words of ``tree``.

    Terminals and words are matched in order on their characters with whitespace removed,
    so a different tokenisation ("don't" vs "do" "n't") still lines up; a word is in every
    scene of any terminal that overlaps it. Different texts raise DataError naming ``path``.
    """
    def layout(tokens: list[str]) -> tuple[str, list[tuple[int, int]]]:
        spans, pos, parts = [], 0, []
        for tok in tokens:
            tok = "".join(tok.split())
            spans.append((pos, pos + len(tok)))
            parts.append(tok)
            pos += len(tok)
        return "".join(parts), spans

    t_text, t_spans = layout(terminals)
    w_text, w_spans = layout(tree.words)
    if t_text != w_text:
        k = next((i for i, (a, b) in enumerate(zip(t_text, w_text)) if a != b), min(len(t_text), len(w_text)))
        raise DataError(f"UCCA terminals and parsed words differ near {w_text[max(0, k - 10):k + 10]!r} "
                        f"(UCCA: {t_text[max(0, k - 10):k + 10]!r})", path)
    members = set()
    for term, scene in scenes.members:
        ts, te = t_spans[term]
        for w, (ws, we) in enumerate(w_spans):
            if min(te, we) > max(ts, ws):
                members.add((w, scene))
    return Scenes(members=sorted(members), parent=list(scenes.parent), source=scenes.source)
