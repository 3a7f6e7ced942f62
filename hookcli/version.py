"""hookcli's version, as the installed package's metadata gives it (a source tree never installed says so)."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("hookcli")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
