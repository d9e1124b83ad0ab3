"""benchmarks/scene_change.py: counting sentences whose scenes the conj rule changes."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from structnmt.config import config_from_dict
from structnmt.data.prepare import prepare
from structnmt.data.synthetic import demo_config, write_task

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scene_change.py"


def load_script():
    spec = importlib.util.spec_from_file_location("scene_change", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo_dataset(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("scene_change")
    write_task(work / "data", sizes={"train": 150, "val": 8, "test": 20}, seed=5)
    data = demo_config(work, 1.0)["data"]
    data["subwords"]["vocab_size"] = 300
    torch.set_num_threads(1)
    prepare(config_from_dict({"data": data}), force=True, verbose=False)
    return Path(data["dir"])


CONLLU = """# text = A man and a woman sitting on a bench
1\tA\ta\tDET\t_\t_\t2\tdet\t_\t_
2\tman\tman\tNOUN\t_\t_\t0\troot\t_\t_
3\tand\tand\tCCONJ\t_\t_\t5\tcc\t_\t_
4\ta\ta\tDET\t_\t_\t5\tdet\t_\t_
5\twoman\twoman\tNOUN\t_\t_\t2\tconj\t_\t_
6\tsitting\tsit\tVERB\t_\t_\t2\tacl\t_\t_
7\ton\ton\tADP\t_\t_\t9\tcase\t_\t_
8\ta\ta\tDET\t_\t_\t9\tdet\t_\t_
9\tbench\tbench\tNOUN\t_\t_\t6\tobl\t_\t_

# text = dogs run and jump
1\tdogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_
2\trun\trun\tVERB\t_\t_\t0\troot\t_\t_
3\tand\tand\tCCONJ\t_\t_\t4\tcc\t_\t_
4\tjump\tjump\tVERB\t_\t_\t2\tconj\t_\t_

"""


def test_conllu_counts_the_one_changed_sentence(tmp_path, capsys) -> None:
    sc = load_script()
    path = tmp_path / "two.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    [count] = sc.conllu_file(path, examples=5)
    # the caption loses the "woman" scene (3 -> 2 scenes); the verb coordination keeps its two
    assert (count.sentences, count.changed, count.scenes_before, count.scenes_after) == (2, 1, 5, 4)
    assert sc.main([str(path), "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 sentences change (50.00%); scenes 5 -> 4" in out
    assert "no longer a scene: ['woman']" in out


def test_demo_dataset_rules_agree_and_a_changed_copy_is_counted(demo_dataset, tmp_path, capsys) -> None:
    sc = load_script()
    counts = {c.name: c for c in sc.one_dataset(demo_dataset, "src", None, examples=0)}
    assert set(counts) == {f"{s} {k}" for s in ("train", "val", "test")
                           for k in ("old -> new", "stored -> new", "stored -> old")}
    test = counts["test old -> new"]
    assert test.sentences == 20 and test.scenes_before >= 20
    # the demo grammar coordinates clauses (a verb conj with its own subject) and object nouns
    # under a verb (not clause heads): both rules give the same scenes on it, and a dataset
    # prepared now stores exactly what the new rule derives from its stored trees
    assert all(c.changed == 0 for c in counts.values())
    heads_of_conj = [tree.labels[tree.heads[w]] for _, tree, _ in sc.stored(demo_dataset, "train", "src")
                     for w in range(len(tree)) if tree.labels[w] == "conj"]
    assert heads_of_conj.count("root") > 3 and heads_of_conj.count("obj") > 3
    assert counts["train stored -> new"].sentences > 100  # (a few long pairs may be dropped)

    # a second dataset whose test sentence 3 has one member moved to another scene
    other = tmp_path / "other"
    shutil.copytree(demo_dataset, other)
    offsets = np.load(other / "test" / "src.scene_members.offsets.npy")
    data = np.load(other / "test" / "src.scene_members.data.npy")
    data[offsets[2], 1] += 1
    np.save(other / "test" / "src.scene_members.data.npy", data)
    [test_ab] = sc.two_datasets(demo_dataset, other, "src", ["test"], examples=0)
    assert (test_ab.sentences, test_ab.changed) == (20, 1)
    assert sc.main([str(demo_dataset), str(other), "--splits", "test", "val"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["test a -> b: 1 of 20 sentences change (5.00%); "
                   f"scenes {test_ab.scenes_before} -> {test_ab.scenes_after}",
                   out[1]] and out[1].startswith("val a -> b: 0 of 8")


def test_datasets_of_different_sizes_are_refused(demo_dataset, tmp_path, capsys) -> None:
    sc = load_script()
    other = tmp_path / "other"
    shutil.copytree(demo_dataset, other)
    shutil.rmtree(other / "val")
    shutil.copytree(demo_dataset / "test", other / "val")
    assert sc.main([str(demo_dataset), str(other)]) == 2
    assert "split 'val' has 8 sentences" in capsys.readouterr().err
