"""Sealing: the client seals the results it stores and the recovery points it records
with keys idemd never sees, and opens them when they come back (docs/sealing.md).

An envelope is::

    0xC1 | version 2 | len(key id) | key id | salt (16) | nonce (12) | ciphertext | tag (16)

sealed with AES-256-GCM under a key derived for the one message,
HKDF-SHA256(ring key, salt, "idemd seal v1"), so that random nonces never meet the
2^32-messages-per-key limit of GCM with a fixed key. The associated data binds the
envelope's head, what it seals (a completed result, a failed one, or a recovery point),
the tenant, the idemd key and, for a result, its readable status or, for a recovery
point, its name: an envelope moved to another key, tenant, status, outcome or point
fails to open. Version 1, which clients wrote before, still opens; it does not bind a
result's outcome, so a failed result's envelope opens as a completed one and back. The
shared vectors in clients/testdata/sealing.json pin every byte.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ._errors import Unsealable
from ._types import Response

MARKER = 0xC1
VERSION = 2
VERSION_1 = 1
SALT_LEN = 16
NONCE_LEN = 12
TAG_LEN = 16
KEY_LEN = 32
MAX_KEY_ID = 32
INFO = b"idemd seal v1"
#: The status under which a failure without a response is stored sealed: a failed
#: result whose envelope holds nothing, not even the count of header names every
#: response's plaintext starts with.
NO_RESPONSE_STATUS = 500

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,32}")
#: What the ring's text form counts as space, so that every client reads a ring alike.
_RING_SPACE = " \t\r"

#: Where a seal draws its salt and nonce: ``n`` random bytes.
Random = Callable[[int], bytes]


@dataclass(frozen=True)
class SealKey:
    """One key of a ring: ``id`` of 1 to 32 letters, digits, ``.``, ``_`` or ``-``, and
    ``key``, 32 random bytes. Its repr leaves the key bytes out."""

    id: str
    key: bytes = field(repr=False)


class KeyRing:
    """The keys that open sealed results, and the one that seals: the first. Rotating is
    making a ring whose first key is new and keeping the old ones in it for as long as
    results sealed with them are retained (docs/sealing.md, *Rotating keys*).

    ``KeyRing([SealKey(id, key), ...])`` makes one from keys; :meth:`parse` from its text
    form. A ring without keys, a key id outside ``[A-Za-z0-9._-]{1,32}``, a key that is
    not 32 bytes, or an id given twice raises ValueError."""

    def __init__(self, keys: Iterable[SealKey]) -> None:
        keys = list(keys)
        if not keys:
            raise ValueError("a key ring needs at least one key")
        self._keys: dict[str, bytes] = {}
        for i, k in enumerate(keys):
            if not isinstance(k, SealKey):
                raise TypeError(f"key ring entry {i} is a {type(k).__name__}, not a SealKey")
            if not isinstance(k.id, str) or not _KEY_ID.fullmatch(k.id):
                raise ValueError(
                    f"key ring entry {i}: key id {k.id!r}: 1 to {MAX_KEY_ID} letters, digits, '.', '_' or '-'"
                )
            if not isinstance(k.key, bytes | bytearray | memoryview) or len(k.key) != KEY_LEN:
                size = len(k.key) if isinstance(k.key, bytes | bytearray | memoryview) else "not"
                raise ValueError(f"key {k.id!r} is {size} bytes; a sealing key is {KEY_LEN} random bytes")
            if k.id in self._keys:
                raise ValueError(f"key id {k.id!r} is in the ring twice")
            self._keys[k.id] = bytes(k.key)
        self._sealing_id = keys[0].id

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """A ring from its text form, as ``IDEMD_SEAL_KEYS`` and key files hold it
        (docs/sealing.md): entries ``id=base64 of 32 bytes`` separated by commas or line
        feeds, the first of which seals. Spaces, tabs and carriage returns around lines,
        entries, ids and keys are skipped, and so are blank lines and lines starting with
        ``#``. A key is standard base64 with its padding and zero pad bits."""
        keys: list[SealKey] = []
        for raw_line in text.split("\n"):
            line = raw_line.strip(_RING_SPACE)
            if not line or line.startswith("#"):
                continue
            for raw_entry in line.split(","):
                entry = raw_entry.strip(_RING_SPACE)
                if not entry:
                    continue
                key_id, eq, b64 = entry.partition("=")
                if not eq:
                    raise ValueError(f"key ring entry {len(keys)} is not id=base64")
                key_id, b64 = key_id.strip(_RING_SPACE), b64.strip(_RING_SPACE)
                try:
                    key = base64.b64decode(b64, validate=True)
                except (binascii.Error, ValueError) as err:
                    raise ValueError(f"key {key_id!r}: not standard base64: {err}") from None
                if base64.b64encode(key).decode("ascii") != b64:
                    raise ValueError(f"key {key_id!r}: not standard base64: its pad bits are not zero")
                keys.append(SealKey(key_id, key))
        return cls(keys)

    @property
    def sealing_key_id(self) -> str:
        """The id of the key that seals."""
        return self._sealing_id

    @property
    def key_ids(self) -> list[str]:
        """The ids of the ring's keys, the sealing one first."""
        return list(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(key_ids={self.key_ids!r})"

    def _seal(self, aad_tail: Callable[[int], bytes], plaintext: bytes, random: Random) -> bytes:
        """An envelope of ``plaintext`` under the sealing key, bound to ``aad_tail`` of
        its version; ``random`` gives the salt and the nonce (os.urandom outside the
        shared vectors' test)."""
        head = envelope_head_of(self._sealing_id)
        drawn = random(SALT_LEN + NONCE_LEN)
        if len(drawn) != SALT_LEN + NONCE_LEN:
            raise ValueError(f"the random source gave {len(drawn)} bytes, not {SALT_LEN + NONCE_LEN}")
        salt, nonce = drawn[:SALT_LEN], drawn[SALT_LEN:]
        sealed = _aead(self._keys[self._sealing_id], salt).encrypt(nonce, plaintext, head + aad_tail(VERSION))
        return head + drawn + sealed

    def _open(self, aad_tail: Callable[[int], bytes], envelope: bytes) -> bytes:
        """The plaintext of an envelope sealed with any key of the ring, bound to
        ``aad_tail`` of its version; Unsealable when it does not open."""
        key_id, head = envelope_head(envelope)
        key = self._keys.get(key_id)
        if key is None:
            raise Unsealable("unknown_key", key_id)
        salt = envelope[head : head + SALT_LEN]
        nonce = envelope[head + SALT_LEN : head + SALT_LEN + NONCE_LEN]
        try:
            return _aead(key, salt).decrypt(
                nonce, envelope[head + SALT_LEN + NONCE_LEN :], envelope[:head] + aad_tail(envelope[1])
            )
        except InvalidTag:
            raise Unsealable("invalid", key_id) from None


def _aead(key: bytes, salt: bytes) -> AESGCM:
    derived = HKDF(algorithm=hashes.SHA256(), length=KEY_LEN, salt=salt, info=INFO).derive(key)
    return AESGCM(derived)


def envelope_head_of(key_id: str) -> bytes:
    """The head of an envelope sealed with the key ``key_id``: marker, version, the id's
    length and the id. The associated data starts with it."""
    raw = key_id.encode("ascii")
    return bytes([MARKER, VERSION, len(raw)]) + raw


def envelope_head(envelope: bytes) -> tuple[str, int]:
    """The key id an envelope names and the length of its head; Unsealable (invalid)
    for bytes that are not an envelope of version 1 or 2, or too short to be one."""
    if len(envelope) < 3 or envelope[0] != MARKER or envelope[1] not in (VERSION, VERSION_1):
        raise Unsealable("invalid")
    n = envelope[2]
    head = 3 + n
    if n == 0 or len(envelope) < head + SALT_LEN + NONCE_LEN + TAG_LEN:
        raise Unsealable("invalid")
    # A ring's ids are ASCII; latin-1 reads any other byte without failing, and matches none.
    return envelope[3:head].decode("latin-1"), head


def _u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def _string16(s: str) -> bytes:
    b = s.encode("utf-8")
    return _u16(len(b)) + b


#: The outcome of a finished record, which a result's envelope is bound to.
Outcome = Literal["completed", "failed"]


def result_aad(tenant: str, key: str, outcome: str, status: int, version: int = VERSION) -> bytes:
    """What a result's envelope of ``version`` is bound to after its head: its
    outcome (``completed`` or ``failed``; version 1 binds neither), tenant, key and
    status."""
    kind = b"R" if version == VERSION_1 else b"F" if outcome == "failed" else b"C"
    return kind + _string16(tenant) + _string16(key) + _u16(status)


def point_aad(tenant: str, key: str, name: str, version: int = VERSION) -> bytes:
    """What a recovery point's envelope is bound to after its head."""
    return b"P" + _string16(tenant) + _string16(key) + _string16(name)


def response_plaintext(headers: dict[str, list[str]], body: bytes) -> bytes:
    """What a result's envelope holds: its headers, names in byte order and each name's
    values in order, then its body::

        u16 names | per name: u16 len, name, u16 values, per value: u32 len, value | body
    """
    names = sorted(headers, key=lambda name: name.encode("utf-8"))
    out = bytearray(_u16(len(names)))
    for name in names:
        out += _string16(name)
        values = headers[name]
        out += _u16(len(values))
        for value in values:
            v = value.encode("utf-8")
            out += len(v).to_bytes(4, "big") + v
    out += body
    return bytes(out)


def response_plaintext_len(headers: dict[str, list[str]], body: bytes) -> int:
    """The length of response_plaintext(headers, body), counted without building it."""
    n = 2
    for name, values in headers.items():
        n += 2 + len(name.encode("utf-8")) + 2
        n += sum(4 + len(value.encode("utf-8")) for value in values)
    return n + len(body)


def parse_response_plaintext(plain: bytes) -> tuple[dict[str, list[str]], bytes]:
    """The headers and the body a result's envelope held; Unsealable (invalid) when its
    layout is broken, which an envelope that opened holds only when its sealer erred."""
    at = 0

    def take(n: int) -> bytes:
        nonlocal at
        if at + n > len(plain):
            raise Unsealable("invalid")
        chunk = plain[at : at + n]
        at += n
        return chunk

    def number(n: int) -> int:
        return int.from_bytes(take(n), "big")

    headers: dict[str, list[str]] = {}
    try:
        for _ in range(number(2)):
            name = take(number(2)).decode("utf-8")
            headers[name] = [take(number(4)).decode("utf-8") for _ in range(number(2))]
    except UnicodeDecodeError:
        raise Unsealable("invalid") from None
    return headers, plain[at:]


@dataclass(frozen=True)
class Sealing:
    """Sealing for a client: ``Client(url, sealing=Sealing("payments", ring))``.

    ``tenant`` names the key space the client works in (its token's tenant, ``default``
    without a token); it is bound into every envelope, so clients of one tenant must use
    the same name. ``ring`` seals what the client stores and opens what comes back. With
    ``require_sealed``, a plain result or recovery point is refused (:class:`Unsealable`,
    reason ``not_sealed``) instead of passed through: turn it on once every plain result
    has passed its retention."""

    tenant: str
    ring: KeyRing
    require_sealed: bool = False
    #: Where seals draw their salt and nonce; the shared vectors' test replaces it.
    random: Random = field(default=os.urandom, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError("a tenant is required: the name of the token's tenant, 'default' without one")
        if len(self.tenant.encode("utf-8")) > 0xFFFF:
            raise ValueError("the tenant is over 65535 bytes")
        if not isinstance(self.ring, KeyRing):
            raise TypeError("ring is a KeyRing")

    def seal_response(self, key: str, outcome: Outcome, response: Response) -> bytes:
        """The envelope of a result's headers and body, bound to its status and
        ``outcome``."""
        return self.ring._seal(
            lambda v: result_aad(self.tenant, key, outcome, response.status, v),
            response_plaintext(response.headers, response.body),
            self.random,
        )

    def envelope_len(self, response: Response) -> int:
        """The length of seal_response's envelope of ``response``, counted without
        sealing it."""
        head = len(envelope_head_of(self.ring.sealing_key_id))
        return head + SALT_LEN + NONCE_LEN + response_plaintext_len(response.headers, response.body) + TAG_LEN

    def seal_no_response(self, key: str) -> bytes:
        """The envelope of a failure released without a response, stored under
        :data:`NO_RESPONSE_STATUS`, so that a ring requiring sealing can tell it from a
        failure slipped into the store."""
        return self.ring._seal(
            lambda v: result_aad(self.tenant, key, "failed", NO_RESPONSE_STATUS, v), b"", self.random
        )

    def open_response(self, key: str, outcome: Outcome, status: int, envelope: bytes) -> Response | None:
        """The result an envelope holds, with its readable ``status``, of a record
        whose outcome is ``outcome``; None for a failure sealed without a response."""
        plain = self.ring._open(lambda v: result_aad(self.tenant, key, outcome, status, v), envelope)
        if not plain and outcome == "failed" and envelope[1] != VERSION_1:
            return None
        try:
            headers, body = parse_response_plaintext(plain)
        except Unsealable:
            # It opened with the key it names, whose holder sealed something else.
            raise Unsealable("invalid", envelope_head(envelope)[0]) from None
        return Response(status, headers, body)

    def missing_response(self) -> None:
        """A finished record without a result: refused under require_sealed, since a
        sealing client stores even a failure without a response sealed."""
        if self.require_sealed:
            raise Unsealable("not_sealed")

    def plain_response(self, response: Response) -> Response:
        """A plain result as it came: passed through, or refused under require_sealed."""
        if self.require_sealed:
            raise Unsealable("not_sealed")
        return response

    def seal_point(self, key: str, name: str, data: bytes) -> bytes:
        """The envelope of a recovery point's data, bound to its name."""
        return self.ring._seal(lambda v: point_aad(self.tenant, key, name, v), data, self.random)

    def open_point(self, key: str, name: str, data: bytes) -> bytes:
        """A recovery point's data. Data that is not an envelope (not starting with
        0xC1) is plain, as recorded before sealing was turned on: passed through, unless
        sealed points are required."""
        if not data or data[0] != MARKER:
            if self.require_sealed:
                raise Unsealable("not_sealed")
            return data
        return self.ring._open(lambda v: point_aad(self.tenant, key, name, v), data)


def unopened(envelope: bytes) -> Unsealable:
    """The error for a sealed result that reaches a client without a ring:
    ``unknown_key`` naming the envelope's key, or ``invalid`` when it is no envelope."""
    try:
        key_id, _ = envelope_head(envelope)
    except Unsealable as err:
        return err
    return Unsealable("unknown_key", key_id)


def point_without_ring(data: bytes) -> bytes:
    """A recovery point's data as a client without a ring reads it: as it is. A
    recovery point has no mark of its own, and plain data may start with any byte."""
    return data
