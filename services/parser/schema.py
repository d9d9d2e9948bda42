"""The item schema: the types a spec's `item:` gives its fields, checked after extraction.

Selectors give text, and a site changes its markup without warning: a price that stops
matching, or starts matching the wrong node, fills a job with nulls and junk unless the item
is checked. `item: {price: {type: number, required: true}}` makes such a page dead
(`item_invalid`, stage `parse`) with the field named, which `hutch dlq` groups and a replay
re-parses once the spec is fixed.

Each field is validated by pydantic in its lax mode, so text converts where the type asks for
it (`"12.50"` to 12.5 for `number`, `"42"` to 42 for `integer`, `"true"` to true for
`boolean`) and the item keeps the converted value. A boolean is never a number, and `nan` or
`inf` are refused (they are not JSON). Null passes unless the field is `required`. Fields the
schema does not name pass through unchanged.
"""

from __future__ import annotations

import reprlib
from functools import cache
from typing import Annotated, Any

from pydantic import BeforeValidator, FiniteFloat, TypeAdapter, ValidationError

from hutch.models import ItemField, ItemType

_REPR = reprlib.Repr()
_REPR.maxstring = 40
_REPR.maxother = 40
_REPR.maxlist = _REPR.maxdict = 3
_REPR.maxlevel = 2


class ItemInvalid(Exception):
    """The item does not fit the spec's `item:` schema; the message names the field."""


def _not_a_boolean(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic's lax int takes true as 1
        raise ValueError("a boolean is not a number")
    return value


_Integer = Annotated[int, BeforeValidator(_not_a_boolean)]
_Number = Annotated[int | FiniteFloat, BeforeValidator(_not_a_boolean)]
_TYPES: dict[str, Any] = {
    "string": str,
    "number": _Number,
    "integer": _Integer,
    "boolean": bool,
    "list": list[Any],
    "object": dict[str, Any],
}
_ARTICLES = {"string": "a string", "number": "a number", "integer": "an integer", "boolean": "a boolean",
             "list": "a list", "object": "an object"}  # fmt: skip


@cache
def _adapter(kind: ItemType, required: bool) -> TypeAdapter[Any]:
    found = _TYPES[kind]
    return TypeAdapter(found if required else found | None)


def check_item(schema: dict[str, ItemField], fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with each field the schema names validated and converted; `ItemInvalid` else."""
    checked = dict(fields)
    for name, rule in schema.items():
        value = fields.get(name)
        try:
            converted = _adapter(rule.type, rule.required).validate_python(value)
        except ValidationError:
            raise ItemInvalid(_describe(name, rule, value)) from None
        if name in checked:
            checked[name] = converted
    return checked


def _describe(name: str, rule: ItemField, value: Any) -> str:
    field = _REPR.repr(name)
    if value is None:
        return f"field {field} is required, and is null (nothing matched)"
    wanted = _ARTICLES[rule.type] + ("" if rule.required else " or null")
    return f"field {field}: expected {wanted}, got {_json_type(value)} {_REPR.repr(value)}"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__
