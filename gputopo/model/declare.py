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


class _ChoicesType(type):
    """The metaclass of :class:`Choices`: the class lists its members, in order, as an Enum
    class does (``list(MemberRole)``, ``len``, ``__members__``)."""

    def __iter__(cls):
        return iter(cls._members.values())

    def __len__(cls) -> int:
        return len(cls._members)

    @property
    def __members__(cls) -> dict:
        return dict(cls._members)


class Choices(str, metaclass=_ChoicesType):
    """A string enumeration for a module that must not import enum (importing it costs
    discovery's start-up a third of Python's own): ``class Role(Choices)`` with ``GPU = "gpu"``
    behaves as ``class Role(str, Enum)`` does where gputopo uses one. Each upper-case string
    attribute becomes a member: a ``Role`` that is equal to, and hashes as, its value;
    ``Role.GPU.name`` is ``"GPU"``, ``.value`` is ``"gpu"``; ``Role("gpu")`` is ``Role.GPU``
    (a ValueError for a value that is none); repr, str and format are Enum's. Pydantic sees an
    Enum of the same name, docstring and values (:mod:`gputopo.model.mirror`), so the schema and
    validation are an Enum's too."""

    _members: dict = {}
    _by_value: dict = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._members, cls._by_value = {}, {}
        for name, value in list(vars(cls).items()):
            if name.isupper() and type(value) is str:
                member = str.__new__(cls, value)
                member._name_ = name
                setattr(cls, name, member)
                cls._members[name] = cls._by_value[value] = member

    def __new__(cls, value):
        if type(value) is cls:
            return value
        try:
            return cls._by_value[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid {cls.__qualname__}") from None

    @property
    def name(self) -> str:
        return self._name_

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self._name_}: {str.__repr__(self)}>"

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self._name_}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __reduce_ex__(self, protocol):
        return type(self), (str.__str__(self),)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self
