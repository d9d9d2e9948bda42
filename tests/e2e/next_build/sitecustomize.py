"""The "next build" of Hutch for the rolling-upgrade test: this code, whose models carry one
more field.

A service started with this folder first on PYTHONPATH imports it before anything else (the
`site` module imports `sitecustomize`), and from then on every message it publishes carries
`NEXT_FIELD` on every model in it, nested ones included: what a build with a new optional
field puts on the wire. It reads messages without the field as before (a new optional field
has a default), which is the other half of an additive change.
"""

from __future__ import annotations

import json
from typing import Any

import hutch.models as models

NEXT_FIELD = "added_in_next_build"
NEXT_VALUE = "present"
_encode = models.encode


def _carry(value: Any, data: Any) -> None:
    """Add the field to every object of `data` (the message as JSON) that is a model in `value`."""
    if isinstance(value, models.Model) and isinstance(data, dict):
        data.setdefault(NEXT_FIELD, NEXT_VALUE)
        for name in type(value).model_fields:
            if name in data:
                _carry(getattr(value, name), data[name])
    elif isinstance(value, (list, tuple)) and isinstance(data, list):
        for item, found in zip(value, data, strict=False):
            _carry(item, found)
    elif isinstance(value, dict) and isinstance(data, dict):
        for key, item in value.items():
            if isinstance(key, str) and key in data:
                _carry(item, data[key])


def encode(message: models.Model) -> bytes:
    body = _encode(message)
    # A page's split form: its line of fields gets the field; its text, after it, is as it was.
    head, newline, text = body.partition(b"\n") if body.startswith(models.SPLIT_PREFIX) else (body, b"", b"")
    data = json.loads(head)
    _carry(message, data)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + newline + text


models.encode = encode  # before any service module does `from hutch.models import encode`
