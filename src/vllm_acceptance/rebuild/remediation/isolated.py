"""The isolated environment route's record in its inventory: owner, review date and criteria for moving back
(docs/acceptance.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

ISOLATED_VARS = {
    "isolated_env_owner": "owner",
    "isolated_env_review_date": "review_date",
    "isolated_env_move_back_criteria": "move_back_criteria",
    "isolated_env_shared_inventory": "shared_inventory",
}


def isolated_environment_record(inventory_vars: Mapping[str, Any], today: dt.date | None = None) -> dict[str, Any]:
    """The record an isolated environment's inventory must carry (docs/acceptance.md: owner, review date and
    criteria for moving back; its results do not carry over to the shared cluster by themselves).
    Returns {owner, review_date, move_back_criteria, shared_inventory, complete, problems, note};
    an overdue review date is a problem (a temporary environment must not become permanent by inertia)."""
    today = today or dt.datetime.now(dt.UTC).date()
    record: dict[str, Any] = {key: inventory_vars.get(var) for var, key in ISOLATED_VARS.items()}
    problems = [f"{var} is not set" for var, key in ISOLATED_VARS.items()
                if key != "shared_inventory" and not str(record[key] or "").strip()]
    if record["review_date"]:
        try:
            review = dt.date.fromisoformat(str(record["review_date"]))
        except ValueError:
            problems.append(f"isolated_env_review_date {record['review_date']!r} is not YYYY-MM-DD")
        else:
            if review < today:
                problems.append(f"review date {review} has passed: review the environment (move back or extend)")
    record["complete"] = not problems
    record["problems"] = problems
    record["note"] = ("results of this isolated environment do not carry over to the shared cluster"
                      + (f" ({record['shared_inventory']})" if record["shared_inventory"] else "")
                      + " by themselves")
    return record
