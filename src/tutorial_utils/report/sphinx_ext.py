"""A small Sphinx extension with the book's fixes to Jupyter Book 1's HTML output.

- Drop the Thebe scripts. Jupyter Book 1 registers sphinx-thebe twice, which declares
  ``THEBE_JS_URL`` twice (a JavaScript SyntaxError on every page), and Thebe loads its code from
  a CDN at run time; this book is read offline and has no live kernel.
"""

from __future__ import annotations


def _is_thebe(js) -> bool:
    name = str(getattr(js, "filename", js) or "")
    body = str(getattr(js, "attributes", {}).get("body", "") or "")
    return "thebe" in name or "THEBE_JS_URL" in body


def _drop_thebe(app, pagename, templatename, context, doctree):
    if "script_files" in context:
        context["script_files"] = [js for js in context["script_files"] if not _is_thebe(js)]


def setup(app):
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
