"""Shared fixtures: where ../shared lives, and tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test when this checkout has none."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (a fresh clone has no ../shared)")
    return path


@pytest.fixture(autouse=True, scope="session")
def _subprocesses_import_this_checkout():
    """Scripts, CLIs and workers the tests start import this checkout's structnmt, the one pytest
    imports, not whichever copy (an install of another clone, or none) the interpreter finds."""
    import os

    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([before] if before else []))
    yield
    if before is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture(autouse=True, scope="session")
def _own_cache_dir(tmp_path_factory):
    """What structnmt caches between runs (significance.cache_dir) goes to a temporary folder:
    tests compute everything, and never write to the user's home."""
    import os

    before = os.environ.get("STRUCTNMT_CACHE_DIR")
    os.environ["STRUCTNMT_CACHE_DIR"] = str(tmp_path_factory.mktemp("structnmt_cache"))
    yield
    if before is None:
        del os.environ["STRUCTNMT_CACHE_DIR"]
    else:
        os.environ["STRUCTNMT_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread is faster than two fighting over a shared machine; the count is
    left as it was found. A module asks for it with ``pytestmark = pytest.mark.usefixtures(...)``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
