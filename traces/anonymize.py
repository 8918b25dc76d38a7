"""Prefix structure without content: keyed BLAKE2b chained block ids, the salt and its public id.

Block i's id is BLAKE2b(key=salt, 8-byte digest) of (block i-1's id bytes + block i's bytes), read as
an unsigned 64-bit int, so equal ids mean equal prefixes. Sees prompt bytes only to hash them:
never stores, logs or returns prompt content, and never lets the salt itself leave this module.
"""

from __future__ import annotations

import hashlib
import os
import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

SALT_ENV = "SLOGATE_TRACE_SALT"
DEFAULT_BLOCK_BYTES = 256
SALT_BYTES = 32

BlockUnit = Literal["bytes", "tokens"]
# What a caller may hand to the hasher: prompt bytes, token ids, or a function returning either
# (evaluated later, e.g. in the trace writer thread, so a hot path never canonicalises or hashes).
Prompt = bytes | bytearray | memoryview | Sequence[int] | Callable[[], "bytes | Sequence[int]"]


class SaltError(ValueError):
    """The salt cannot be read or created (the message names the file or variable and the fix)."""


def default_salt_path() -> Path:
    """`$XDG_STATE_HOME/slogate/trace_salt` (default `~/.local/state/slogate/trace_salt`)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "slogate" / "trace_salt"


def load_salt(path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None) -> bytes:
    """The deployment's secret salt: `SLOGATE_TRACE_SALT` if set, else the salt file.

    A missing salt file is created with 32 random bytes and mode 0600 (parent directory 0700).
    """
    env = os.environ if env is None else env
    value = env.get(SALT_ENV)
    if value is not None:
        if not value:
            raise SaltError(f"{SALT_ENV} is set but empty: unset it or give a long random string")
        return value.encode()
    salt_path = Path(path) if path is not None else default_salt_path()
    try:
        salt = salt_path.read_bytes()
    except FileNotFoundError:
        salt = _create_salt_file(salt_path)
    except OSError as exc:
        raise SaltError(f"cannot read salt file {salt_path}: {exc.strerror}; fix its permissions or set {SALT_ENV}") from None
    if not salt:
        raise SaltError(f"salt file {salt_path} is empty: delete it (a new one is created) or set {SALT_ENV}")
    return salt


def _create_salt_file(path: Path) -> bytes:
    salt = os.urandom(SALT_BYTES)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # created concurrently by another process: use theirs
        return path.read_bytes()
    except OSError as exc:
        raise SaltError(f"cannot create salt file {path}: {exc.strerror}; choose a writable path or set {SALT_ENV}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(salt)
    return salt


def _key(salt: bytes) -> bytes:
    """BLAKE2b keys are at most 64 bytes: longer salts are first digested (keyed by nothing)."""
    if not salt:
        raise SaltError("empty salt")
    return salt if len(salt) <= 64 else hashlib.blake2b(salt, digest_size=64).digest()


def salt_id(salt: bytes) -> str:
    """A short keyed digest that identifies the salt and is safe to publish (never the salt)."""
    return "b2:" + hashlib.blake2b(b"slogate salt id", key=_key(salt), digest_size=6).hexdigest()


def session_hash(salt: bytes, key: str | bytes) -> str:
    """Keyed hash of a session/user key: equal keys give equal hashes, the key is not recoverable."""
    return _session(_key(salt), key)


def _session(key: bytes, session_key: str | bytes) -> str:
    data = session_key.encode() if isinstance(session_key, str) else session_key
    return hashlib.blake2b(b"session\0" + data, key=key, digest_size=8).hexdigest()


def chain_ids(key: bytes, data: bytes | bytearray | memoryview, block_bytes: int) -> list[int]:
    """Chained ids of consecutive `block_bytes`-sized slices of `data` (the last one may be shorter)."""
    view = memoryview(data)
    ids: list[int] = []
    prev = b""
    blake2b = hashlib.blake2b
    for start in range(0, len(view), block_bytes):
        h = blake2b(prev, key=key, digest_size=8)
        h.update(view[start : start + block_bytes])
        prev = h.digest()
        ids.append(int.from_bytes(prev, "big"))
    return ids


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (the same bytes on every machine)."""
    arr = array("I", tokens)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


class PrefixHasher:
    """Turns one prompt into `hash_ids`: byte blocks, or token blocks when given token ids."""

    def __init__(self, salt: bytes, *, block_size: int = DEFAULT_BLOCK_BYTES, block_unit: BlockUnit = "bytes"):
        if block_size <= 0:
            raise ValueError(f"block size must be positive, got {block_size}")
        self._key = _key(salt)
        self.block_size = block_size
        self.block_unit: BlockUnit = block_unit
        self.salt_id = salt_id(salt)

    def hash_bytes(self, data: bytes | bytearray | memoryview) -> list[int]:
        """Ids of byte blocks (`block_size` bytes each)."""
        return chain_ids(self._key, data, self.block_size)

    def hash_tokens(self, tokens: Sequence[int]) -> list[int]:
        """Ids of token blocks (`block_size` tokens each, hashed as 4-byte little-endian ids)."""
        return chain_ids(self._key, _token_bytes(tokens), 4 * self.block_size)

    def session(self, key: str | bytes) -> str:
        """`session_hash` with this hasher's salt."""
        return _session(self._key, key)

    def __call__(self, prompt: Prompt) -> list[int]:
        """Hash prompt bytes, token ids, or the result of a zero-argument function returning either."""
        if callable(prompt):
            prompt = prompt()
        if isinstance(prompt, bytes | bytearray | memoryview):
            return self.hash_bytes(prompt)
        return self.hash_tokens(prompt)
