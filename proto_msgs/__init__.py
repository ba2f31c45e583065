"""The wire contract of embedmesh: every message, its frames, error codes and limits.

Nothing outside this package builds or parses frames. Use ``encode(msg)`` to get the frames of a
message and ``decode(frames)`` to get a message back (or ``ProtocolError``).
"""

from proto_msgs.codec import MAGIC, REGISTRY, VERSION, WIRE_DTYPES, Message, decode, encode
from proto_msgs.errors import ErrorCode, ProtocolError
from proto_msgs.messages import (
    OUTPUT_KINDS,
    BatchAssign,
    BatchError,
    BatchResult,
    BrokerStats,
    CancelRequest,
    CatalogReply,
    CatalogRequest,
    Disconnect,
    Heartbeat,
    Lane,
    LateInteraction,
    ModelInfo,
    OutputOptions,
    Ping,
    Pong,
    RequestError,
    RequestResult,
    SubmitRequest,
    TokenizerReply,
    TokenizerRequest,
    WorkerReady,
)

__all__ = [
    "MAGIC",
    "OUTPUT_KINDS",
    "REGISTRY",
    "VERSION",
    "WIRE_DTYPES",
    "BatchAssign",
    "BatchError",
    "BatchResult",
    "BrokerStats",
    "CancelRequest",
    "CatalogReply",
    "CatalogRequest",
    "Disconnect",
    "ErrorCode",
    "Heartbeat",
    "Lane",
    "LateInteraction",
    "Message",
    "ModelInfo",
    "OutputOptions",
    "Ping",
    "Pong",
    "ProtocolError",
    "RequestError",
    "RequestResult",
    "SubmitRequest",
    "TokenizerReply",
    "TokenizerRequest",
    "WorkerReady",
    "decode",
    "encode",
]
