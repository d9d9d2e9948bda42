"""Hostile answers: urls. See the package docstring."""

from __future__ import annotations
