"""Multi30k task 1 (Elliott et al. 2016): a data config over its raw gzipped files.

Nothing is copied or decompressed: the corpus reader reads ``.gz`` directly. With
``from_dir`` (a local copy such as ``../shared/data/multi30k``) the config points at those
files; without it the files are downloaded once from the corpus's public repository (or a mirror,
:mod:`structnmt.data.download`) into ``<out>/raw``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from structnmt.config import DataConfig, from_dict
from structnmt.data.download import NotFoundError, base_url, fetch, mirror_checksums, url_of
from structnmt.errors import ConfigError, DataError
from structnmt.io import atomic_write_text

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
LANGS = ("en", "de", "fr", "cs")
URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"


def build_multi30k(pair: str, out: Path, from_dir: Path | None = None, base: str | None = None) -> DataConfig:
    """Write ``<out>/multi30k.<pair>.yaml`` (a ``data:`` section) and return its DataConfig.

    ``pair`` is ``src-tgt`` (``en-de``); the dataset directory is ``<out>/multi30k-<pair>``.
    A split missing for a language (the 2017 MSCOCO test has no Czech: HTTP 404) is left out;
    any other failed download stops here. ``base``: a mirror holding the raw files under their
    names (default ``$STRUCTNMT_DOWNLOAD_URL``), else the corpus's public repository.
    """
    try:
        src, tgt = pair.split("-")
    except ValueError:
        raise ConfigError(f"expected a language pair like en-de, got {pair!r}", "pair") from None
    for lang in (src, tgt):
        if lang not in LANGS:
            raise ConfigError(f"Multi30k has no {lang!r} (languages: {', '.join(LANGS)})", "pair")
    out = Path(out)
    base = base_url(base) if from_dir is None else None
    sums = mirror_checksums(base)
    splits: dict[str, dict[str, str]] = {}
    for split in SPLITS:
        files = {}
        for side, lang in (("src", src), ("tgt", tgt)):
            name = f"{split}.{lang}.gz"
            if from_dir is not None:
                path = Path(from_dir) / name
                if not path.is_file():
                    break
            else:
                try:
                    path = fetch(url_of(name, URL.format(name=name), base), out / "raw" / name, sums.get(name))
                except NotFoundError:
                    if split == "train":
                        raise
                    break
            files[side] = str(path.resolve())
        if len(files) == 2:
            splits[split] = files
    if "train" not in splits:
        raise DataError(f"no train.{src}.gz / train.{tgt}.gz", from_dir)
    raw = {
        "src": {"lang": src},
        "tgt": {"lang": tgt},
        "splits": splits,
        "dir": str((out / f"multi30k-{pair}").resolve()),
    }
    config = from_dict(DataConfig, raw, "data")
    atomic_write_text(out / f"multi30k.{pair}.yaml", yaml.safe_dump({"data": raw}, sort_keys=False))
    return config
