"""The engine tests' shared fixture: a small toy run composed as `mtl-bench train` composes it."""

from __future__ import annotations

import pytest

from tests.helpers.cli import SMALL


@pytest.fixture
def small_conf(compose_cfg):
    """The small run's config with extra overrides: small_conf("trainer.epochs=2")."""
    return lambda *overrides: compose_cfg(*SMALL, *overrides)
