"""Pydantic's view of the record classes of :mod:`gputopo.model.record`: for each record class a
pydantic model with the same name, docstring, fields, defaults, aliases, descriptions and
config, built on first use. Its JSON Schema is the records' schema (``gputopo schema facts``)
and its validation is how plain data becomes records (``Facts.model_validate_json``).
"""

from __future__ import annotations

import sys
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model
from pydantic import Field as PydanticField

from gputopo.model.declare import Declared, LiteralText

_MIRRORS: dict[type, type[BaseModel]] = {}
_RECORDS: dict[type[BaseModel], type] = {}
_MISSING = object()


class _Names(dict):
    """The names an annotation may use besides its module's: a record class stands for its
    mirror (built when first named), and typing's names are there for annotations written
    without importing them."""

    def __init__(self, module_globals: dict[str, Any]):
        super().__init__()
        self.module_globals = module_globals

    def __missing__(self, key: str) -> Any:
        value = self.module_globals.get(key, _MISSING)
        if isinstance(value, type) and issubclass(value, Declared):
            return mirror(value)
        if isinstance(value, LiteralText):
            return typing.Literal
        if value is not _MISSING:
            return value
        if hasattr(typing, key):
            return getattr(typing, key)
        raise KeyError(key)


def _annotation(text: str, names: _Names) -> Any:
    value = eval(text, {"__builtins__": __builtins__}, names)
    # an alias written as text (X = "Literal['a']") is text once more
    return _annotation(value, names) if isinstance(value, str) else value


def mirror(cls: type) -> type[BaseModel]:
    """The pydantic model of the record class ``cls`` (built once)."""
    if cls in _MIRRORS:
        return _MIRRORS[cls]
    parent = cls._record_parent
    base: type[BaseModel] = BaseModel if parent is None else mirror(parent)
    if parent is None or (cls._frozen and not parent._frozen):
        config = ConfigDict(**cls.model_config, frozen=cls._frozen)
        base = type(f"{cls.__name__}Base", (base,), {"model_config": config, "__module__": cls.__module__})
    names = _Names(vars(sys.modules[cls.__module__]))
    mine = cls.__dict__.get("__annotations__", {})
    own = {n: f for n, f in cls.model_fields.items() if n in mine}
    definitions: dict[str, Any] = {}
    for name, f in own.items():
        kwargs: dict[str, Any] = {}
        if f.default_factory is not None:
            kwargs["default_factory"] = f.default_factory
        elif not f.is_required:
            kwargs["default"] = f.default
        if f.alias:
            kwargs["alias"] = f.alias
        if f.description is not None:
            kwargs["description"] = f.description
        definitions[name] = (_annotation(f.annotation, names), PydanticField(**kwargs))
    model = create_model(
        cls.__name__, __base__=base, __doc__=cls.__doc__, __module__=cls.__module__, **definitions
    )
    _MIRRORS[cls] = model
    _RECORDS[model] = cls
    return model


def to_record(value: Any) -> Any:
    """A validated pydantic value turned into records (models into their record classes)."""
    if isinstance(value, BaseModel):
        cls = _RECORDS[type(value)]
        return cls(**{n: to_record(getattr(value, n)) for n in cls.model_fields})
    if isinstance(value, list):
        return [to_record(v) for v in value]
    if isinstance(value, dict):
        return {k: to_record(v) for k, v in value.items()}
    return value


def validate(cls: type, data: Any) -> Any:
    """``data`` checked by pydantic against ``cls``'s declarations, as a ``cls`` record.
    Raises pydantic's ValidationError."""
    if isinstance(data, cls):
        return data
    return to_record(mirror(cls).model_validate(data))


def validate_json(cls: type, text: str | bytes) -> Any:
    """JSON text checked by pydantic against ``cls``'s declarations, as a ``cls`` record.
    Raises pydantic's ValidationError."""
    return to_record(mirror(cls).model_validate_json(text))
