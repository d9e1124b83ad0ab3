"""Kept for the commands written before it became a subcommand: ``structnmt study compare``.

    python studies/compare_records.py STUDY.yaml RECIPE SEED OTHER_RECORD [--seed-of S T] [--any-recipe]

is ``structnmt study compare`` with the same arguments (see :mod:`structnmt.study.compare`),
through the command line's error handling: a problem is one ``error:`` line, exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from structnmt.cli.main import main as cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return cli(["study", "compare", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
