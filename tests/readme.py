"""The walkthroughs' code blocks that tests run, each found by the marker on the line before it:

    <!-- readme-test: NAME -->
    ```lang
    ...
    ```

The walkthroughs are README.md and the documentation's pages, every ``docs/**/*.md`` (the
tutorial, the how-to guides, the demo). A name is unique across all of them, so a test asks for
a block by name wherever the text lives, and the text can move between pages without the test
changing. A marker without its block, a block name used twice (in one file or in two) or an
unknown name fails the test that asks, so an edit that stops the steps from working breaks CI
instead of users.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARKER = "<!-- readme-test:"
# A marker is a line of its own; the same words quoted in a sentence (`<!-- readme-test: NAME -->`)
# are prose, not a marker.
MARKER_LINE = re.compile(r"^[ \t]*<!-- readme-test:", re.MULTILINE)
BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)<!-- readme-test: (?P<name>[\w-]+) -->\n"
    r"(?P=indent)```(?P<lang>\w*)\n(?P<body>.*?)\n(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    name: str
    lang: str
    code: str
    source: str = "README.md"  # the file it was found in, relative to the checkout


def walkthroughs() -> list[Path]:
    """README.md, then every page under docs/, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _label(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:  # a file outside the checkout, given by a test
        return str(path)


def _dedent(body: str, indent: str, name: str, label: str) -> str:
    lines = []
    for line in body.split("\n"):
        if line.startswith(indent):
            lines.append(line[len(indent) :])
        elif not line.strip():
            lines.append("")  # a blank line inside a list item's block carries no indent
        else:
            raise ValueError(f"{label} block {name!r}: a line is indented less than its fence")
    return "\n".join(lines)


def readme_blocks(*paths: Path) -> dict[str, Block]:
    """Every marked block of ``paths`` (default: README.md and docs/**/*.md), by name."""
    blocks: dict[str, Block] = {}
    for path in paths or walkthroughs():
        label = _label(path)
        text = path.read_text()
        found = 0
        for match in BLOCK.finditer(text):
            name = match["name"]
            if name in blocks:
                raise ValueError(
                    f"{label} marks a block {name!r}, as {blocks[name].source} does: "
                    "a name is unique across README.md and docs/"
                )
            code = _dedent(match["body"], match["indent"], name, label)
            blocks[name] = Block(name, match["lang"], code, label)
            found += 1
        if found != len(MARKER_LINE.findall(text)):
            raise ValueError(f"{label} has a {MARKER} marker that is not right before a ``` block")
    return blocks


def block(blocks: dict[str, Block], name: str, lang: str) -> str:
    """The code of one block, checked for its language."""
    if name not in blocks:
        raise LookupError(
            f"no block marked '{MARKER} {name} -->' in README.md or docs/ "
            f"(marked: {', '.join(sorted(blocks)) or 'none'})"
        )
    found = blocks[name]
    if found.lang != lang:
        raise LookupError(f"{found.source} block {name!r} is ```{found.lang}, expected ```{lang}")
    return found.code
