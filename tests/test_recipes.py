"""Every shipped recipe is valid for the command that runs it (a typo in a recipe fails here, not in a
user's first run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedbackrl.config import load_config

RECIPES = sorted((Path(__file__).resolve().parent.parent / "recipes").glob("*.toml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path):
    load_config(path)


def test_the_recipes_are_found():
    assert {"online_rm.toml", "online_rm_passfail.toml", "reverse_grpo.toml"} <= {p.name for p in RECIPES}
