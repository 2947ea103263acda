"""API keys and agent tokens: the OS keyring first, an environment variable as the alternative.

The one module that talks to the OS keyring (tests/unit/test_keyring_home.py). Never a plaintext
file. Where no keyring backend exists (a headless Linux box without Secret Service) storing a key
fails with a message that says so and offers the alternative: name an environment variable in the
endpoint's `api_key_env` setting (an agent's `token_env`).
"""

from __future__ import annotations

import os
from types import ModuleType

SERVICE = "llm-tray"


class SecretStoreError(Exception):
    """The key could not be stored or read; the message says what to do instead."""


_NO_BACKEND = (
    "no OS keyring is available here (no Secret Service / Keychain / Credential Manager). "
    "Put the key in an environment variable and name it in the endpoint's api_key_env setting "
    '(e.g. api_key_env = "LLAMA_API_KEY"), or install a keyring backend.'
)


def _keyring() -> ModuleType:
    """The keyring package, imported when a secret is first stored or read (~30 modules with its
    dependencies; most setups never use it)."""
    import keyring
    import keyring.errors

    return keyring


def store_api_key(url: str, key: str) -> None:
    keyring = _keyring()
    try:
        keyring.set_password(SERVICE, url, key)
    except keyring.errors.NoKeyringError as exc:
        raise SecretStoreError(_NO_BACKEND) from exc
    except keyring.errors.KeyringError as exc:
        raise SecretStoreError(f"the OS keyring refused the key: {exc}") from exc


def delete_api_key(url: str) -> None:
    keyring = _keyring()
    try:
        keyring.delete_password(SERVICE, url)
    except keyring.errors.PasswordDeleteError:
        pass
    except keyring.errors.KeyringError as exc:
        raise SecretStoreError(f"the OS keyring refused: {exc}") from exc


def read_secret(user: str, *, no_backend: str, not_stored: str) -> tuple[str | None, str]:
    """The secret the OS keyring keeps for `user`, or None and why: `no_backend` where this machine
    has no keyring, `not_stored` where it keeps none for `user` (each caller words these two for its
    own setting), the keyring's own error otherwise. The why never holds the secret."""
    keyring = _keyring()
    try:
        value = keyring.get_password(SERVICE, user)
    except keyring.errors.NoKeyringError:
        return None, no_backend
    except keyring.errors.KeyringError as exc:
        return None, f"keyring error: {exc}"
    if value:
        return value, ""
    return None, not_stored


def resolve_api_key(url: str, *, api_key_env: str | None, use_keyring: bool) -> tuple[str | None, str | None]:
    """The key for an endpoint and, when it cannot be had, why (never the key itself)."""
    if api_key_env:
        value = os.environ.get(api_key_env)
        if value:
            return value, None
        if not use_keyring:
            return None, f"environment variable {api_key_env} is not set"
    if use_keyring:
        key, why = read_secret(
            url, no_backend=_NO_BACKEND, not_stored="no key stored in the OS keyring for this endpoint"
        )
        return key, why or None
    return None, None
