"""Methods kept outside the package: found through STRUCTNMT_METHODS in every process a command
starts, refused with the module named when they cannot be imported, replaced when defined again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from structnmt.model.methods import METHODS, Method, MethodParams, register

USER_MODULE = '''
"""A user's method: a fixed bonus on each token's dependency parent, in encoder self-attention."""
from dataclasses import dataclass

import torch

from structnmt.model.methods import AttentionPlugin, Method, MethodParams, register
from structnmt.model.methods.base import Effect


@dataclass
class ParentBonusParams(MethodParams):
    bonus: float = 1.0


class ParentBonusPlugin(AttentionPlugin):
    effect = Effect.ADDITIVE

    def __init__(self, heads, bonus):
        super().__init__(heads)
        self.bonus = bonus

    def term(self, ctx):
        parent = ctx.side("src")["parent_first"]
        hit = torch.nn.functional.one_hot(parent.clamp(min=0), parent.size(1)).to(ctx.q.dtype)
        heads = torch.zeros(ctx.q.size(1), dtype=ctx.q.dtype, device=hit.device)
        heads[self.heads] = self.bonus
        return hit[:, None] * heads[None, :, None, None]


@register("parent_bonus")
class ParentBonus(Method[ParentBonusParams]):
    """A fixed bonus on each token's parent (a user's method, for the tests)."""

    Params = ParentBonusParams
    needs = {"src": ("parent_first",)}
    needs_at_inference = {"src": ("parent_first",)}

    def make_plugin(self, site):
        return ParentBonusPlugin(self.head_list(), self.p.bonus)
'''


def structnmt_cli(tmp_path: Path, modules: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STRUCTNMT_METHODS": modules,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "structnmt.cli.main", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_method_named_by_structnmt_methods_is_known_to_every_command(tmp_path: Path) -> None:
    (tmp_path / "usermethods.py").write_text(USER_MODULE, encoding="utf-8")
    listed = structnmt_cli(tmp_path, "usermethods", "methods", "-v")
    assert listed.returncode == 0, listed.stderr
    assert "parent_bonus: A fixed bonus on each token's parent" in listed.stdout
    assert "'bonus': 1.0" in listed.stdout and "needs {'src': ('parent_first',)}" in listed.stdout
    # a config naming it reads in a fresh process; without the variable it is refused, with the way named
    (tmp_path / "c.yaml").write_text(textwrap.dedent("""\
        model: {methods: [{name: parent_bonus, bonus: 2.5}]}
        """), encoding="utf-8")
    code = ("import structnmt; c = structnmt.load_config('c.yaml'); "
            "print(type(c.model.methods[0]).__name__, c.model.methods[0].bonus)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "STRUCTNMT_METHODS": "usermethods"}
    read = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert read.stdout.split() == ["ParentBonusParams", "2.5"], read.stderr
    env.pop("STRUCTNMT_METHODS")
    refused = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert "model.methods[0].name: unknown method 'parent_bonus'" in refused.stderr
    assert "found when STRUCTNMT_METHODS names its module" in refused.stderr


@pytest.mark.parametrize("modules,source,message", [
    ("nosuchmodule", None, "error: STRUCTNMT_METHODS: cannot import module 'nosuchmodule' (is its folder on "
                           "PYTHONPATH?): ModuleNotFoundError: No module named 'nosuchmodule'\n"),
    ("broken", "x = 1\nraise ValueError('the bonus must be set')\n",
     "error: STRUCTNMT_METHODS: cannot import module 'broken': ValueError: the bonus must be set "
     "at {tmp}/broken.py:2\n"),
])
def test_a_module_that_cannot_be_imported_is_named_in_one_line(tmp_path: Path, modules: str, source: str | None,
                                                               message: str) -> None:
    if source is not None:
        (tmp_path / f"{modules}.py").write_text(source, encoding="utf-8")
    result = structnmt_cli(tmp_path, f" {modules} ,", "methods")
    assert result.returncode == 2
    assert result.stderr == message.format(tmp=tmp_path)


def test_an_installed_packages_entry_point_offers_its_methods_and_a_broken_one_is_named(tmp_path: Path) -> None:
    """A broken package nobody asked for warns and leaves every command working; a config that
    names a method it would have registered is refused with the package's failure in the message."""
    (tmp_path / "usermethods.py").write_text(USER_MODULE, encoding="utf-8")
    info = tmp_path / "mine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mine\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[structnmt.methods]\nmine = usermethods\n", encoding="utf-8")
    listed = structnmt_cli(tmp_path, "", "methods")
    assert listed.returncode == 0 and "parent_bonus: A fixed bonus" in listed.stdout, listed.stderr
    (info / "entry_points.txt").write_text("[structnmt.methods]\nmine = mine_gone\n", encoding="utf-8")
    failure = ("entry points structnmt.methods: cannot import 'mine_gone' (entry point 'mine' of mine) "
               "(is its folder on PYTHONPATH?): ModuleNotFoundError: No module named 'mine_gone'")
    broken = structnmt_cli(tmp_path, "", "methods")
    assert broken.returncode == 0 and "pascal: " in broken.stdout and "parent_bonus" not in broken.stdout
    assert broken.stderr == f"warning: {failure}; its methods are not available (fix or uninstall the package)\n"
    (tmp_path / "c.yaml").write_text("model: {methods: [{name: parent_bonus}]}\n", encoding="utf-8")
    asked = structnmt_cli(tmp_path, "", "train", "c.yaml")
    assert asked.returncode == 2
    last = asked.stderr.splitlines()[-1]
    assert last.startswith("error: c.yaml: model.methods[0].name: unknown method 'parent_bonus'")
    assert last.endswith(f"; it may be one of a package that failed: {failure}")


