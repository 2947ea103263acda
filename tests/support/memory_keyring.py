"""An in-memory keyring backend standing in for Secret Service / Keychain in tests."""

from __future__ import annotations

import json
import os

import keyring.backend
import keyring.errors


class MemoryKeyring(keyring.backend.KeyringBackend):
    """Passwords in a dict keyed by (service, username); deleting a missing one raises, as backends do."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if (service, username) not in self.store:
            raise keyring.errors.PasswordDeleteError(username)
        del self.store[(service, username)]


SEED_ENV = "LLM_TRAY_TEST_KEYRING"  # JSON [[service, username, password], ...]


class SeededMemoryKeyring(MemoryKeyring):
    """A MemoryKeyring filled from $LLM_TRAY_TEST_KEYRING, so a subprocess started with
    PYTHON_KEYRING_BACKEND=tests.support.memory_keyring.SeededMemoryKeyring finds the test's keys."""

    def __init__(self) -> None:
        super().__init__()
        for service, username, password in json.loads(os.environ.get(SEED_ENV) or "[]"):
            self.store[(service, username)] = password
