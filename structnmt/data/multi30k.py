"""Multi30k task 1 (Elliott et al. 2016): a data config over its raw gzipped files.

Nothing is copied or decompressed: the corpus reader reads ``.gz`` directly. With
``from_dir`` (a local copy such as ``../shared/data/multi30k``) the config points at those
files; without it the files are downloaded once from the corpus's public repository (or a mirror,
:mod:`structnmt.data.download`) into ``<out>/raw``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from structnmt.config import DataConfig, dump_yaml, from_dict
from structnmt.data.download import NotFoundError, base_url, check_local_copy, fetch, mirror_checksums, url_of
from structnmt.errors import ConfigError, DataError
from structnmt.io import atomic_write_text

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
#: the splits ``train`` cannot do without (``data.train_split``, ``data.valid_split``): refused when
#: missing, where the other splits are left out with a warning
NEEDED = ("train", "val")
LANGS = ("en", "de", "fr", "cs")
URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"


def raw_dir(dataset: str | Path) -> Path:
    """Where ``prepare multi30k --out DATASET`` keeps the downloads and the data config: ``DATASET_raw``."""
    dataset = Path(dataset)
    return dataset.parent / f"{dataset.name}_raw"


def config_path(out: str | Path, pair: str) -> Path:
    """The data config :func:`build_multi30k` writes into ``out``."""
    return Path(out) / f"multi30k.{pair}.yaml"


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _languages(pair: str) -> tuple[str, str]:
    """``en-de`` as its two languages, each one Multi30k has."""
    try:
        src, tgt = pair.split("-")
    except ValueError:
        raise ConfigError(f"expected a language pair like en-de, got {pair!r}", "pair") from None
    for lang in (src, tgt):
        if lang not in LANGS:
            raise ConfigError(f"Multi30k has no {lang!r} (languages: {', '.join(LANGS)})", "pair")
    return src, tgt


def _split_files(split: str, langs: tuple[str, str], out: Path, from_dir: Path | None, base: str | None,
                 sums: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """One split's two files, from ``from_dir`` or downloaded, and the names of those not found
    (a needed split's failed download raises instead)."""
    files: dict[str, str] = {}
    missing: list[str] = []
    for side, lang in zip(("src", "tgt"), langs):
        name = f"{split}.{lang}.gz"
        if from_dir is not None:
            path = Path(from_dir) / name
            if not path.is_file():
                missing.append(name)
                continue
        else:
            try:
                path = fetch(url_of(name, URL.format(name=name), base), out / "raw" / name, sums.get(name))
            except NotFoundError:
                if split in NEEDED:
                    raise
                missing.append(name)
                continue
        files[side] = str(path.resolve())
    return files, missing


def build_multi30k(pair: str, out: Path, from_dir: Path | None = None, base: str | None = None,
                   dataset: str | Path | None = None, parser: str | None = None,
                   say: Callable[[str], None] = _warn) -> DataConfig:
    """Write ``<out>/multi30k.<pair>.yaml`` (a ``data:`` section) and return its DataConfig.

    ``pair`` is ``src-tgt`` (``en-de``); the dataset directory is ``dataset``, by default
    ``<out>/multi30k-<pair>``. The ``train`` and ``val`` splits are needed (``train`` validates on
    ``val``): missing, they are refused here rather than when training starts. Another split
    missing for a language (the 2017 MSCOCO test has no Czech: HTTP 404), or missing from
    ``from_dir``, is left out, and ``say`` tells which files were not found; any other failed
    download stops here. ``base``: a mirror holding the raw files under their names (default
    ``$STRUCTNMT_DOWNLOAD_URL``), else the corpus's public repository. ``parser``: a spaCy model
    (name or path) for the source trees, recorded in the config like the rest.
    """
    src, tgt = _languages(pair)
    if from_dir is not None:  # not "no train.en.gz" in a folder that is not there
        check_local_copy(from_dir, f"the local copy of the Multi30k raw files, {', '.join(SPLITS)}")
    out = Path(out)
    base = base_url(base) if from_dir is None else None
    sums = mirror_checksums(base)
    splits: dict[str, dict[str, str]] = {}
    for split in SPLITS:
        files, missing = _split_files(split, (src, tgt), out, from_dir, base, sums)
        if not missing:
            splits[split] = files
        elif split in NEEDED:  # only a local copy gets here: a download of a needed file raised above
            why = "the training data" if split == "train" else "the split train validates on (data.valid_split)"
            noun = "files" if len(missing) > 1 else "file"
            raise DataError(f"{' and '.join(missing)} not found: {split} is {why}; put the Multi30k {noun} "
                            f"there (from {URL.format(name=missing[0])})", from_dir)
        else:
            where = from_dir if from_dir is not None else base or URL.rsplit("/", 1)[0]
            say(f"{where}: {' and '.join(missing)} not found: split {split} left out")
    raw: dict = {
        # the parser too: a config that named this dataset but not its parser would rebuild it differently
        "src": {"lang": src, **({"parser": {"backend": "spacy", "model": parser}} if parser else {})},
        "tgt": {"lang": tgt},
        "splits": splits,
        # the dataset this config prepares: the one --out names (it once pointed into the raw folder)
        "dir": str(Path(dataset if dataset is not None else out / f"multi30k-{pair}").resolve()),
    }
    config = from_dict(DataConfig, raw, "data")
    atomic_write_text(config_path(out, pair), dump_yaml({"data": raw}))
    return config
