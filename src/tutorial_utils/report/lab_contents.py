"""The contents manager ``make lab`` runs: jupytext's (a ``.md`` chapter opens as a notebook),
plus the kernel's ``language_info`` in every notebook it opens.

JupyterLab writes the kernel's ``language_info`` into a notebook's metadata as soon as the kernel
connects, and a notebook that lacked it is then marked modified: every chapter would look edited
the moment it is opened, because ``jupytext.toml`` keeps only the ``jupytext`` and ``kernelspec``
metadata in the ``.md``. Giving the opened notebook the same ``language_info`` the kernel reports
(this venv's ipykernel, the kernel ``make lab`` starts) leaves nothing to change; saving drops it
again (the metadata filter), so the ``.md`` stays as it was.

Imported only by the Jupyter server (``--ServerApp.contents_manager_class``), never by
``import tutorial_utils``.
"""

from __future__ import annotations

import copy

import jupytext


def kernel_language_info() -> dict:
    """What this environment's ipykernel reports as ``language_info`` (its kernel_info reply)."""
    from ipykernel.ipkernel import IPythonKernel

    return copy.deepcopy(IPythonKernel.language_info)


class BookContentsManager(jupytext.AsyncTextFileContentsManager):
    """jupytext's contents manager; opened notebooks carry the kernel's ``language_info``."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if content and model.get("type") == "notebook" and model.get("content") is not None:
            metadata = model["content"].setdefault("metadata", {})
            if metadata.get("kernelspec", {}).get("language", "python") == "python":
                metadata.setdefault("language_info", kernel_language_info())
        return model
