"""covey's wire protocol, version 2: topics, typed control messages and model frames.

Every party (device agents, coordinator, group managers, third-party devices) speaks
this package; ``docs/protocol.md`` is the reference a device can be written from and
``docs/protocol.schema.json`` the machine-readable schema of every message. Nothing
here is ever unpickled: control messages are JSON, model payloads are raw
little-endian tensor bytes behind a checked header.

* :mod:`device.protocol.topics`: topic names; a device publishes only under topics
  that carry its id, and receivers take the sender from the topic;
* :mod:`device.protocol.messages`: the envelope and one frozen dataclass per body;
* :mod:`device.protocol.frames`: binary frames, chunking, reassembly, ``send_model``;
* :mod:`device.protocol.typed`: validation and JSON Schema from the dataclasses.
"""

from device.protocol.frames import (
    DEFAULT_MAX_CHUNK,
    DTYPES,
    FRAME_KINDS,
    MAGIC,
    MAX_HEADER,
    FrameExtra,
    FrameHeader,
    FrameKind,
    Payload,
    Reassembler,
    check_weights,
    encode_frames,
    parse_frame,
    send_model,
)
from device.protocol.messages import (
    BODY_TYPES,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Ack,
    Assignment,
    DeviceHop,
    EvalRow,
    EvaluateRequest,
    EvaluateResult,
    GroupMode,
    Hop,
    LocalTraining,
    ManagerHop,
    Message,
    Ping,
    Pong,
    PretrainRequest,
    PretrainResult,
    ProtocolVersionError,
    Register,
    ResendRequest,
    Result,
    ServerStatus,
    Split,
    Stop,
    TrainRequest,
    TrainResult,
    decode_message,
    legacy_stop,
)
from device.protocol.topics import SERVER_ID, Topics, check_id

__all__ = [
    "BODY_TYPES",
    "DEFAULT_MAX_CHUNK",
    "DTYPES",
    "FRAME_KINDS",
    "MAGIC",
    "MAX_HEADER",
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "SERVER_ID",
    "Ack",
    "Assignment",
    "DeviceHop",
    "EvalRow",
    "EvaluateRequest",
    "EvaluateResult",
    "FrameExtra",
    "FrameHeader",
    "FrameKind",
    "GroupMode",
    "Hop",
    "LocalTraining",
    "ManagerHop",
    "Message",
    "Payload",
    "Ping",
    "Pong",
    "PretrainRequest",
    "PretrainResult",
    "ProtocolVersionError",
    "Reassembler",
    "Register",
    "ResendRequest",
    "Result",
    "ServerStatus",
    "Split",
    "Stop",
    "Topics",
    "TrainRequest",
    "TrainResult",
    "check_id",
    "check_weights",
    "decode_message",
    "encode_frames",
    "legacy_stop",
    "parse_frame",
    "send_model",
]
