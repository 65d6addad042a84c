"""Downlink deltas: start models sent as ``int8`` (or ``int4``) deltas against the model a device holds.

In an ``int8`` or ``int4`` run a device keeps the last model the server sent it (the start model it
trained from, which it holds anyway; ``device/waiting.py``), by the sha256 of the
payload it came in. The server remembers what it sent each device and, once the device
has answered that task, that the device holds it; the next start model then goes as a
delta against it (``device/protocol/codecs.py``: ``int8``, ``base`` = that sha256) — the
whole model otherwise (a device seen for the first time, or whose model fell out of the
cache): as ``q8`` (8-bit blocks, about half of fp16's bytes) to a device that listed
``q8`` when it registered, in the run's downlink codec (fp16) to one that did not; a
shared broadcast in the codec most of its members decode (the manager's
``broadcast_codec``; the others get their own frame).

The delta is against the model *as the device decoded it*, so the downlink error does
not accumulate from round to round: each round's received model is within one
quantisation step of the server's (the same reconstruction the device computes, with
the same code, :func:`~device.protocol.codecs.decode`). The server keeps those models in
a bounded cache (2 GiB by default; over it, models no device holds go first, then the
least recently used); devices that received the same payload share one entry. Which
model is evicted first can differ between the coordinator (results in arrival order)
and the simulator (in plan order) once a round fills the cache; below the bound both
send the same bytes. The coordinator and the simulator both use
:class:`DownlinkModels`, so both send the same bytes and devices train from the same
models, as long as every device lists ``q8`` (the simulator's virtual devices all do;
a coordinator sends fp16 to an agent from before ``q8``, and to every member of a
group's shared broadcast when most of them are such agents).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from device.protocol.codecs import (
    Bits,
    FrameCodec,
    WireCodec,
    decode,
    downlink_codec,
    encode_float,
    first_codec,
    pack,
    payload_key,
    quantise,
    wire_bits,
)

# Models kept: as many as fit in 2 GiB (1,250 of the FEMNIST MLP, 81 of its CNN). A device
# whose held model was evicted gets the next one in full, so the budget must hold every
# device's model across a round: with a fixed 64 models, FedGSP's 51 relayed chain members
# (each holding its own model) evicted one another every round and got full models where
# deltas would do (the bytes it cost: docs/results.md, "Wire codecs").
DEFAULT_BUDGET_BYTES = 2 << 30


@dataclass(frozen=True)
class Downlink:
    """One start model as sent to one device."""

    payload: np.ndarray
    codec: FrameCodec
    base: str | None  # the sha256 the delta is against
    key: str  # the sha256 of this payload: what the device will hold
    received: np.ndarray  # the float32 model the device decodes


class DownlinkModels:
    """What each device holds, and the models behind those keys (bounded).

    Parameters
    ----------
    full : the codec of a full model (the run's downlink codec, ``fp16`` for ``int8`` and ``int4``).
    deltas : send deltas at all (``int8`` and ``int4`` runs); otherwise every model goes full.
    first : the codec of a full model to a device that decodes it (``q8`` in ``int8``
        and ``int4`` runs, :func:`~device.protocol.codecs.first_codec`); None: ``full``.
    decodes : ``decodes(device, codec)``: whether ``device`` listed ``codec`` when it
        registered; default: every device decodes every codec (the simulator's).
    bits : the deltas' width, 8 (``int8`` runs) or 4 (``int4``).
    capacity : models kept in the cache (at least 1); default: as many as fit in
        ``budget_bytes``. Over it, models no device holds or is being sent go first, then
        the least recently used.
    budget_bytes : the cache's memory when ``capacity`` is not given.
    """

    def __init__(
        self,
        full: FrameCodec,
        *,
        deltas: bool,
        bits: Bits = 8,
        capacity: int | None = None,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        first: FrameCodec | None = None,
        decodes: Callable[[str, str], bool] | None = None,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.full, self.deltas, self.capacity, self.budget_bytes = full, deltas, capacity, budget_bytes
        self.first = first
        self.decodes = decodes
        self.bits = bits
        self._models: OrderedDict[str, np.ndarray] = OrderedDict()
        self._held: dict[str, str] = {}  # device -> key it confirmed holding
        self._sent: dict[str, tuple[str, str]] = {}  # device -> (task id, key) sent, not yet confirmed
        # this round's encodings by base (None: the full model) and codec, for the weights they
        # encode: devices that hold the same model get the same payload, quantised and deflated once
        self._encoded: dict[tuple[str | None, FrameCodec | None], Downlink] = {}
        self._encoded_for: np.ndarray | None = None
        self._unchanged: np.ndarray | None = None  # weights known equal to _encoded_for (unchanged())

    def _keep(self, key: str, model: np.ndarray) -> None:
        self._models[key] = model
        self._models.move_to_end(key)
        limit = self.capacity or max(1, self.budget_bytes // max(model.nbytes, 1))
        if len(self._models) <= limit:
            return
        used = set(self._held.values()) | {k for _, k in self._sent.values()} | {key}
        for old in [k for k in self._models if k not in used]:  # oldest first
            if len(self._models) <= limit:
                return
            del self._models[old]
        while len(self._models) > limit:  # then the least recently used a device holds
            self._models.popitem(last=False)

    def base_of(self, device: str) -> str | None:
        """The key of the model ``device`` holds, if the cache still has it."""
        key = self._held.get(device)
        return key if key is not None and key in self._models else None

    def encode(self, device: str, weights: np.ndarray, full: FrameCodec | None = None) -> Downlink:
        """``weights`` as they go to ``device``: the whole model in ``full`` if given (a
        shared broadcast's codec, whatever the device holds); else a delta against its
        held model if the cache has it (``int8`` and ``int4`` runs), and otherwise the
        whole model in :meth:`full_codec`."""
        if weights is not self._unchanged:
            self._model_is(weights)
        return self._encode_current(device, weights, full)

    @contextmanager
    def unchanged(self, weights: np.ndarray) -> Iterator[None]:
        """Within: ``weights`` is not modified, so :meth:`encode` compares it with the
        last model encoded once, not once per device. That comparison reads two whole
        models, which would otherwise be paid for every device (ten per simulated round
        of the FEMNIST MLP, one per member when a coordinator starts a group of 50)."""
        self._model_is(weights)
        self._unchanged = weights
        try:
            yield
        finally:
            self._unchanged = None

    def encode_all(self, devices: Sequence[str], weights: np.ndarray) -> Iterator[Downlink]:
        """:meth:`encode` for each of ``devices`` in turn, ``weights`` :meth:`unchanged`.
        Lazily: the caller records each device's :meth:`sent` before the next one is
        encoded, as with :meth:`encode`, so the cache evicts the same models."""
        with self.unchanged(weights):
            for device in devices:
                yield self.encode(device, weights)

    def _model_is(self, weights: np.ndarray) -> None:
        """Forget this round's encodings if ``weights`` is not the model they encode."""
        if self._encoded_for is None or not np.array_equal(weights, self._encoded_for):  # a new model
            self._encoded, self._encoded_for = {}, np.array(weights, np.float32, copy=True)
            self._unchanged = None  # another model came in: an unchanged() caller compares again

    def full_codec(self, device: str) -> FrameCodec:
        """How a full model goes to ``device``: :attr:`first` if it decodes that, else :attr:`full`."""
        first = self.first
        if first is None or (self.decodes is not None and not self.decodes(device, first)):
            return self.full
        return first

    def _encode_current(self, device: str, weights: np.ndarray, codec: FrameCodec | None = None) -> Downlink:
        # a codec given (a broadcast's) means the whole model, whatever the device holds
        base = self.base_of(device) if self.deltas and codec is None else None
        full = (codec or self.full_codec(device)) if base is None else None  # a delta's: the smaller packing
        done = self._encoded.get((base, full))
        if done is not None:  # another device holds the same model: the same payload (no work)
            if base is not None:
                self._models.move_to_end(base)
            if self.deltas:  # what this device will hold, kept as for the first one
                self._keep(done.key, done.received)
            return done
        if base is not None:
            held = self._models[base]
            self._models.move_to_end(base)
            payload, codec = pack(quantise(np.asarray(weights, np.float32) - held, self.bits), bits=self.bits)
            received = decode(payload, codec, held)
            down = Downlink(payload, codec, base, payload_key(payload), received)
        else:
            assert full is not None
            payload = encode_float(weights, full)
            down = Downlink(payload, full, None, payload_key(payload), decode(payload, full))
        if self.deltas:
            self._keep(down.key, down.received)
        self._encoded[base, full] = down
        return down

    def sent(self, device: str, task_id: str, key: str) -> None:
        """The server sent ``device`` the payload ``key`` for ``task_id``. Until the
        device answers, the server does not know which model it holds (it replaces its
        model when the new one arrives), so the next model would go full."""
        self._sent[device] = (task_id, key)
        self._held.pop(device, None)

    def forget(self, device: str) -> None:
        """``device`` gets its models from elsewhere now (a site's edge,
        ``server/edge/proxy.py``): the server no longer knows what it holds, so its next
        model goes whole."""
        self._held.pop(device, None)
        self._sent.pop(device, None)

    def confirm(self, device: str, task_id: str) -> None:
        """``device`` answered ``task_id``: it holds the model sent for it (a device keeps
        the last model the server sent it)."""
        sent = self._sent.get(device)
        if sent is not None and sent[0] == task_id:
            self._held[device] = sent[1]
            del self._sent[device]


def downlinks_for(codec: WireCodec, decodes: Callable[[str, str], bool] | None = None) -> DownlinkModels | None:
    """What each device holds, for a run in ``codec``: ``int8`` and ``int4`` runs send
    start models as deltas against it; other runs keep nothing (None). ``decodes``: see
    :class:`DownlinkModels`."""
    bits = wire_bits(codec)
    if bits is None:
        return None
    return DownlinkModels(downlink_codec(codec), deltas=True, bits=bits, first=first_codec(codec), decodes=decodes)
