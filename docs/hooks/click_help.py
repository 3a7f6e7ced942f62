"""An MkDocs hook: the command-line reference shows each command's help as ``--help`` prints it.

mkdocs-click passes a command's help text on as Markdown, but hookcli's help is plain text written for a terminal:
``<layer>@grad`` would vanish as an HTML tag, ``'*dino*'`` turn italic, and the ``\\b`` blocks of examples lose
their line breaks. Here each paragraph is escaped and each ``\\b`` block becomes a fenced text block, so the page
says what ``hookcli COMMAND --help`` says. Options are left to mkdocs-click's plain style, which is Click's own
formatting already.
"""

from __future__ import annotations

import html
import inspect
import re
import textwrap

import mkdocs_click._docs as click_docs

_MARKDOWN = re.compile(r"([\\`*_\[\]{}])")


def _escaped(paragraph: str) -> str:
    """A paragraph of terminal text as one line of Markdown that renders as the same text."""
    joined = " ".join(line.strip() for line in paragraph.splitlines())
    return _MARKDOWN.sub(r"\\\1", html.escape(joined, quote=False))


def _help_as_markdown(ctx, remove_ascii_art: bool = False):
    """What mkdocs-click's own ``_make_description`` yields, for help text that is not Markdown."""
    text = ctx.command.help or ctx.command.short_help
    if not text:
        return
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if paragraph.startswith("\b\n"):  # Click's mark for a block printed without rewrapping
            yield "```text"
            yield from textwrap.dedent(paragraph[2:]).splitlines()
            yield "```"
        else:
            yield _escaped(paragraph)
        yield ""


if not hasattr(click_docs, "_make_description"):
    raise RuntimeError("mkdocs-click no longer has _docs._make_description: update docs/hooks/click_help.py")
click_docs._make_description = _help_as_markdown
