"""Write the protocol's JSON Schema: ``python -m device.protocol.schema [FILE]``.

One document (JSON Schema draft 2020-12) with a definition per message body, the
envelope, the frame header and a ``message`` schema that ties the envelope's
``type`` to its body. ``docs/protocol.schema.json`` is this output; a test checks the
committed file is current, and that every body the code writes validates against it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, get_args

from device.protocol.frames import FrameHeader
from device.protocol.messages import BODY_TYPES, PROTOCOL_VERSION, Envelope
from device.protocol.typed import object_schema


def _ref_for(body: Any, defs: dict[str, Any]) -> dict[str, Any]:
    options = get_args(body) or (body,)
    refs = []
    for cls in options:
        if cls.__name__ not in defs:
            defs[cls.__name__] = {}
            defs[cls.__name__] = object_schema(cls, defs)
        refs.append({"$ref": f"#/$defs/{cls.__name__}"})
    return refs[0] if len(refs) == 1 else {"oneOf": refs}


def protocol_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    envelope = object_schema(Envelope, defs)
    envelope["properties"]["v"] = {"const": PROTOCOL_VERSION}
    envelope["properties"]["type"] = {"enum": list(BODY_TYPES)}
    by_type = []
    for name, body in BODY_TYPES.items():
        by_type.append(
            {
                "if": {"properties": {"type": {"const": name}}},
                "then": {"properties": {"body": _ref_for(body, defs)}},
            }
        )
    defs["FrameHeader"] = object_schema(FrameHeader, defs)
    envelope.pop("description", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://covey.invalid/protocol/v{PROTOCOL_VERSION}.schema.json",
        "title": f"covey wire protocol, version {PROTOCOL_VERSION}",
        "description": "A control message: the envelope, with the body its type names. The header of a binary "
        "model frame is #/$defs/FrameHeader. Receivers ignore properties they do not know. See docs/protocol.md.",
        **envelope,
        "allOf": by_type,
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    return json.dumps(protocol_schema(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
