"""The code blocks of README.md that tests run, each found by the marker on the line before it:

    <!-- readme-test: NAME -->
    ```lang
    ...
    ```

A marker without its block, a block name used twice or an unknown name fails the test that asks,
so a README edit that stops the steps from working breaks CI instead of users.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- readme-test:"
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


def _dedent(body: str, indent: str, name: str) -> str:
    lines = []
    for line in body.split("\n"):
        if line.startswith(indent):
            lines.append(line[len(indent) :])
        elif not line.strip():
            lines.append("")  # a blank line inside a list item's block carries no indent
        else:
            raise ValueError(f"README.md block {name!r}: a line is indented less than its fence")
    return "\n".join(lines)


def readme_blocks(path: Path = README) -> dict[str, Block]:
    text = path.read_text()
    blocks: dict[str, Block] = {}
    for match in BLOCK.finditer(text):
        name = match["name"]
        if name in blocks:
            raise ValueError(f"README.md marks two blocks {name!r}")
        code = _dedent(match["body"], match["indent"], name)
        blocks[name] = Block(name, match["lang"], code)
    if len(blocks) != text.count(MARKER):
        raise ValueError(f"README.md has a {MARKER} marker that is not right before a ``` block")
    return blocks


def block(blocks: dict[str, Block], name: str, lang: str) -> str:
    """The code of one block, checked for its language."""
    if name not in blocks:
        raise LookupError(f"README.md has no block marked '{MARKER} {name} -->'")
    found = blocks[name]
    if found.lang != lang:
        raise LookupError(f"README.md block {name!r} is ```{found.lang}, expected ```{lang}")
    return found.code
