"""The check catalog: every check id the product can write, registered once (see docs/checks.md)."""

from __future__ import annotations
