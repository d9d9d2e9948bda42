"""Hostile answers: bodies. See the package docstring."""

from __future__ import annotations
