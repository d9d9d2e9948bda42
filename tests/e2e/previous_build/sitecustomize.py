"""The build before pages crossed the broker in their split form, for the rolling-upgrade test.

A service started with this folder first on PYTHONPATH publishes every page as the previous
build did: one JSON object, its text inside it (`Page`'s first form), marked
`application/json`. What it reads is unchanged. A fetcher started so stands for an old
fetcher still running while the parsers and storers are already this build
(docs/messages.md: a page's split form).
"""

from __future__ import annotations

import hutch.models as models

_encode = models.encode


def encode(message: models.Model) -> bytes:
    if isinstance(message, models.Page):
        return message.model_dump_json(exclude_none=True).encode()
    return _encode(message)


def content_type(message: models.Model | bytes) -> str:
    return "application/json"  # what the build before gave every message


# Before any service module does `from hutch.models import encode, content_type`.
models.encode = encode
models.content_type = content_type
