"""Plain data records, declared the way pydantic models are, for data that gputopo builds itself
and never needs to validate: the host facts of discovery.

Importing this module imports nothing heavy (no ``typing``, ``dataclasses`` or pydantic): on a
small host those imports alone take longer than ``lspci`` needs for the whole listing, and
discovery must start at lspci's pace. A record is a class whose annotated attributes are its fields (the
module declaring it uses ``from __future__ import annotations``, so annotations stay text and
cost nothing); a field's default is a plain value or :func:`Field`::

    class Link(Record):
        current_speed: str | None = None
        width: int | None = Field(None, description="lanes")

Records are built with keyword arguments (a field's ``alias`` works too; positional arguments
fill the fields in order), compare by type and field values, and offer the part of pydantic's
model API that gputopo uses: ``model_fields``, ``model_dump``, ``model_dump_json``,
``model_copy``. The JSON Schema and validation (``model_json_schema``, ``model_validate``,
``model_validate_json``) come from pydantic itself, through a model it builds from the
declarations on first use (:mod:`gputopo.model.mirror`): the schema and the checks are
pydantic's, only the cheap half is done here.
"""

from __future__ import annotations

from enum import Enum

from gputopo.model.declare import MISSING, Declared, Field, FieldInfo, Literal, LiteralText

__all__ = ["Field", "FieldInfo", "Literal", "LiteralText", "Record"]


class Record(Declared):
    """Base of the record classes; ``class X(Record, frozen=True)`` makes an immutable,
    hashable one. ``model_config`` (a plain dict, as pydantic's ``ConfigDict``) is handed to
    pydantic for the schema and validation."""

    _aliases: dict[str, str] = {}
    # what __init__ needs, worked out once per class: plain defaults, default factories
    # (mutable plain defaults are copied), the required fields
    _defaults: dict = {}
    _factories: tuple = ()
    _required: frozenset = frozenset()

    def __init_subclass__(cls, frozen: bool = False, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        fields = dict(cls.model_fields)  # inherited fields first, in their order
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            value = cls.__dict__.get(name, MISSING)
            info = value if isinstance(value, FieldInfo) else FieldInfo(value)
            if isinstance(value, FieldInfo):
                delattr(cls, name)  # the class attribute would shadow nothing and mislead readers
            info.name, info.annotation = name, str(annotation)
            fields[name] = info
        cls.model_fields = fields
        cls._record_parent = next(
            (b for b in cls.__bases__ if issubclass(b, Record) and b is not Record), None
        )
        cls._aliases = {f.alias: n for n, f in fields.items() if f.alias}
        cls._required = frozenset(n for n, f in fields.items() if f.is_required)
        optional = [(n, f) for n, f in fields.items() if not f.is_required]
        cls._factories = tuple(
            (n, f.make_default)
            for n, f in optional
            if f.default_factory is not None or type(f.default) in (list, dict, set)
        )
        cls._defaults = {n: f.default for n, f in optional if (n, f.make_default) not in cls._factories}
        if frozen:
            cls._frozen = True
            cls.__hash__ = Record._hash

    def __init__(self, *args, **data) -> None:
        """Set every field from ``args`` (in field order), ``data`` (by name or alias) or its
        default. Raises TypeError for an unknown field, a field given twice or a missing one."""
        cls = type(self)
        fields = cls.model_fields
        if args:
            if len(args) > len(fields):
                raise TypeError(f"{cls.__name__} takes at most {len(fields)} positional arguments")
            given = dict(zip(fields, args))
            if given.keys() & data.keys():
                raise TypeError(
                    f"{cls.__name__}: field {sorted(given.keys() & data.keys())[0]!r} given twice"
                )
            data = {**given, **data}
        for alias, name in cls._aliases.items():
            if alias in data:
                if name in data:
                    raise TypeError(f"{cls.__name__}: field {name!r} given twice")
                data[name] = data.pop(alias)
        if not data.keys() <= fields.keys():
            raise TypeError(f"{cls.__name__}: unexpected field {sorted(data.keys() - fields.keys())[0]!r}")
        if not cls._required <= data.keys():
            raise TypeError(f"{cls.__name__}: missing field {sorted(cls._required - data.keys())[0]!r}")
        values = self.__dict__
        values.update(cls._defaults)
        for name, make in cls._factories:
            if name not in data:
                values[name] = make()
        values.update(data)

    def __setattr__(self, name: str, value) -> None:
        if self._frozen:
            raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")
        object.__setattr__(self, name, value)

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(self.__dict__[n] == other.__dict__[n] for n in self.model_fields)

    __hash__ = None  # mutable records are not hashable (frozen ones are)

    def _hash(self) -> int:
        return hash((type(self), *(self.__dict__[n] for n in self.model_fields)))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={self.__dict__[n]!r}" for n in self.model_fields)
        return f"{type(self).__name__}({inner})"

    # --- pydantic's model API, the part gputopo uses ----------------------------------------

    def model_dump(self, *, mode: str = "python", by_alias: bool = False) -> dict:
        """The fields as a dict (nested records as dicts); ``mode="json"`` gives enums as their
        values, ``by_alias`` keys fields by their alias."""
        return _dump(self, mode == "json", by_alias)

    def model_dump_json(self, *, indent: int | None = None, by_alias: bool = False) -> str:
        """The JSON text pydantic's ``model_dump_json`` gives for the same data (non-ASCII kept,
        no spaces without ``indent``)."""
        import json

        # check_circular=False: a record is a tree, and the check costs every list and dict
        return json.dumps(
            _dump(self, True, by_alias),
            indent=indent,
            ensure_ascii=False,
            check_circular=False,
            separators=(",", ": ") if indent is not None else (",", ":"),
        )

    def model_copy(self, *, update: dict | None = None, deep: bool = False):
        """A copy (``deep``: nested records and lists copied too) with ``update`` applied."""
        import copy

        new = copy.deepcopy(self) if deep else copy.copy(self)
        for name, value in (update or {}).items():
            new.__dict__[name] = value
        return new

    @classmethod
    def model_validate(cls, data):
        """A record from plain data, checked by pydantic. Raises pydantic's ValidationError."""
        from gputopo.model.mirror import validate

        return validate(cls, data)

    @classmethod
    def model_validate_json(cls, text: str | bytes):
        """A record from JSON text, checked by pydantic. Raises pydantic's ValidationError."""
        from gputopo.model.mirror import validate_json

        return validate_json(cls, text)

    @classmethod
    def model_json_schema(cls, by_alias: bool = True, mode: str = "validation") -> dict:
        """The JSON Schema pydantic gives for these declarations."""
        from gputopo.model.mirror import mirror

        return mirror(cls).model_json_schema(by_alias=by_alias, mode=mode)


def _dump(value, json_mode: bool, by_alias: bool):
    if isinstance(value, Record):
        fields = value.model_fields
        d = value.__dict__
        if by_alias:
            return {(f.alias or n): _dump(d[n], json_mode, by_alias) for n, f in fields.items()}
        return {n: _dump(d[n], json_mode, by_alias) for n in fields}
    t = type(value)
    if t in (str, int, bool, float) or value is None:
        return value
    if t in (list, tuple):
        return [_dump(v, json_mode, by_alias) for v in value]
    if t is dict:
        return {k: _dump(v, json_mode, by_alias) for k, v in value.items()}
    if json_mode and isinstance(value, Enum):
        return value.value
    return value
