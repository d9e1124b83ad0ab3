"""structnmt: structure-aware neural machine translation."""

__version__ = "0.1.0"
