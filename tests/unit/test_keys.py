"""The keys derived from the cluster secret, the node proof and the credential comparison
(``cluster/config/keys.py``). The routes each key opens at a real node:
tests/integration/test_add_node_proof.py."""

from __future__ import annotations

import pytest
from cryptography.fernet import InvalidToken
from pysyncobj.encryptor import getEncryptor

from raftmq.cluster.api.auth import OPEN, PEER, route_rule
from raftmq.cluster.config.keys import (
    BACKUP_HEADER,
    PEER_HEADER,
    PROOF_PATH,
    derive_keys,
    new_nonce,
    node_proof,
    proof_matches,
    same_credential,
)

SECRET = "0123456789abcdef0123"


def test_keys_are_distinct_stable_and_none_is_the_secret() -> None:
    keys = derive_keys(SECRET)
    values = [keys.peer, keys.raft, keys.backup]
    assert len(set(values)) == 3 and SECRET not in values
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in values)
    assert derive_keys(SECRET) == keys  # every node derives the same keys
    other = derive_keys(SECRET + "x")
    assert not {other.peer, other.raft, other.backup} & set(values)
    assert SECRET not in repr(keys) and keys.peer not in repr(keys)


def test_a_raft_message_sealed_with_the_raft_key_opens_with_no_other_key() -> None:
    """pysyncobj's own encryptor (its ``password``): the peer key, the backup key or the secret
    cannot read or forge Raft traffic sealed under the Raft key."""
    keys = derive_keys(SECRET)
    sealed = getEncryptor(keys.raft).encrypt(b"raft message")
    assert getEncryptor(keys.raft).decrypt(sealed) == b"raft message"
    for other in (keys.peer, keys.backup, SECRET):
        with pytest.raises(InvalidToken):
            getEncryptor(other).decrypt(sealed)


def test_each_key_authorizes_only_in_its_own_header() -> None:
    keys = derive_keys(SECRET)
    assert keys.authorizes({PEER_HEADER: keys.peer})
    assert keys.authorizes({PEER_HEADER: keys.peer}, backup=True)
    assert keys.authorizes({BACKUP_HEADER: keys.backup}, backup=True)
    assert not keys.authorizes({BACKUP_HEADER: keys.backup})  # not a backup route
    for value in (keys.raft, keys.backup, SECRET, "", keys.peer + "0", keys.peer[:-1]):
        assert not keys.authorizes({PEER_HEADER: value}, backup=True), value
    for value in (keys.raft, keys.peer, SECRET, ""):
        assert not keys.authorizes({BACKUP_HEADER: value}, backup=True), value
    assert not keys.authorizes({}, backup=True)


def test_same_credential_compares_any_text_of_any_length() -> None:
    assert same_credential("a" * 64, "a" * 64)
    assert not same_credential(None, "a" * 64)
    for given in ("", "a", "a" * 63, "a" * 65, "b" * 64, "é" * 64, "\udcff" * 3, "a" * 10_000):
        assert not same_credential(given, "a" * 64), given


def test_a_proof_holds_for_exactly_its_key_nonce_id_and_addresses() -> None:
    keys = derive_keys(SECRET)
    nonce = new_nonce()
    assert len(nonce) == 64 and nonce != new_nonce()
    args = (nonce, "n4", "10.0.0.4:8080", "10.0.0.4:9000")
    proof = node_proof(keys.peer, *args)
    assert proof_matches(keys.peer, *args, proof)
    assert keys.peer not in proof and SECRET not in proof
    changed = [
        (new_nonce(), "n4", "10.0.0.4:8080", "10.0.0.4:9000"),
        (nonce, "n5", "10.0.0.4:8080", "10.0.0.4:9000"),
        (nonce, "n4", "10.6.6.6:8080", "10.0.0.4:9000"),  # a relay's own address
        (nonce, "n4", "10.0.0.4:8080", "10.0.0.4:9001"),
        (nonce, "n4", "10.0.0.4:808", "010.0.0.4:9000"),  # the same bytes split elsewhere
    ]
    for other in changed:
        assert not proof_matches(keys.peer, *other, proof), other
    for key in (keys.raft, keys.backup, derive_keys(SECRET + "x").peer):
        assert not proof_matches(key, *args, proof)
        assert node_proof(key, *args) != proof
    for not_a_proof in (None, 5, b"x", proof[:-1], proof.upper(), ""):
        assert not proof_matches(keys.peer, *args, not_a_proof), not_a_proof


def test_the_proof_route_is_the_only_open_internal_route() -> None:
    assert route_rule("POST", PROOF_PATH, PROOF_PATH) is OPEN
    assert route_rule("GET", PROOF_PATH, PROOF_PATH) is PEER
    assert route_rule("GET", "/internal/status", "/internal/status") is PEER
    assert route_rule("GET", None, "/internal/proof/x") is PEER
