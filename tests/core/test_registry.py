"""Registry: register by name with a decorator, look up, and fail helpfully."""

from __future__ import annotations

import pytest

from aitbc.core.registry import Registry
from aitbc.errors import UsageError


@pytest.fixture
def shapes() -> Registry:
    reg: Registry = Registry("shape")

    @reg.register("square")
    class Square:
        pass

    @reg.register("circle")
    def circle():
        return "circle"

    return reg


def test_register_returns_the_object_unchanged():
    reg: Registry = Registry("thing")

    def f():
        return 1

    assert reg.register("f")(f) is f
    assert reg.get("f") is f


def test_get_names_contains_iter(shapes):
    assert shapes.get("circle")() == "circle"
    assert shapes.get("square").__name__ == "Square"
    assert shapes.names() == ["circle", "square"]
    assert list(shapes) == ["circle", "square"]
    assert "circle" in shapes and "triangle" not in shapes


def test_unknown_name_lists_allowed_names(shapes):
    with pytest.raises(UsageError) as exc:
        shapes.get("triangle")

    assert str(exc.value) == "unknown shape 'triangle'; allowed: circle, square"


def test_unknown_name_in_empty_registry():
    with pytest.raises(UsageError, match="unknown codec 'x'; allowed: $"):
        Registry("codec").get("x")


def test_double_registration_is_refused_and_keeps_the_first(shapes):
    first = shapes.get("circle")

    with pytest.raises(RuntimeError, match="shape 'circle' registered twice"):
        shapes.register("circle")(lambda: "other")

    assert shapes.get("circle") is first


def test_registries_are_independent():
    a: Registry = Registry("a")
    b: Registry = Registry("b")

    a.register("x")(1)

    assert "x" in a and "x" not in b
