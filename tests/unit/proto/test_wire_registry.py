"""The message registry and the naming convention, checked mechanically.

A message's name says its kind (suffix) and its docstring opens with its direction
(``"ingress → broker: ..."`` or ``"both ways: ..."``). Ingress ↔ broker commands are 0x01–0x0F,
broker ↔ worker 0x10–0x1F.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import proto_msgs
from proto_msgs import REGISTRY, Message, messages

DEFINED = [
    cls
    for _, cls in inspect.getmembers(messages, inspect.isclass)
    if issubclass(cls, Message) and cls is not Message and cls.__module__ == messages.__name__
]

# Kind suffix → the directions a message of that kind may travel.
KINDS: dict[str, set[tuple[str, str]]] = {
    "Request": {("ingress", "broker")},
    "Ping": {("ingress", "broker")},
    "Reply": {("broker", "ingress")},
    "Pong": {("broker", "ingress")},
    "Result": {("broker", "ingress"), ("worker", "broker")},
    "Error": {("broker", "ingress"), ("worker", "broker")},
    "Assign": {("broker", "worker")},
    "Ready": {("worker", "broker")},
    "Heartbeat": {("both", "ways")},
    "Disconnect": {("both", "ways")},
}
NAME = re.compile(rf"^(?:[A-Z][a-z]+)*({'|'.join(KINDS)})$")
DIRECTION = re.compile(
    r"^\s*(ingress|broker|worker) → (ingress|broker|worker)\b|^\s*(both) (ways)\b"
)
# Commands of the ingress ↔ broker link and of the broker ↔ worker link ("both ways" messages
# are the worker link's liveness messages).
RANGES = {"ingress": range(0x01, 0x10), "worker": range(0x10, 0x20)}


def direction(cls: type) -> tuple[str, str]:
    match = DIRECTION.match(cls.__doc__ or "")
    assert match, f"{cls.__name__}: docstring must open with 'a → b:' or 'both ways:'"
    return tuple(g for g in match.groups() if g is not None)  # type: ignore[return-value]


def test_messages_module_defines_some_messages():
    assert len(DEFINED) >= 14


def test_every_message_class_is_registered_under_its_own_command_byte():
    for cls in DEFINED:
        assert REGISTRY.get(cls.COMMAND) is cls, f"{cls.__name__} is not registered"
    assert set(REGISTRY.values()) == set(DEFINED)


def test_command_bytes_are_unique_single_bytes():
    commands = [cls.COMMAND for cls in DEFINED]
    assert len(commands) == len(set(commands))
    assert all(isinstance(c, int) and 0 < c <= 0xFF for c in commands)


def test_every_message_is_exported_by_the_package():
    for cls in DEFINED:
        assert getattr(proto_msgs, cls.__name__) is cls
        assert cls.__name__ in proto_msgs.__all__


@pytest.mark.parametrize("cls", DEFINED, ids=lambda cls: cls.__name__)
def test_message_is_a_documented_dataclass(cls):
    assert dataclasses.is_dataclass(cls)
    assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(")  # not the dataclass stub


@pytest.mark.parametrize("cls", DEFINED, ids=lambda cls: cls.__name__)
def test_message_name_says_its_kind_and_the_kind_fits_its_direction(cls):
    match = NAME.match(cls.__name__)
    assert match, f"{cls.__name__}: name must end in one of {sorted(KINDS)}"
    kind = match.group(1)
    assert direction(cls) in KINDS[kind], f"{cls.__name__}: a {kind} cannot go {direction(cls)}"


@pytest.mark.parametrize("cls", DEFINED, ids=lambda cls: cls.__name__)
def test_command_byte_is_in_the_range_of_its_link(cls):
    sender, receiver = direction(cls)
    link = "ingress" if "ingress" in (sender, receiver) else "worker"
    assert cls.COMMAND in RANGES[link], f"{cls.__name__}: {cls.COMMAND:#04x} outside its range"


def test_requests_with_an_answer_have_their_reply_kind():
    names = {cls.__name__ for cls in DEFINED}
    for name in names:
        if name.endswith("Reply"):
            assert name.removesuffix("Reply") + "Request" in names
    assert {"Ping", "Pong"} <= names
