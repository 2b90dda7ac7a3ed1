"""A small Sphinx extension with the book's fixes to Jupyter Book 1's HTML output.

- Drop the Thebe scripts. Jupyter Book 1 registers sphinx-thebe twice, which declares
  ``THEBE_JS_URL`` twice (a JavaScript SyntaxError on every page), and Thebe loads its code from
  a CDN at run time; this book is read offline and has no live kernel.
- Three directives that render a page part from the promoted files at build time
  (:mod:`tutorial_utils.report.summary`): ``results-summary`` (the intro's summary of what the
  CPU path reached), ``promoted-artifacts`` (what promotion wrote, the artifacts page) and
  ``facts-table`` (the facts registry with its sources, the references page). The files they
  read are recorded as dependencies, so a page is rebuilt when they change.
"""

from __future__ import annotations


def _is_thebe(js) -> bool:
    name = str(getattr(js, "filename", js) or "")
    body = str(getattr(js, "attributes", {}).get("body", "") or "")
    return "thebe" in name or "THEBE_JS_URL" in body


def _drop_thebe(app, pagename, templatename, context, doctree):
    if "script_files" in context:
        context["script_files"] = [js for js in context["script_files"] if not _is_thebe(js)]


def _markdown_directive(render):
    """A directive class whose body is the Markdown ``render()`` returns, parsed in place."""
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class _Rendered(SphinxDirective):
        has_content = False

        def run(self):
            text, read = render()
            for path in read:
                self.env.note_dependency(str(path))
            box = nodes.container(classes=["rendered-from-files"])
            self.state.nested_parse(StringList(text.splitlines(), source=self.get_source_info()[0]), 0, box)
            return [box]

    return _Rendered


def setup(app):
    from tutorial_utils.report import summary

    app.connect("html-page-context", _drop_thebe, priority=900)
    app.add_directive("results-summary", _markdown_directive(summary.results_summary_md))
    app.add_directive("promoted-artifacts", _markdown_directive(summary.artifacts_md))
    app.add_directive("facts-table", _markdown_directive(summary.facts_md))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
