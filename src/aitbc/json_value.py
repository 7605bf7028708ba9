"""The JSON value type, defined once: what ``json.loads`` can return.

For data whose keys are not ours to know (a user's metrics, a blob header before its codec
reads it); where the keys are known, a dataclass or TypedDict says them instead.
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = "None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"

__all__ = ["JSONObject", "JSONValue"]
