"""Files and permissions (#25, docs/security.md): llm-tray's folders are 0700, its files 0600, a token
file is read only when it is a regular file of this user's that no one else may read, and an atomic
write never writes through a file or link planted at its temp name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trayapp.cli import agent as agent_cli
from trayapp.config import files, paths
from trayapp.config.files import SecretFileError, atomic_write_text, read_secret_file
from trayapp.sinks import sampler_file

posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@posix_only
def test_config_and_data_folders_are_created_0700_and_tightened(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(os, "umask", os.umask)  # the umask stays the test runner's (022)
    assert _mode(paths.config_dir()) == 0o700
    assert _mode(paths.data_dir()) == 0o700
    assert _mode(paths.cache_dir()) == 0o700
    os.chmod(paths.data_dir(), 0o755)  # a folder an older llm-tray made
    assert _mode(paths.data_dir()) == 0o700


def test_a_read_only_home_does_not_raise_from_paths(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a home that is a file: nothing can be made under it, as read-only
    monkeypatch.setenv("LLM_TRAY_HOME", str(blocker))
    assert paths.config_file() == blocker / "config" / "config.toml"
    assert paths.store_file().parent == blocker / "data"
    assert paths.unwritable(blocker / "data") is not None


@posix_only
def test_a_token_file_is_read_when_private(tmp_path: Path) -> None:
    token = tmp_path / "agent-token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    assert read_secret_file(token) == "s3cret"
    assert read_secret_file(tmp_path / "none") is None


@posix_only
def test_a_loose_token_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    token = tmp_path / "proxy-token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with pytest.raises(SecretFileError, match=f"chmod 600 {token}"):
        read_secret_file(token)


@posix_only
@pytest.mark.parametrize("target", ["real", "dangling"])
def test_a_token_symlink_is_refused_not_followed(tmp_path: Path, target: str) -> None:
    real = tmp_path / "real"
    if target == "real":
        real.write_text("s3cret\n")
        real.chmod(0o600)
    link = tmp_path / "agent-token"
    link.symlink_to(real)
    with pytest.raises(SecretFileError, match="symbolic link"):
        read_secret_file(link)


def test_a_directory_as_token_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "agent-token"
    folder.mkdir(mode=0o700)
    with pytest.raises(SecretFileError, match="not a regular file"):
        read_secret_file(folder)


@posix_only
def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    token = tmp_path / "agent-token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    os.chown(token, 65534, 65534)
    with pytest.raises(SecretFileError, match="another user"):
        read_secret_file(token)


@posix_only
def test_every_token_reader_uses_the_checked_reader(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path))
    monkeypatch.delenv("LLM_TRAY_TOKEN", raising=False)
    token = paths.agent_token_file()
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        agent_cli.agent_token({})
    assert sampler_file.auth_headers({}) == {}  # a refused file sends no token, and raises nothing
    token.unlink()
    token.symlink_to(tmp_path / "nowhere")  # dangling: was a crash
    assert sampler_file.auth_headers({}) == {}
    with pytest.raises(ValueError, match="symbolic link"):
        agent_cli.agent_token({})
    token.unlink()
    agent_cli.write_new_token()
    assert _mode(token) == 0o600
    assert sampler_file.auth_headers({})["Authorization"].startswith("Bearer ")


@posix_only
def test_the_proxy_token_file_is_checked(tmp_path: Path, monkeypatch) -> None:
    import argparse

    from trayapp.cli import proxy as proxy_cli

    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path))
    monkeypatch.delenv("LLM_TRAY_TOKEN", raising=False)
    args = argparse.Namespace(token_env="LLM_TRAY_TOKEN")
    made = proxy_cli._token(args, remote=True)
    path = paths.config_dir() / proxy_cli.TOKEN_FILE
    assert made and _mode(path) == 0o600
    assert proxy_cli._token(args, remote=True) == made
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        proxy_cli._token(args, remote=True)


def test_an_atomic_write_never_writes_through_a_planted_temp_name(tmp_path: Path, monkeypatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "out.txt"
    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda _n: next(names))
    (tmp_path / ".out.txt.aaaaaaaaaaaa.tmp").symlink_to(victim)  # planted where the first try goes
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert victim.read_text() == "keep"
    assert files._OPEN_FLAGS & os.O_EXCL
    if hasattr(os, "O_NOFOLLOW"):
        assert files._OPEN_FLAGS & os.O_NOFOLLOW


def test_a_read_only_home_serves_without_the_sampler_file(tmp_path: Path, monkeypatch) -> None:
    """`llm-tray agent` in a read-only home: its endpoint serves, unnamed in the sampler file (it
    refused to start: the file's lock could not be created)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LLM_TRAY_HOME", str(blocker))
    info = sampler_file.claim_sampler_file("http://127.0.0.1:1", role="agent")
    assert info.pid == os.getpid() and info.url == "http://127.0.0.1:1"
    sampler_file.remove_sampler_file("http://127.0.0.1:1")  # nothing to remove, nothing raised


def test_a_store_writer_in_a_read_only_home_says_read_only(tmp_path: Path, monkeypatch) -> None:
    from trayapp.sinks.store import Store, StoreError

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LLM_TRAY_HOME", str(blocker))
    with pytest.raises(StoreError, match="read-only mode"):
        Store(paths.store_file())
    with Store(paths.store_file(), writer=False) as reader:  # reading still works: an empty store
        assert reader.sessions() == []


@posix_only
def test_the_log_file_is_0600_after_every_rotation(tmp_path: Path) -> None:
    import logging

    from trayapp.app.log_setup import PrivateRotatingFileHandler

    path = tmp_path / "llm-tray.log"
    handler = PrivateRotatingFileHandler(path, maxBytes=200, backupCount=2, encoding="utf-8")
    try:
        for i in range(20):
            handler.emit(
                logging.LogRecord("trayapp", logging.INFO, __file__, 1, "x" * 50 + str(i), None, None)
            )
    finally:
        handler.close()
    logs = sorted(tmp_path.glob("llm-tray.log*"))
    assert len(logs) == 3
    assert all(_mode(p) == 0o600 for p in logs), [(p.name, oct(_mode(p))) for p in logs]


def test_a_log_file_that_cannot_be_made_is_no_crash(tmp_path: Path) -> None:
    import logging

    from trayapp.app.log_setup import setup_logging

    logger = logging.getLogger("trayapp")
    before, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        setup_logging(tmp_path / "no-such-folder" / "llm-tray.log")  # as in a read-only home
    finally:
        for handler in logger.handlers[:]:
            if handler not in before:
                logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.mark.parametrize(("argv", "code"), [(["sessions"], 0), (["export", "--table", "requests"], 0)])
def test_the_readers_work_in_an_empty_read_only_home(
    tmp_path: Path, monkeypatch, capsys, argv: list[str], code: int
) -> None:
    """An empty home where nothing can be created (it killed every command with a traceback)."""
    from trayapp.cli.main import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LLM_TRAY_HOME", str(blocker))
    assert main(argv) == code
    assert "Traceback" not in capsys.readouterr().err
