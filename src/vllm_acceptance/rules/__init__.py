"""The checks: the catalog (catalog.py) over its registry (registry.py), and one small rule per check.

Importing the package registers every catalogued check, so a lookup in the registry never meets an empty
catalog and the registry needs no import back up to the catalog (docs/architecture.md "Adding a check").
"""

from . import catalog  # noqa: F401 - registers every check id
