"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def priors_only(monkeypatch):
    """Predict from the shipped priors, whether or not the tables extra is installed."""
    from ceiling.predict import tables

    monkeypatch.setenv("CEILING_NO_TABLES", "1")
    tables.info.cache_clear()
    yield
    tables.info.cache_clear()
