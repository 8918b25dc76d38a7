"""Prefix hashing: equal prefixes give equal ids, salts separate deployments, the salt stays secret."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate.traces.anonymize import SALT_ENV, PrefixHasher, SaltError, load_salt, salt_id, session_hash
from slogate.traces.reader import read_trace
from slogate.traces.record import RequestRecord
from slogate.traces.writer import TraceWriter, WriterConfig

SALT = b"s" * 32


@settings(max_examples=60, deadline=None)
@given(prefix=st.binary(max_size=1500), a=st.binary(max_size=600), b=st.binary(max_size=600))
def test_equal_prefixes_give_equal_ids(prefix: bytes, a: bytes, b: bytes) -> None:
    h = PrefixHasher(SALT, block_size=64)
    ids_a, ids_b = h(prefix + a), h(prefix + b)
    shared = len(prefix) // 64
    assert ids_a[:shared] == ids_b[:shared]
    assert len(ids_a) == -(-len(prefix + a) // 64)
    if a != b and len(a) == len(b) and a:  # same length, different content: the last block differs
        assert ids_a[-1] != ids_b[-1]


def test_ids_are_chained_and_unsigned_64_bit() -> None:
    h = PrefixHasher(SALT, block_size=4)
    x, y = h(b"AAAABBBB"), h(b"CCCCBBBB")
    assert x[1] != y[1]  # same block bytes, different prefix
    assert all(0 <= i < 2**64 for i in x + y)


def test_salt_changes_every_id() -> None:
    data = os.urandom(2000)
    a, b = PrefixHasher(SALT)(data), PrefixHasher(b"t" * 32)(data)
    assert not set(a) & set(b)
    assert salt_id(SALT) != salt_id(b"t" * 32)
    assert session_hash(SALT, "user-1") == session_hash(SALT, b"user-1") != session_hash(b"t" * 32, "user-1")


def test_token_blocks() -> None:
    h = PrefixHasher(SALT, block_size=16, block_unit="tokens")
    tokens = list(range(40))
    assert len(h(tokens)) == 3
    assert h(tokens)[:2] == h([*tokens[:32], 7, 7])[:2]
    assert h(lambda: tokens) == h(tokens)  # deferred prompt


def test_salt_from_env_and_file(tmp_path) -> None:
    assert load_salt(env={SALT_ENV: "abc"}) == b"abc"
    with pytest.raises(SaltError):
        load_salt(env={SALT_ENV: ""})
    path = tmp_path / "state" / "salt"
    first = load_salt(path, env={})
    assert len(first) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_salt(path, env={}) == first
    path.write_bytes(b"")
    with pytest.raises(SaltError, match="empty"):
        load_salt(path, env={})


def test_salt_and_prompt_never_reach_the_file(tmp_path) -> None:
    salt = b"VERY-SECRET-SALT-0123456789abcdef"
    prompt = b"the user's PRIVATE prompt text " * 40
    hasher = PrefixHasher(salt)
    with TraceWriter(WriterConfig(directory=str(tmp_path)), hasher=hasher) as w:
        w.submit(RequestRecord(t=0.0, input_tokens=300), prompt=prompt, session_key="alice@example.com")
    trace = read_trace(tmp_path)
    assert trace.header.salt_id == salt_id(salt)
    assert trace.records[0].hash_ids == hasher(prompt)
    assert trace.records[0].session == session_hash(salt, "alice@example.com")
    import zstandard

    raw = zstandard.ZstdDecompressor().decompressobj().decompress(b"".join(p.read_bytes() for p in w.paths))
    for secret in (salt, salt.hex().encode(), b"PRIVATE", b"alice"):
        assert secret not in raw
