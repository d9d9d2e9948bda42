"""Hutch's services, one package each; this table is the one list of their names.

The command line (`hutch serve NAME`, `hutch up`), docker-compose and the packages all use
these names; the package of a service is its name with `-` turned into `_`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hutch.service import Service

# The pipeline: what `hutch up` runs and every job needs.
SERVICES: tuple[str, ...] = ("governor", "fetcher", "proxy-manager", "parser", "storer")
# Served beside the pipeline where wanted (`hutch serve api`): no job needs it.
EXTRAS: tuple[str, ...] = ("api",)
ALL: tuple[str, ...] = SERVICES + EXTRAS


def module_of(name: str) -> str:
    if name not in ALL:
        raise KeyError(f"unknown service {name!r}; the services are: {', '.join(ALL)}")
    return f"hutch.services.{name.replace('-', '_')}"


def service_class(name: str) -> type[Service]:
    app = importlib.import_module(module_of(name) + ".app")
    cls: type[Service] = app.SERVICE
    return cls
