"""Helpers behind the DiT4DiT-LIBERO hands-on book.

Importing the package is instant: torch, LIBERO, MuJoCo, pyarrow and friends are imported
inside the modules that need them (``tutorial_utils.data.reader``, ``tutorial_utils.policies.mini``...).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
