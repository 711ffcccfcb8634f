"""The one strict base of gputopo's pydantic models.

An unknown field is an error (``extra="forbid"``): a spec with a typo, a journal or a document
from another version fails naming the field instead of losing it silently. Models that need more
configuration add it in their own ``model_config``; pydantic merges it with this one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A pydantic model that refuses unknown fields."""

    model_config = ConfigDict(extra="forbid")
