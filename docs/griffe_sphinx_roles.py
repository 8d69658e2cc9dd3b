"""A griffe extension for the docs build (mkdocs.yml): the docstrings are written for Sphinx,
the site renders Markdown.

- ``:class:`~a.b.C```, ``:func:`a.b```, ``:mod:`x``` ... become code spans (`` `C` ``,
  `` `a.b` ``): Markdown would show the role's name as text.
- A paragraph ending in ``::`` (reST's "a literal block follows") ends in ``:``; the indented
  block after it is already a Markdown code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :role:`target`, :role:`~dotted.target` or :role:`title <target>`.
ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]+?)(?:\s*<[^`>]+>)?`")
LITERAL_BLOCK = re.compile(r"::$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    shown = target.rsplit(".", 1)[-1] if tilde else target
    return f"`{shown}`"


def markdown(text: str) -> str:
    text = ROLE.sub(_role, text)
    return LITERAL_BLOCK.sub(":", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