def test_outside_modules_load_on_first_use_so_they_may_import_any_part_of_structnmt(tmp_path: Path) -> None:
    """Loaded when the registry is first read, not when structnmt.model.methods is imported: a
    module importing the attention module, imported first, is not half-initialised; a module
    that failed is tried again, and the variable is read again, in the same process."""
    (tmp_path / "usermethods.py").write_text(USER_MODULE, encoding="utf-8")
    (tmp_path / "usesattention.py").write_text(
        "from structnmt.model.attention import gathered  # noqa: F401\nfrom usermethods import ParentBonus  # noqa\n",
        encoding="utf-8")
    code = textwrap.dedent("""\
        import importlib, os, structnmt.model.attention
        from structnmt.config import config_from_dict
        from structnmt.errors import ConfigError
        def read(name):
            try:
                return config_from_dict({"model": {"methods": [{"name": name}]}}).model.methods[0].name
            except ConfigError as err:
                return f"refused: {err}"
        os.environ["STRUCTNMT_METHODS"] = "not_yet_written"
        print(read("parent_bonus"))
        open("not_yet_written.py", "w").write("")
        importlib.invalidate_caches()
        print(read("parent_bonus")[:61])
        os.environ["STRUCTNMT_METHODS"] = "not_yet_written,usesattention"
        print(read("parent_bonus"), read("pascal"))
        from structnmt.study.provenance import outside_methods  # what a study record names
        print({name: len(digest) for name, digest in outside_methods().items()})
        """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("STRUCTNMT_METHODS", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.splitlines() == [
        "refused: STRUCTNMT_METHODS: cannot import module 'not_yet_written' (is its folder on PYTHONPATH?): "
        "ModuleNotFoundError: No module named 'not_yet_written'",
        "refused: model.methods[0].name: unknown method 'parent_bonus'",  # imported now: it defines none
        "parent_bonus pascal",
        "{'not_yet_written': 64, 'usesattention': 64}",
    ], result.stderr


def test_a_method_defined_again_replaces_itself_and_another_class_of_that_name_is_refused() -> None:
    def define(qualname: str) -> type:
        cls = type(qualname, (Method,), {"Params": MethodParams, "__module__": "notebook_cell"})
        cls.__qualname__ = qualname
        return cls

    try:
        first = register("cell_method")(define("CellMethod"))
        again = register("cell_method")(define("CellMethod"))  # the cell run a second time
        assert METHODS["cell_method"] is again is not first
        with pytest.raises(ValueError, match=r"'cell_method' registered twice \(notebook_cell.CellMethod and "
                                             r"notebook_cell.OtherMethod\)"):
            register("cell_method")(define("OtherMethod"))
    finally:
        from structnmt.method_config import METHOD_PARAMS

        METHODS.pop("cell_method", None)
        METHOD_PARAMS.pop("cell_method", None)
