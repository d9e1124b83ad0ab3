"""The README's quick start is what CI runs: its two commands, in order, nothing between them
that a user would not type but ruff. A change to one without the other fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's quick start has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def _ci_commands() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]


def test_the_quick_start_has_exactly_two_commands():
    install, tests = _quick_start()
    assert "pip install" in install and "structnmt demo" in install
    assert shlex.split(tests)[:3] == ["python", "-m", "pytest"]


def test_ci_runs_the_quick_starts_two_commands_in_order():
    install, tests = _quick_start()
    ci = _ci_commands()
    first, *_, last = ci
    pip_args = shlex.split(install.split("&&")[0])[2:]  # after "pip install"
    assert shlex.split(first.split("&&")[0])[-len(pip_args):] == pip_args  # the same install
    demo = shlex.split(first.split("&&")[1])
    assert demo[:2] == ["structnmt", "demo"] and set(demo[2:]) <= {"--steps", *map(str, range(1, 1001))}
    assert last == tests  # the README's test command, word for word, and last
    assert all("pytest" not in line for line in ci[1:-1])  # no other test run between them
