"""Each HTTP request body declared once: a dataclass whose fields carry their rule, from which
both the decoding (:func:`decode`: orjson, then each field's check, with this ingress's
statuses and messages) and the OpenAPI 3.0 schema (:func:`schema_of`) come.

A rule is what a field's JSON value must be: its check (the value, or the value converted, e.g.
a lane; ``ApiError`` naming the field otherwise) and its schema, side by side in one class, so
that a bound or an enum cannot be enforced one way and described another. The shapes JSON
Schema says with ``oneOf`` (``input``: a text, texts, token ids, lists of them) are rules of
their own beside their route, each with its check and its schema in one place too.

Why not pydantic or msgspec: the bodies are few and their messages and statuses are part of
the API (400 not an object, 422 a wrong value naming the field, 413 over ``--max-inputs``, TEI's
400 ``Empty``), ``--max-inputs`` is a setting known only at start, and the inputs are unions of
list shapes that msgspec cannot declare (its typed decoding would save under a microsecond a
body, against a request's hundreds). Decoding with orjson and checking here costs what checking
by hand does: a few microseconds a body, within a microsecond of hand-written parsers.

A JSON ``null`` counts as absent, as the parsers always read it; a default is described with
its field. Unknown fields are ignored, as TEI (serde) and OpenAI-compatible servers do; each
route's description says so (:data:`IGNORED`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Any, ClassVar, TypeVar

import orjson

from mesh.ingress.http_errors import ApiError

Schema = dict[str, Any]
T = TypeVar("T")

IGNORED = "Fields not described here are ignored (as TEI and OpenAI-compatible servers do)."


def json_type(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ApiError (malformed: 400)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError.malformed(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError.malformed("the body must be a JSON object")
    return doc


class Rule:
    """What one field's value must be. ``check`` returns the value to keep (converted where
    the rule says) or raises ``ApiError`` naming ``name``; ``max_inputs`` is the server's
    --max-inputs, for rules that count inputs."""

    described: ClassVar[bool] = True  # False: left out of the schema (the body's text says why)

    def check(self, value: Any, name: str, max_inputs: int) -> Any:
        raise NotImplementedError

    def schema(self, max_inputs: int) -> Schema:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Text(Rule):
    """A string; ``min_length`` 1: not empty."""

    min_length: int = 1

    def check(self, value: Any, name: str, max_inputs: int) -> str:
        if type(value) is not str:
            raise ApiError.invalid(f"'{name}' must be a string; got {json_type(value)}", name)
        if len(value) < self.min_length:
            raise ApiError.invalid(f"'{name}' must be a non-empty string", name)
        return value

    def schema(self, max_inputs: int) -> Schema:
        return {"type": "string", **({"minLength": self.min_length} if self.min_length else {})}


@dataclasses.dataclass(frozen=True)
class Flag(Rule):
    """``true`` or ``false`` (not 0 or 1)."""

    def check(self, value: Any, name: str, max_inputs: int) -> bool:
        if type(value) is not bool:
            raise ApiError.invalid(f"'{name}' must be true or false; got {json_type(value)}", name)
        return value

    def schema(self, max_inputs: int) -> Schema:
        return {"type": "boolean"}


@dataclasses.dataclass(frozen=True)
class Integer(Rule):
    """A JSON integer (not a boolean, not 3.0) within ``minimum``..``maximum``."""

    minimum: int | None = None
    maximum: int | None = None

    def check(self, value: Any, name: str, max_inputs: int) -> int:
        if type(value) is not int:
            raise ApiError.invalid(f"'{name}' must be an integer; got {json_type(value)}", name)
        if self.minimum is not None and value < self.minimum:
            raise ApiError.invalid(f"'{name}' must be at least {self.minimum}; got {value}", name)
        if self.maximum is not None and value > self.maximum:
            raise ApiError.invalid(f"'{name}' must be at most {self.maximum}; got {value}", name)
        return value

    def schema(self, max_inputs: int) -> Schema:
        out: Schema = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


@dataclasses.dataclass(frozen=True)
class Number(Rule):
    """A finite JSON number of at least ``minimum``, kept as a float."""

    minimum: float = 0.0

    def check(self, value: Any, name: str, max_inputs: int) -> float:
        if type(value) not in (int, float) or not self.minimum <= value < math.inf:
            raise ApiError.invalid(f"'{name}' must be a number >= {self.minimum:g}", name)
        return float(value)

    def schema(self, max_inputs: int) -> Schema:
        return {"type": "number", "minimum": self.minimum}


@dataclasses.dataclass(frozen=True)
class Choice(Rule):
    """One of the strings ``values`` names, kept as what it maps to."""

    values: Mapping[str, Any]

    def check(self, value: Any, name: str, max_inputs: int) -> Any:
        try:
            return self.values[value]
        except (KeyError, TypeError):  # TypeError: a list or an object is not hashable
            raise ApiError.invalid(
                f"'{name}' must be one of {', '.join(self.values)}; got {value!r}", name
            ) from None

    def schema(self, max_inputs: int) -> Schema:
        return {"type": "string", "enum": list(self.values)}


def choice(*names: str) -> Choice:
    """A :class:`Choice` of ``names`` kept as they are."""
    return Choice({n: n for n in names})


@dataclasses.dataclass(frozen=True)
class Shaped(Rule):
    """A value of several JSON shapes (a ``oneOf``): its check and its schema, written as a
    pair beside the route that reads it."""

    checker: Callable[[Any, str, int], Any]
    describe: Callable[[int], Schema]

    def check(self, value: Any, name: str, max_inputs: int) -> Any:
        return self.checker(value, name, max_inputs)

    def schema(self, max_inputs: int) -> Schema:
        return self.describe(max_inputs)


@dataclasses.dataclass(frozen=True)
class Fixed(Rule):
    """A field a route does not serve although a sibling route does: only ``value`` (what the
    route does anyway) passes; anything else is refused naming the route, rather than answered
    as if it had been honoured. Not in the schema; the body's description names it."""

    value: Any
    route: str
    described: ClassVar[bool] = False

    def check(self, value: Any, name: str, max_inputs: int) -> Any:
        if value is not self.value:
            raise ApiError.invalid(
                f"'{name}' does not apply to {self.route}, whose vectors are returned as they "
                "are (see GET /info); leave it out",
                name,
            )
        return value

    def schema(self, max_inputs: int) -> Schema:
        return {}


