"""Handler registration by identity: one function per name, one set of options per function."""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from tombstones.jobs import registry

NAME = "tests.registry_probe"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    registry.unregister(NAME)
    yield
    registry.unregister(NAME)


def _closure(tag: str) -> Any:
    def handle(ctx: Any) -> str:
        return tag

    return handle


def _target(ctx: Any, tag: str) -> str:
    return tag


def test_register__two_closures_under_one_name_are_refused() -> None:
    first, second = _closure("a"), _closure("b")
    assert (first.__module__, first.__qualname__) == (second.__module__, second.__qualname__)
    registry.handler(NAME)(first)
    with pytest.raises(ImproperlyConfigured, match="Two different functions"):
        registry.handler(NAME)(second)
    assert registry.get_handler(NAME).func is first


def test_register__two_partials_under_one_name_are_refused() -> None:
    registry.handler(NAME)(functools.partial(_target, tag="a"))
    with pytest.raises(ImproperlyConfigured, match=NAME):
        registry.handler(NAME)(functools.partial(_target, tag="b"))


def test_register__a_module_imported_twice_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "twice_handlers.py"
    source.write_text(
        f"from tombstones import handler\n\n@handler({NAME!r})\ndef handle(ctx):\n    return None\n"
    )

    def load() -> Any:
        # What a second import under the same name does (e.g. after sys.modules was cleared).
        spec = importlib.util.spec_from_file_location("twice_handlers", source)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    try:
        first = load()
        with pytest.raises(ImproperlyConfigured):
            load()
        assert registry.get_handler(NAME).func is first.handle
    finally:
        sys.modules.pop("twice_handlers", None)


@pytest.mark.parametrize(
    "changed", [{"external": True}, {"accepts_tombstones": True}], ids=["external", "tombstones"]
)
def test_register__the_same_function_with_other_options_is_refused(
    changed: dict[str, bool],
) -> None:
    func = _closure("a")
    registry.handler(NAME)(func)
    with pytest.raises(ImproperlyConfigured, match="different options"):
        registry.handler(NAME, **changed)(func)
    found = registry.get_handler(NAME)
    assert (found.external, found.accepts_tombstones) == (False, False)  # nothing flipped


def test_register__the_identical_registration_again_is_a_no_op() -> None:
    func = _closure("a")
    assert registry.handler(NAME, external=True)(func) is func
    before = registry.get_handler(NAME)
    assert registry.handler(NAME, external=True)(func) is func
    assert registry.get_handler(NAME) == before
    assert registry.get_handler(NAME).func is func
