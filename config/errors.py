"""The kinds of refusal the domain apps raise and the API and pages answer, defined below the
apps so the project's API plumbing (config/api/exceptions.py) can turn them into responses
without importing any app.

No ORM here: fleet/placement.py, a module of pure rules, raises these.
"""


class Refusal(Exception):
    """A rule refused a change. `violation_dicts()` lists `{"rule", "message"}` so a script can match
    the rule and a person can read the numbers; the API answers 400."""

    def violation_dicts(self) -> list[dict]:
        return []


class ConflictRefusal(Refusal):
    """The data changed between the check and the write; trying again may give another answer.
    The API answers 409."""