def field(
    rule: Rule,
    *,
    default: Any = None,
    description: str | None = None,
    required: bool = False,
    key: str | None = None,
) -> Any:
    """A body field: its rule, its JSON default (absent from the body: the default, checked
    now; None: absent, not described), its description; ``required``: absent is a 422;
    ``key``: its name in the JSON when not the attribute's."""
    kept = None if default is None else rule.check(default, "default", 1 << 30)
    meta = {"rule": rule, "json_default": default, "description": description, "key": key}
    if required:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=kept, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to decode one body class, made once: each JSON key's attribute and check, the
    defaults (converted), the required keys, the class's cross-field check."""

    checks: dict[str, tuple[str, Callable[[Any, str, int], Any]]]
    defaults: dict[str, Any]
    required: tuple[tuple[str, str], ...]  # (JSON key, attribute)
    post_init: Callable[[Any], None] | None


_PLANS: dict[type, Plan] = {}


def _check_of(rule: Rule) -> Callable[[Any, str, int], Any]:
    # A shaped rule's own function, one call fewer on every request.
    return rule.checker if isinstance(rule, Shaped) else rule.check


def plan_of(cls: type) -> Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        fields = [f for f in dataclasses.fields(cls) if "rule" in f.metadata]
        keys = {f.name: f.metadata["key"] or f.name for f in fields}
        plan = Plan(
            checks={keys[f.name]: (f.name, _check_of(f.metadata["rule"])) for f in fields},
            defaults={f.name: None if f.default is MISSING else f.default for f in fields},
            required=tuple((keys[f.name], f.name) for f in fields if f.default is MISSING),
            post_init=getattr(cls, "__post_init__", None),
        )
        _PLANS[cls] = plan
    return plan


def decode(cls: type[T], body: bytes, max_inputs: int) -> T:
    """The body as ``cls``: 400 when it is not a JSON object, else :func:`from_doc`."""
    return from_doc(cls, json_object(body), max_inputs)


def from_doc(cls: type[T], doc: Mapping[str, Any], max_inputs: int) -> T:
    """``cls`` from a parsed body: each declared field present checked (the first wrong one in
    the body's order is the 422), then the required ones present, then the class's own
    ``__post_init__`` across fields. Built without ``__init__``: the values are checked."""
    plan = plan_of(cls)
    values = plan.defaults.copy()
    checks = plan.checks
    # The body's keys, not the declaration's: a body names few of the optional fields.
    for key, value in doc.items():
        entry = checks.get(key)
        if entry is not None and value is not None:
            values[entry[0]] = entry[1](value, key, max_inputs)
    for key, attr in plan.required:
        if values[attr] is None:
            raise ApiError.invalid(f"'{key}' is required", key)
    out = object.__new__(cls)
    out.__dict__ = values
    if plan.post_init is not None:
        plan.post_init(out)
    return out


def schema_of(cls: type, max_inputs: int) -> Schema:
    """The OpenAPI 3.0 schema of ``cls``'s body: each field's rule, default and description,
    the required ones, and the class's description with what happens to other fields."""
    props: Schema = {}
    required = []
    for f in dataclasses.fields(cls):
        if "rule" not in f.metadata or not f.metadata["rule"].described:
            continue
        prop = f.metadata["rule"].schema(max_inputs)
        if f.metadata["json_default"] is not None:
            prop["default"] = f.metadata["json_default"]
        if f.metadata["description"]:
            prop["description"] = f.metadata["description"]
        key = f.metadata["key"] or f.name
        props[key] = prop
        if f.default is MISSING:
            required.append(key)
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    out["description"] = " ".join(filter(None, (getattr(cls, "DESCRIPTION", ""), IGNORED)))
    return out


def field_rules(cls: type) -> dict[str, Rule]:
    """Each declared field's rule, by its JSON key (tests read them)."""
    return {
        f.metadata["key"] or f.name: f.metadata["rule"]
        for f in dataclasses.fields(cls)
        if "rule" in f.metadata
    }
