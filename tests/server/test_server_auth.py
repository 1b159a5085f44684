"""Tenancy: the tenant string derived from (API key, cache_salt)."""

from __future__ import annotations

from hintkv.server.auth import ANONYMOUS, tenant_of


def test_tenant_separates_keys_and_salts_without_revealing_the_key():
    a, b = tenant_of("key-a-secret", None), tenant_of("key-b-secret", None)
    assert a != b and "secret" not in a
    assert tenant_of("key-a-secret", None) == a  # stable
    assert tenant_of("key-a-secret", "s1") != a
    assert tenant_of("key-a-secret", "s1") != tenant_of("key-a-secret", "s2")
    assert tenant_of("key-a-secret", "s1") != tenant_of("key-b-secret", "s1")


def test_no_key_is_the_anonymous_tenant():
    assert tenant_of(None, None) == ANONYMOUS
    assert tenant_of(None, "s") != ANONYMOUS
