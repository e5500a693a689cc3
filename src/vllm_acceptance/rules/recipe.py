"""compat.recipe_record: the recipe's source, status and check date (docs/checks.md)."""

from __future__ import annotations

import datetime as dt

from ..core.findings import Consequence, Finding, Status
from ..core.profile import Profile
from ..core.rundir import PROFILE_EVIDENCE  # the profile copy every run holds (run.record_profile)
from .context import finding
from .registry import missing

# --- compat.recipe_record -------------------------------------------------------------------



def check_recipe_record(profile: Profile, today: dt.date | None = None) -> Finding:
    """The recipe's source, status and check date are recorded; a pre-release recipe not re-checked
    within review.period_days is flagged (the recipe moves; a change reopens acceptance)."""
    today = today or dt.datetime.now(dt.UTC).date()
    recipe = profile.model.at("recipe") or {}
    observed = {"source": recipe.get("source"), "status": recipe.get("status"),
                "checked": recipe.get("checked"), "notes": recipe.get("notes", [])}
    rule = "recipe source, status and check date recorded; a pre-release recipe re-checked within review.period_days"
    if not all(observed[k] for k in ("source", "status", "checked")):
        return missing("compat.recipe_record", None, "profile lacks recipe.source/status/checked")
    try:
        age = (today - dt.date.fromisoformat(str(recipe["checked"]))).days
    except ValueError:
        return missing("compat.recipe_record", None, f"recipe.checked {recipe['checked']!r} is not a date")
    observed["age_days"] = age
    period = int(profile.model.review.period_days)
    expected = {"recorded": True, "max_age_days_if_pre_release": period}
    if recipe["status"] in ("pre-release", "experimental") and age > period:
        return finding("compat.recipe_record", Status.WARN, None, observed=observed,
                       expected=expected, rule=rule, consequence=Consequence.LIMIT, evidence=[PROFILE_EVIDENCE],
                       reason=f"{recipe['status']} recipe last checked {age} days ago (> {period})",
                       action=f"re-check {recipe['source']} and update profiles/{profile.name}.yml "
                              "(a changed recipe reopens acceptance)")
    return finding("compat.recipe_record", Status.PASS, None, observed=observed,
                   expected=expected, rule=rule, action="none", evidence=[PROFILE_EVIDENCE])
