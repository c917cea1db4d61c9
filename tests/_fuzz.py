"""How hard the property tests search: ``DYN_TEST_FUZZ`` scales each one's budget of examples.

The suite runs them at a quarter of their budgets, the developer's loop; ``nox -s fuzz``
(CI runs it too) runs them in full, or harder with ``DYN_TEST_FUZZ`` above 1.
"""

from __future__ import annotations

import os

SCALE = float(os.environ.get("DYN_TEST_FUZZ", "0.25"))


def examples(budget: int) -> int:
    """``budget`` examples scaled by :data:`SCALE`, and never fewer than three."""
    return max(3, round(budget * SCALE))
