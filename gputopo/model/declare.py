"""What a record class declares, read by both halves of a record: its fields
(:class:`FieldInfo`, made by :func:`Field`), ``Literal[...]`` as text, and :class:`Declared`,
the base that marks a record class and names the class attributes its declarations live in.

Below :mod:`gputopo.model.record` (the cheap half: building, comparing, dumping records) and
:mod:`gputopo.model.mirror` (pydantic's schema and validation of them), so the record imports
its mirror and the mirror imports only this. Like the record, it imports nothing heavy.
"""

from __future__ import annotations

MISSING = object()


class FieldInfo:
    """A field's declaration: default (or factory), JSON alias, description; ``annotation`` is
    the annotation's text."""

    __slots__ = ("name", "annotation", "default", "default_factory", "alias", "description")

    def __init__(self, default=MISSING, default_factory=None, alias=None, description=None):
        self.name = ""
        self.annotation = ""
        self.default = default
        self.default_factory = default_factory
        self.alias = alias
        self.description = description

    @property
    def is_required(self) -> bool:
        return self.default is MISSING and self.default_factory is None

    def make_default(self):
        """A fresh default value; a mutable plain default is copied, as pydantic does."""
        if self.default_factory is not None:
            return self.default_factory()
        d = self.default
        return type(d)(d) if type(d) in (list, dict, set) else d


class LiteralText:
    """``Literal[...]`` for a module that must not import typing: ``Literal["a", "b"]`` gives the
    type's text, which pydantic reads when it builds the schema (:mod:`gputopo.model.mirror`),
    so an alias such as ``Kind = Literal["a", "b"]`` works in annotations as typing's does."""

    def __getitem__(self, values) -> str:
        values = values if isinstance(values, tuple) else (values,)
        return f"Literal[{', '.join(map(repr, values))}]"


Literal = LiteralText()


def Field(default=MISSING, *, default_factory=None, alias=None, description=None):
    """A field's declaration: ``x: int | None = Field(None, description="...")``; the subset of
    :func:`pydantic.Field` that records use."""
    return FieldInfo(default, default_factory, alias, description)


class Declared:
    """The root of the record classes (:class:`gputopo.model.record.Record` subclasses it): what
    a record class declares, as :mod:`gputopo.model.mirror` reads it. ``model_fields``: the
    fields, inherited first, in order; ``model_config``: pydantic's config, a plain dict;
    ``_frozen``: immutable and hashable; ``_record_parent``: the record class it extends, or
    None for one that extends only the root."""

    model_fields: dict[str, FieldInfo] = {}
    model_config: dict = {}
    _frozen = False
    _record_parent: type | None = None
