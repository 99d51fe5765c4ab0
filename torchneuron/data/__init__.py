"""Data files shipped with the package."""

from importlib import resources

CORPUS = "tiny_corpus.txt"


def load_text(name: str = CORPUS) -> str:
    """Return the contents of a text file shipped in this package.

    Args:
        name: file name inside ``torchneuron/data``; defaults to the demo corpus.
    """
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
