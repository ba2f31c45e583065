"""Frames of a message, built and parsed only here.

A message is ``[header][msgpack body][payload frame]...``:

- header: 4 bytes, ``MAGIC`` (2) + ``VERSION`` (1) + command byte (1);
- body: a msgpack map of the message's plain fields, plus ``"_a"``, the descriptors of the raw
  payload frames in frame order: ``[field, dtype, shape]`` for arrays, ``[field, "bytes", len]``
  for blobs;
- payload: one frame per array or blob, raw little-endian bytes; large ones are handed to zmq
  without copying (``send_multipart(..., copy=False)``) and decoded with ``np.frombuffer``. An
  optional array (``np.ndarray | None``) that is None sends no frame, and a peer from before
  it was added (which never sends one) decodes as None.

Decoding validates every field against the message's type hints and every frame against its
descriptor and ``limits``; any mismatch raises ``ProtocolError``. A body field declared with a
default may be absent (a peer from before it was added) and takes its default; any other
absent field is an error. The hints are read once per message class into a ``_Plan`` (how
each field travels, one checker per body field), so a message costs only the checks themselves.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Union

import msgpack
import numpy as np

from proto_msgs import limits
from proto_msgs.errors import ProtocolError

MAGIC = b"\xe3m"
VERSION = 1
_HEADER = struct.Struct("<2sBB")

# Payload dtypes allowed on the wire, always little-endian.
WIRE_DTYPES: dict[str, np.dtype] = {
    "int32": np.dtype("<i4"),
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
}

Frame = Any  # bytes, memoryview, zmq.Frame or a numpy array (anything with the buffer protocol)


class Message:
    """Base of every wire message: a dataclass with a ``COMMAND`` byte, registered at import."""

    COMMAND: ClassVar[int]

    def validate(self) -> None:
        """Cross-field checks beyond the types; raise ProtocolError."""


REGISTRY: dict[int, type[Message]] = {}


def register(cls: type[Message]) -> type[Message]:
    """Class decorator: make ``cls`` a frozen-free dataclass and give it its command byte."""
    command = cls.COMMAND
    if command in REGISTRY:
        raise TypeError(f"command byte {command:#x} used twice: {REGISTRY[command]} and {cls}")
    REGISTRY[command] = cls
    return cls


# ---- plans: a message class's hints, read once -------------------------------------------------

Check = Callable[[Any], Any]  # a decoded body value → the field's value, or ProtocolError
# A field's default when a peer leaves it out (a peer from before the field was added): a
# factory, or None for a field without a default, which is then required.
Default = Callable[[], Any] | None
# The one type a value may have to be taken as it is, without calling its checker: int, float,
# bool or str for fields of those types (msgpack makes exactly these; a str within
# limits.MAX_STRING, see _fits), None for every other field. What it lets through is exactly
# what the checker would have returned unchanged.
Fast = type | None
BodyCheck = tuple[str, str, Check, Default, Fast]

# How a field travels: in the msgpack body, or as payload frames (one array, a list of arrays,
# one blob, one array or none).
_BODY, _ARRAY, _ARRAYS, _BLOB, _ARRAY_OPT = range(5)
_MISSING = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """What encoding and decoding one message class needs, worked out from its hints once."""

    name: str
    header: bytes  # the header frame: magic, version, command byte
    body_names: tuple[str, ...]  # body fields in declaration order, the body map's order
    payload_fields: tuple[tuple[str, int], ...]  # payload fields in declaration order, and how
    body: tuple[BodyCheck, ...]  # body fields: name, "missing" error, checker, default, fast
    payload: dict[str, tuple[int, str]]  # payload field → how it travels, "Class.field"
    lists: tuple[str, ...]  # the payload fields that are lists of arrays
    optional: tuple[str, ...]  # the payload fields that may be left out (None)


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    # Built on first use, not at @register: a hint may name a class declared further down.
    # Two threads racing here build equal plans; either may stay.
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _make_plan(cls)
    return plan


def _field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _travels(tp: Any) -> int:
    if tp is np.ndarray:
        return _ARRAY
    if tp == list[np.ndarray]:
        return _ARRAYS
    if tp == (np.ndarray | None):
        return _ARRAY_OPT
    return _BLOB if tp is bytes else _BODY


def _make_plan(cls: type) -> _Plan:
    hints = _field_hints(cls)
    fields = tuple((name, _travels(tp)) for name, tp in hints.items())
    body = {name: hints[name] for name, how in fields if how == _BODY}
    payload = tuple((name, how) for name, how in fields if how != _BODY)
    return _Plan(
        name=cls.__name__,
        header=_HEADER.pack(MAGIC, VERSION, cls.COMMAND),
        body_names=tuple(body),
        payload_fields=payload,
        body=_body_checks(body, cls.__name__, cls),
        payload={name: (how, f"{cls.__name__}.{name}") for name, how in payload},
        lists=tuple(name for name, how in fields if how == _ARRAYS),
        optional=tuple(name for name, how in fields if how == _ARRAY_OPT),
    )


def _body_checks(hints: dict[str, Any], where: str, cls: type) -> tuple[BodyCheck, ...]:
    defaults = {f.name: _default(f) for f in dataclasses.fields(cls)}
    return tuple(
        (
            name,
            f"{where}.{name}: missing",
            _checker(tp, f"{where}.{name}"),
            defaults[name],
            _fast_type(tp),
        )
        for name, tp in hints.items()
    )


def _fast_type(tp: Any) -> Fast:
    args = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)
    scalars = [a for a in args if a in (int, float, bool, str)]
    return scalars[0] if len(scalars) == 1 else None


def _fits(value: Any, fast: Fast) -> bool:
    """Whether ``value`` is taken as it is: of the field's fast type, and a str no longer than
    check_str allows (the limit read at each call, as there: tests change it)."""
    return type(value) is fast and (fast is not str or len(value) <= limits.MAX_STRING)


def _default(f: dataclasses.Field) -> Default:
    # Fields added later carry a default, so that a peer of the previous release, which
    # leaves them out, still decodes (without it: "missing"); never the other way round.
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    if f.default is not dataclasses.MISSING:
        value = f.default
        return lambda: value
    return None


def _read_body(value: dict[str, Any], checks: tuple[BodyCheck, ...], into: dict) -> dict:
    for name, missing, check, default, fast in checks:
        item = value.get(name, _MISSING)
        # Most fields: a checker call saved per field (_fits inlined, a call saved too).
        if type(item) is fast and (fast is not str or len(item) <= limits.MAX_STRING):
            into[name] = item
        elif item is _MISSING:
            if default is None:
                raise ProtocolError(missing)
            into[name] = default()
        else:
            into[name] = check(item)
    return into


def _checker(tp: Any, where: str) -> Check:
    """The checker of one body value of type ``tp``: validates (and lightly coerces) it."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union_checker(tp, where)
    if origin is list:
        return _list_checker(tp, where)
    if origin is dict:
        return _dict_checker(tp, where)
    if dataclasses.is_dataclass(tp):
        return _map_checker(tp, where)
    return _scalar_checker(tp, where)


