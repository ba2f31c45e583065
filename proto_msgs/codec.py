"""Frames of a message, built and parsed only here.

A message is ``[header][msgpack body][payload frame]...``:

- header: 4 bytes, ``MAGIC`` (2) + ``VERSION`` (1) + command byte (1);
- body: a msgpack map of the message's plain fields, plus ``"_a"``, the descriptors of the raw
  payload frames in frame order: ``[field, dtype, shape]`` for arrays, ``[field, "bytes", len]``
  for blobs;
- payload: one frame per array or blob, raw little-endian bytes; large ones are handed to zmq
  without copying (``send_multipart(..., copy=False)``) and decoded with ``np.frombuffer``.

Decoding validates every field against the message's type hints and every frame against its
descriptor and ``limits``; any mismatch raises ``ProtocolError``.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import types
import typing
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
    _hints: ClassVar[dict[str, Any]]

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


def _resolve_hints(cls: type) -> dict[str, Any]:
    hints = cls.__dict__.get("_hints")
    if hints is None:
        hints = typing.get_type_hints(cls)
        hints = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
        cls._hints = hints  # type: ignore[attr-defined]
    return hints


def _is_payload(tp: Any) -> bool:
    return tp is np.ndarray or tp is bytes or tp == list[np.ndarray]


# ---- encoding ---------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _array_frame(name: str, arr: np.ndarray) -> tuple[list[Any], np.ndarray]:
    wire = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    dtype_name = next((k for k, v in WIRE_DTYPES.items() if v == wire), None)
    if dtype_name is None:
        raise TypeError(f"{name}: dtype {arr.dtype} cannot travel on the wire")
    arr = np.ascontiguousarray(arr, dtype=WIRE_DTYPES[dtype_name])
    return [name, dtype_name, list(arr.shape)], arr


def encode(msg: Message) -> list[Frame]:
    """Frames for ``msg`` (without any routing identity)."""
    hints = _resolve_hints(type(msg))
    body: dict[str, Any] = {}
    descriptors: list[list[Any]] = []
    payload: list[Frame] = []
    for name, tp in hints.items():
        value = getattr(msg, name)
        if tp is np.ndarray:
            desc, arr = _array_frame(name, value)
            descriptors.append(desc)
            payload.append(arr)
        elif tp == list[np.ndarray]:
            for arr in value:
                desc, arr = _array_frame(name, arr)
                descriptors.append(desc)
                payload.append(arr)
        elif tp is bytes:
            descriptors.append([name, "bytes", len(value)])
            payload.append(value)
        else:
            body[name] = _plain(value)
    body["_a"] = descriptors
    header = _HEADER.pack(MAGIC, VERSION, msg.COMMAND)
    return [header, msgpack.packb(body, use_bin_type=True), *payload]


# ---- decoding ---------------------------------------------------------------------------------


def _buffer(frame: Frame) -> memoryview:
    buf = getattr(frame, "buffer", None)  # zmq.Frame received with copy=False
    try:
        view = memoryview(buf if buf is not None else frame)
    except (TypeError, ValueError, BufferError) as exc:
        raise ProtocolError("frames must be bytes-like") from exc
    if not view.c_contiguous:  # struct and np.frombuffer would raise BufferError on it
        raise ProtocolError("frames must be contiguous buffers")
    return view


def _check(value: Any, tp: Any, where: str) -> Any:
    """Validate (and lightly coerce) one decoded body value against its type hint."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(value, arg, where)
            except ProtocolError:
                continue
        raise ProtocolError(f"{where}: {type(value).__name__} fits none of {tp}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list")
        if len(value) > limits.MAX_SEQUENCES:
            raise ProtocolError(f"{where}: list too long")
        return [_check(v, item, f"{where}[]") for v in value]
    if origin is dict:
        ktp, vtp = typing.get_args(tp)
        if not isinstance(value, dict) or len(value) > limits.MAX_SEQUENCES:
            raise ProtocolError(f"{where}: expected a map")
        return {
            _check(k, ktp, f"{where}.key"): _check(v, vtp, f"{where}.value")
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        return _from_map(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected a bool")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(f"{where}: expected an int")
        return value
    if tp is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ProtocolError(f"{where}: expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or len(value) > limits.MAX_STRING:
            raise ProtocolError(f"{where}: expected a string")
        return value
    raise ProtocolError(f"{where}: unsupported field type {tp}")  # pragma: no cover


def _from_map(cls: type, value: Any, where: str, extra: dict[str, Any] | None = None) -> Any:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: expected a map")
    hints = _resolve_hints(cls)
    kwargs: dict[str, Any] = dict(extra or {})
    for name, tp in hints.items():
        if name in kwargs:
            continue
        if name not in value:
            raise ProtocolError(f"{where}.{name}: missing")
        kwargs[name] = _check(value[name], tp, f"{where}.{name}")
    return cls(**kwargs)


def _payload_fields(
    hints: dict[str, Any], descriptors: Any, frames: list[Frame], where: str
) -> dict[str, Any]:
    if not isinstance(descriptors, list) or len(descriptors) != len(frames):
        raise ProtocolError(f"{where}: {len(frames)} payload frames, descriptors disagree")
    out: dict[str, Any] = {n: [] for n, tp in hints.items() if tp == list[np.ndarray]}
    for desc, frame in zip(descriptors, frames, strict=True):
        if not isinstance(desc, list) or len(desc) != 3 or not isinstance(desc[0], str):
            raise ProtocolError(f"{where}: bad payload descriptor")
        name, kind, shape = desc
        tp = hints.get(name)
        if tp is None or not _is_payload(tp):
            raise ProtocolError(f"{where}: payload for unknown field {name!r}")
        buf = _buffer(frame)
        if buf.nbytes > limits.MAX_ARRAY_BYTES:
            raise ProtocolError(f"{where}.{name}: frame over {limits.MAX_ARRAY_BYTES} bytes")
        if tp is bytes:
            if kind != "bytes" or shape != buf.nbytes or name in out:
                raise ProtocolError(f"{where}.{name}: bad blob descriptor")
            out[name] = bytes(buf)
            continue
        dtype = WIRE_DTYPES.get(kind) if isinstance(kind, str) else None
        if (
            dtype is None
            or not isinstance(shape, list)
            or not 1 <= len(shape) <= 2
            or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= limits.MAX_ARRAY_BYTES
                for s in shape
            )
        ):
            raise ProtocolError(f"{where}.{name}: bad array descriptor")
        # Python ints: np.prod in int64 wraps around on huge declared shapes.
        if math.prod(shape) * dtype.itemsize != buf.nbytes:
            raise ProtocolError(f"{where}.{name}: frame size disagrees with shape {shape}")
        arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
        if tp is np.ndarray:
            if name in out:
                raise ProtocolError(f"{where}.{name}: sent twice")
            out[name] = arr
        else:
            out[name].append(arr)
    missing = [n for n, tp in hints.items() if _is_payload(tp) and n not in out]
    if missing:
        raise ProtocolError(f"{where}: payload missing for {missing}")
    return out


def decode(frames: list[Frame]) -> Message:
    """The message in ``frames`` (routing identities already removed) or ProtocolError."""
    if not isinstance(frames, list | tuple) or len(frames) < 2:
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
        body = msgpack.unpackb(
            body_buf,
            raw=False,
            strict_map_key=True,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"body is not msgpack: {exc.__class__.__name__}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("body is not a map")
    cid = body.get("cid")
    if not isinstance(cid, int) or isinstance(cid, bool):
        cid = None
    where = cls.__name__
    try:
        payload = _payload_fields(_resolve_hints(cls), body.get("_a"), list(frames[2:]), where)
        msg = _from_map(cls, body, where, extra=payload)
        msg.validate()
    except ProtocolError as exc:
        exc.cid = cid
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"{where}: {exc}", cid) from exc
    return msg
