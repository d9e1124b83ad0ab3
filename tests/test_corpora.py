"""The papers' corpora: the download command's layout (on stand-in archives, no network) and
each WMT14 / IWSLT14 recipe's prepare on a small stand-in in that layout."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from structnmt.config import _read_yaml, load_config
from structnmt.data.corpora import download
from structnmt.data.prepare import prepare
from tests.test_prepare_stream import labelled_corpus

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: recipe -> (raw directory, {split: (source file, target file)})
LAYOUTS = {
    "wmt14_en_de_transformer.yaml": ("data/raw/wmt14_en_de", {
        "train": ("train.en", "train.de"), "newstest2013": ("newstest2013.en", "newstest2013.de"),
        "newstest2014": ("newstest2014.en", "newstest2014.de")}),
    "iwslt14_de_en_transformer.yaml": ("data/raw/iwslt14_de_en", {
        "train": ("train.de", "train.en"), "valid": ("valid.de", "valid.en"), "test": ("test.de", "test.en")}),
}


def tgz(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            raw = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


@pytest.mark.parametrize("recipe", sorted(LAYOUTS))
def test_recipe_prepares_a_stand_in_in_its_layout(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    raw_dir, files = LAYOUTS[recipe]
    monkeypatch.chdir(tmp_path)  # the recipes' paths are relative to where the command runs
    root = tmp_path / raw_dir
    root.mkdir(parents=True)
    conllu = {}
    sizes = {"train": 300, "newstest2013": 20, "newstest2014": 25, "valid": 20, "test": 25}
    for k, (split, (src, tgt)) in enumerate(files.items()):
        rows = labelled_corpus(sizes[split], k)
        (root / src).write_text("".join(r[0] + "\n" for r in rows), encoding="utf-8")
        (root / tgt).write_text("".join(r[1] + "\n" for r in rows), encoding="utf-8")
        (root / f"{split}.conllu").write_text("".join(r[2] for r in rows), encoding="utf-8")
        conllu[split] = str(root / f"{split}.conllu")
    # the recipe as it is, but for a stand-in parse (no parser model here) and a vocabulary that fits
    cfg = load_config(CONFIGS / recipe, {"data.src.parser": {"backend": "conllu", "conllu": conllu,
                                                             "convention": "ud"},
                                         "data.subwords.vocab_size": 60})
    out = prepare(cfg, verbose=False)
    assert out == Path(cfg.data.dir) and str(out).startswith("data/")
    meta = json.loads((out / "meta.json").read_text())
    assert list(meta["splits"]) == list(files)
    for split in files:
        assert meta["splits"][split]["clean"]["read"] == sizes[split]
        assert meta["splits"][split]["fields"]["src"][:2] == ["ids", "word_index"]
    assert cfg.data.valid_split in files and meta["moses"] is True
    assert meta["subwords"]["src"]["model_type"] == "bpe"
    # the structure-aware recipe of the corpus extends this one: the same data, the same dataset
    for sibling in CONFIGS.glob(recipe.replace("transformer.yaml", "*.yaml")):
        assert _read_yaml(sibling)["data"] == _read_yaml(CONFIGS / recipe)["data"], sibling.name


def test_recipes_have_the_papers_sizes() -> None:
    base = load_config(CONFIGS / "wmt14_en_de_transformer.yaml").model
    assert (base.enc_layers, base.dec_layers, base.d_model, base.n_heads, base.d_ff) == (6, 6, 512, 8, 2048)
    assert load_config(CONFIGS / "wmt14_en_de_pascal.yaml").model.methods[0].name == "pascal"
    small = load_config(CONFIGS / "iwslt14_de_en_deps_san.yaml").model
    assert (small.enc_layers, small.d_model, small.n_heads, small.d_ff) == (6, 512, 4, 1024)
    assert small.methods[0].name == "deps_san" and small.methods[0].layers == [1, 2, 3]


def test_wmt14_layout_from_local_archives(tmp_path: Path) -> None:
    local = tmp_path / "archives"
    local.mkdir()
    tgz(local / "training-parallel-europarl-v7.tgz", {"training/europarl-v7.de-en.en": "e1\ne2\n",
                                                      "training/europarl-v7.de-en.de": "d1\nd2\n",
                                                      "training/europarl-v7.fr-en.en": "not this\n"})
    tgz(local / "training-parallel-commoncrawl.tgz", {"commoncrawl.de-en.en": "c1\n", "commoncrawl.de-en.de": "k1\n"})
    tgz(local / "training-parallel-nc-v9.tgz", {"training/news-commentary-v9.de-en.en": "n1\n",
                                                "training/news-commentary-v9.de-en.de": "m1\n"})
    tgz(local / "dev.tgz", {"dev/newstest2013.en": "dev en\n", "dev/newstest2013.de": "dev de\n"})
    seg = '<doc>\n<seg id="1"> A test. </seg>\n<seg id="2">B &amp; c</seg>\n</doc>\n'
    tgz(local / "test-full.tgz", {"test-full/newstest2014-deen-src.en.sgm": seg,
                                  "test-full/newstest2014-deen-ref.de.sgm": seg.replace("test", "Test")})
    out = tmp_path / "wmt"
    counts = download("wmt14-en-de", out, local)
    assert (out / "train.en").read_text() == "e1\ne2\nc1\nn1\n" and (out / "train.de").read_text() == "d1\nd2\nk1\nm1\n"
    assert (out / "newstest2014.en").read_text() == "A test.\nB &amp; c\n"
    assert counts["newstest2013.de"] == 1 and counts["train.en"] == 4


def test_iwslt14_split_as_fairseq_splits_it(tmp_path: Path) -> None:
    text_de, text_en = [], []
    for k in range(1, 101):
        text_de.append(f"Das ist Satz Nummer {k} .")
        text_en.append(f"This is sentence number {k} .")
    text_de[9], text_en[9] = "Ein Wort", "one two three four five six seven"  # ratio over 1.5: dropped
    markup = ["<url>http://x</url>", "<talkid>1</talkid>", "<keywords>a</keywords>", "<speaker>S</speaker>"]
    de = "\n".join(markup + ["<title>Titel Eins Zwei</title>"] + text_de) + "\n"
    en = "\n".join(markup + ["<title>Title One Two</title>"] + text_en) + "\n"
    members = {"de-en/train.tags.de-en.de": de, "de-en/train.tags.de-en.en": en}
    for name in ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                 "IWSLT14.TED.tst2012"]:
        for lang in ("de", "en"):
            members[f"de-en/{name}.de-en.{lang}.xml"] = (f'<doc>\n<seg id="1"> {name} {lang} It\u2019s </seg>\n'
                                                          f"</doc>\n")
    local = tmp_path / "archives"
    local.mkdir()
    tgz(local / "de-en.tgz", members)
    out = tmp_path / "iwslt"
    counts = download("iwslt14-de-en", out, local)
    kept = 1 + 99  # the title line and 99 sentences
    assert counts["valid.de"] == kept // 23 and counts["train.de"] == kept - kept // 23
    valid = (out / "valid.en").read_text().splitlines()
    assert valid[0] == "this is sentence number 23 ."  # the 23rd kept line (title, 1..9, 11..23), lowercased
    assert (out / "train.de").read_text().splitlines()[0] == "titel eins zwei"
    assert "ein wort" not in (out / "train.de").read_text()
    test = (out / "test.en").read_text().splitlines()
    assert test[0] == "iwslt14.ted.dev2010 en it's" and test[1].startswith("iwslt14.tedx.dev2012")
    assert len(test) == 5


def test_download_names_a_missing_local_archive(tmp_path: Path) -> None:
    from structnmt.errors import DataError

    with pytest.raises(DataError, match=r"de-en.tgz is not here \(expected the file downloaded from http"):
        download("iwslt14-de-en", tmp_path / "out", tmp_path)


def test_download_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from structnmt.cli.main import main

    assert main(["download", "iwslt14-de-en", "--out", str(tmp_path / "out"), "--from", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path}: de-en.tgz is not here")
