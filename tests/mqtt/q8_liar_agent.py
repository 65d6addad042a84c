"""covey's agent, listing ``q8`` among its codecs but refusing every q8 frame: a
third-party device that copied covey's codec list without the decoder. int8 and int4
runs send such a device its first start model as q8, which it would never train from.

Run like covey-device: ``python tests/mqtt/q8_liar_agent.py --broker ... --run ... --id ...``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from device import cli
from device.errors import ProtocolError
from device.protocol import frames as frames_module

_decode = frames_module.decode


def _no_q8(encoded: np.ndarray, codec: str, base: Any = None) -> np.ndarray:
    if codec == "q8":
        raise ProtocolError("this device does not decode q8 after all")
    return _decode(encoded, codec, base)


frames_module.decode = _no_q8  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
