"""Hostile answers: pages. See the package docstring."""

from __future__ import annotations
