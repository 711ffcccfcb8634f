"""Reading YAML the way a spec is read (PCI addresses stay text, duplicate keys and documents
nested too deeply are refused) and pydantic's validation errors as one line naming the file, the
field path and what was expected. Used for specs and for the simulator's host fixtures."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from gputopo.errors import SpecError


def _loc_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = str(part)
        # pydantic names union members and validators in the location; they are not fields
        if "[" in text or "'" in text or text in ("GpuSelector", "str", "int"):
            continue
        out += ("." if out else "") + text
    return out


def _expected(err: Any) -> str:
    """What the field should have been, from one pydantic error (without pydantic's prefixes)."""
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid"))
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if msg.startswith("Assertion failed, "):
        msg = msg[len("Assertion failed, ") :]
    got = err.get("input")
    if kind not in ("value_error",) and not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    return msg.replace("\n", " ")


def _other_branch(err: Any) -> bool:
    """True for the error of a union branch the input does not have the shape of (the
    ``'rest'`` literal of ``gpus`` when a selector was given)."""
    return any(isinstance(p, str) and "literal[" in p for p in err["loc"])


def format_validation_error(file: str, exc: ValidationError) -> SpecError:
    """The first error of ``exc`` as one SpecError (file, field path, what was expected), with
    ``(+N more)`` when other fields are wrong too."""
    errors = exc.errors()
    # a union reports every branch; the error of the branch matching the input's shape is the useful one
    real = [e for e in errors if not _other_branch(e)] or errors
    chosen = real[0]
    path = _loc_path(tuple(chosen["loc"]))
    expected = _expected(chosen)
    # a model validator's message may start with a sub-path: fold it into the field path
    if ": " in expected and chosen.get("type") == "value_error":
        head, rest = expected.split(": ", 1)
        if head and " " not in head:
            path = f"{path}.{head}" if path else head
            expected = rest
    others = len({_loc_path(tuple(e["loc"])) for e in real}) - 1
    if others > 0:
        expected += f" (+{others} more)"
    return SpecError(file, path, expected)


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 numbers: an unquoted ``0000:01:00.0`` is the PCI
    address the operator wrote (as in YAML 1.2), not the number 60.0."""

    def resolve(self, kind, value, implicit):
        tag = super().resolve(kind, value, implicit)
        if kind is yaml.ScalarNode and implicit[0] and ":" in value and tag in _NUMBER_TAGS:
            return "tag:yaml.org,2002:str"
        return tag

    def construct_mapping(self, node, deep=False):
        # PyYAML keeps the last of two equal keys; in a strict spec the first would vanish unseen
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
MAX_DEPTH = 32  # a spec is a few levels deep


def load_yaml(text: str, file: str) -> Any:
    """The data of YAML ``text``, read like a spec (addresses stay text: see _SpecLoader).

    Raises SpecError (file, no field) naming the line and column of a syntax error.
    """
    try:
        # PyYAML composes and constructs nested nodes recursively: hundreds of levels exhaust
        # Python's stack (and what runs on top of it) before any error could name the file.
        # Its parser is not recursive: count the depth on its events first.
        depth = 0
        for event in yaml.parse(text, Loader=_SpecLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    raise SpecError(
                        file,
                        "",
                        f"nested too deeply to be a spec (more than {MAX_DEPTH} levels at "
                        f"line {mark.line + 1}, column {mark.column + 1})",
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_SpecLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise SpecError(file, "", f"YAML syntax error at {where}{problem}") from None