def _union_checker(tp: Any, where: str) -> Check:
    args = typing.get_args(tp)
    nullable = type(None) in args
    options = tuple(_checker(arg, where) for arg in args if arg is not type(None))

    def check_union(value: Any) -> Any:
        if value is None and nullable:
            return None
        for option in options:
            try:
                return option(value)
            except ProtocolError:
                continue
        raise ProtocolError(f"{where}: {type(value).__name__} fits none of {tp}")

    return check_union


def _list_checker(tp: Any, where: str) -> Check:
    (item_tp,) = typing.get_args(tp)
    item, fast = _checker(item_tp, f"{where}[]"), _fast_type(item_tp)

    def check_list(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list")
        if len(value) > limits.MAX_SEQUENCES:
            raise ProtocolError(f"{where}: list too long")
        return [v if _fits(v, fast) else item(v) for v in value]

    return check_list


def _dict_checker(tp: Any, where: str) -> Check:
    ktp, vtp = typing.get_args(tp)
    key, val = _checker(ktp, f"{where}.key"), _checker(vtp, f"{where}.value")
    kfast, vfast = _fast_type(ktp), _fast_type(vtp)

    def check_dict(value: Any) -> dict[Any, Any]:
        if not isinstance(value, dict) or len(value) > limits.MAX_SEQUENCES:
            raise ProtocolError(f"{where}: expected a map")
        return {
            k if _fits(k, kfast) else key(k): v if _fits(v, vfast) else val(v)
            for k, v in value.items()
        }

    return check_dict


def _map_checker(cls: type, where: str) -> Check:
    checks = _body_checks(_field_hints(cls), where, cls)

    def check_map(value: Any) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map")
        return cls(**_read_body(value, checks, {}))

    return check_map


def _scalar_checker(tp: Any, where: str) -> Check:
    if tp is bool:

        def check_bool(value: Any) -> bool:
            if not isinstance(value, bool):
                raise ProtocolError(f"{where}: expected a bool")
            return value

        return check_bool
    if tp is int:

        def check_int(value: Any) -> int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProtocolError(f"{where}: expected an int")
            return value

        return check_int
    if tp is float:

        def check_float(value: Any) -> float:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ProtocolError(f"{where}: expected a number")
            return float(value)

        return check_float
    if tp is str:

        def check_str(value: Any) -> str:
            # The limit is read at each call, not captured: tests may change it.
            if not isinstance(value, str) or len(value) > limits.MAX_STRING:
                raise ProtocolError(f"{where}: expected a string")
            return value

        return check_str

    def unsupported(value: Any) -> Any:  # pragma: no cover
        raise ProtocolError(f"{where}: unsupported field type {tp}")

    return unsupported


# ---- encoding ---------------------------------------------------------------------------------

_DATACLASS_FIELDS: dict[type, tuple[str, ...] | None] = {}
_WIRE_NAMES: dict[np.dtype, str] = {v: k for k, v in WIRE_DTYPES.items()}


def _dataclass_fields(tp: type) -> tuple[str, ...] | None:
    names = _DATACLASS_FIELDS.get(tp, _MISSING)
    if names is _MISSING:
        names = _DATACLASS_FIELDS[tp] = (
            tuple(f.name for f in dataclasses.fields(tp)) if dataclasses.is_dataclass(tp) else None
        )
    return names  # type: ignore[return-value]


def _plain(value: Any) -> Any:
    """msgpack's ``default``: what it cannot pack itself, as something it can. msgpack walks
    lists, tuples and dicts (and int, float, str subclasses such as IntEnum) on its own and
    calls this only for the rest, so a body of plain values costs no Python call."""
    names = _dataclass_fields(type(value))
    if names is not None:
        return {name: getattr(value, name) for name in names}
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):  # np.float64 is a float and never gets here
        return float(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def _array_frame(name: str, arr: np.ndarray) -> tuple[list[Any], np.ndarray]:
    dtype_name = _WIRE_NAMES.get(arr.dtype)
    if dtype_name is None:
        wire = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        # Equal dtypes need not hash alike: the slow look before refusing.
        dtype_name = next((k for k, v in WIRE_DTYPES.items() if v == wire), None)
        if dtype_name is None:
            raise TypeError(f"{name}: dtype {arr.dtype} cannot travel on the wire")
    arr = np.ascontiguousarray(arr, dtype=WIRE_DTYPES[dtype_name])
    return [name, dtype_name, arr.shape], arr  # msgpack packs a tuple as the list it was


def encode(msg: Message) -> list[Frame]:
    """Frames for ``msg`` (without any routing identity)."""
    plan = _plan(type(msg))
    body = {name: getattr(msg, name) for name in plan.body_names}
    descriptors: list[list[Any]] = []
    payload: list[Frame] = []
    for name, how in plan.payload_fields:
        value = getattr(msg, name)
        if how == _ARRAY or (how == _ARRAY_OPT and value is not None):
            desc, arr = _array_frame(name, value)
            descriptors.append(desc)
            payload.append(arr)
        elif how == _ARRAYS:
            for arr in value:
                desc, arr = _array_frame(name, arr)
                descriptors.append(desc)
                payload.append(arr)
        elif how == _BLOB:
            descriptors.append([name, "bytes", len(value)])
            payload.append(value)
    body["_a"] = descriptors
    return [plan.header, msgpack.packb(body, default=_plain), *payload]


# ---- decoding ---------------------------------------------------------------------------------


def _buffer(frame: Frame) -> memoryview:
    try:
        view = memoryview(frame)  # a zmq.Frame too (pyzmq >= 26), cheaper than its .buffer
    except (TypeError, ValueError, BufferError):
        buf = getattr(frame, "buffer", None)  # a frame type that only offers a view
        try:
            view = memoryview(buf if buf is not None else frame)
        except (TypeError, ValueError, BufferError) as exc:
            raise ProtocolError("frames must be bytes-like") from exc
    if not view.c_contiguous:  # struct and np.frombuffer would raise BufferError on it
        raise ProtocolError("frames must be contiguous buffers")
    return view


def _array(buf: memoryview, kind: Any, shape: Any, where: str) -> np.ndarray:
    # type() is, not isinstance: msgpack makes exact str, list and int (a bool is no int here).
    dtype = WIRE_DTYPES.get(kind) if type(kind) is str else None
    if dtype is not None and type(shape) is list:
        top = limits.MAX_ARRAY_BYTES
        if len(shape) == 1:
            (size,) = shape
            if type(size) is int and 0 <= size <= top:
                if size * dtype.itemsize != buf.nbytes:
                    raise ProtocolError(f"{where}: frame size disagrees with shape {shape}")
                return np.frombuffer(buf, dtype)  # 1-D: the size check fixed its shape
        elif len(shape) == 2:
            rows, cols = shape
            if type(rows) is int and type(cols) is int and 0 <= rows <= top and 0 <= cols <= top:
                # Python ints: a product in int64 wraps around on huge declared shapes.
                if rows * cols * dtype.itemsize != buf.nbytes:
                    raise ProtocolError(f"{where}: frame size disagrees with shape {shape}")
                return np.frombuffer(buf, dtype).reshape(rows, cols)
    raise ProtocolError(f"{where}: bad array descriptor")


def _payload_fields(
    plan: _Plan, descriptors: Any, frames: list[Frame] | tuple[Frame, ...]
) -> dict[str, Any]:
    where = plan.name
    if not isinstance(descriptors, list) or len(descriptors) != len(frames):
        raise ProtocolError(f"{where}: {len(frames)} payload frames, descriptors disagree")
    travels = plan.payload
    out: dict[str, Any] = {n: [] for n in plan.lists} if plan.lists else {}
    for desc, frame in zip(descriptors, frames, strict=True):
        if not isinstance(desc, list) or len(desc) != 3 or not isinstance(desc[0], str):
            raise ProtocolError(f"{where}: bad payload descriptor")
        name, kind, shape = desc
        field = travels.get(name)
        if field is None:
            raise ProtocolError(f"{where}: payload for unknown field {name!r}")
        how, field_where = field
        buf = _buffer(frame)
        if buf.nbytes > limits.MAX_ARRAY_BYTES:
            raise ProtocolError(f"{field_where}: frame over {limits.MAX_ARRAY_BYTES} bytes")
        if how == _BLOB:
            if kind != "bytes" or shape != buf.nbytes or name in out:
                raise ProtocolError(f"{field_where}: bad blob descriptor")
            out[name] = bytes(buf)
        elif how == _ARRAYS:
            out[name].append(_array(buf, kind, shape, field_where))
        else:
            arr = _array(buf, kind, shape, field_where)
            if name in out:
                raise ProtocolError(f"{field_where}: sent twice")
            out[name] = arr
    if len(out) != len(travels):  # list fields are always in out: an empty list is a list
        for name in plan.optional:
            out.setdefault(name, None)
        if len(out) != len(travels):
            missing = [n for n in travels if n not in out]
            raise ProtocolError(f"{where}: payload missing for {missing}")
    return out


def decode(frames: list[Frame]) -> Message:
    """The message in ``frames`` (routing identities already removed) or ProtocolError."""
    if not isinstance(frames, (list, tuple)) or len(frames) < 2:
        raise ProtocolError("a message needs a header and a body frame")
    if len(frames) > limits.MAX_FRAMES:
        raise ProtocolError(f"more than {limits.MAX_FRAMES} frames")
    header = _buffer(frames[0])
    body_buf = _buffer(frames[1])
    if header.nbytes != _HEADER.size:
        raise ProtocolError("bad header length")
    magic, version, command = _HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError("bad magic: not an embedmesh message")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, this peer speaks {VERSION}")
    cls = REGISTRY.get(command)
    if cls is None:
        raise ProtocolError(f"unknown command byte {command:#x}")
    if body_buf.nbytes > limits.MAX_BODY_BYTES:
        raise ProtocolError("body over size limit")
    try:
        # msgpack >= 1.0's defaults, raw=False and strict_map_key=True (str, never bytes; map
        # keys only str or bytes), spelled out: they are part of what the codec accepts.
        body = msgpack.unpackb(body_buf, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"body is not msgpack: {exc.__class__.__name__}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("body is not a map")
    plan = _PLANS.get(cls) or _plan(cls)
    try:
        # Payload first, then the body fields in declaration order, as errors have always come.
        fields = _payload_fields(plan, body.get("_a"), frames[2:])
        msg = cls(**_read_body(body, plan.body, fields))
        msg.validate()
    except ProtocolError as exc:
        exc.cid = _cid(body)
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"{plan.name}: {exc}", _cid(body)) from exc
    return msg


def _cid(body: dict[str, Any]) -> int | None:
    """The correlation id of a refused message, when it carried one that reads as an int."""
    cid = body.get("cid")
    return cid if isinstance(cid, int) and not isinstance(cid, bool) else None
