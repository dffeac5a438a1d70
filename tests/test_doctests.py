"""The worked examples in the library's docstrings are claims too: every one of them runs."""

import doctest
import importlib
import pathlib

import pytest

from helpers import ROOT

FILES = sorted(p for p in pathlib.Path(ROOT, "nanodflash").rglob("*.py") if ">>>" in p.read_text())


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docstring_examples_hold(path):
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{path.name}: its examples were not found"
    assert result.failed == 0, f"{path.name}: {result.failed} of {result.attempted} docstring examples fail"
