"""The tray's side of a remote `llm-tray agent`: one `GET /v1/snapshot` per tick (docs/remote.md).

`RemoteAgent.poll()` never raises: every failure becomes the machine's status and reason
(unreachable, unauthorized, error), which the tray shows on that machine's entry; the request and
its failures are sources/http.py's `fetch`, and a bug is logged once with its traceback
(`config.bugs`, status "internal error: …") as at every poll boundary. The token is
sent as `Authorization: Bearer …` and comes from the environment variable the entry names
(`token_env`) or else the OS keyring (sources/secrets.py; user `agent_keyring_user(url)`);
it is read when the entry is made and again after a 401 (at most every TOKEN_RECHECK_S, so a token
just saved in the settings dialog is picked up), never per tick, and never logged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from trayapp.config.agents import AgentConfig, agent_keyring_user
from trayapp.config.bugs import BugLog
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import SERVER_STATES, Alert, RemoteMachine, ServerState, ServerStatus, Snapshot
from trayapp.core.redact import redact
from trayapp.core.remote_snapshot import RemoteDocError, snapshot_from_json, tag_remote
from trayapp.sources import secrets
from trayapp.sources.http import FetchError, auth_headers, fetch, make_client

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0  # a remote agent answers from memory: slower than this is a network problem
TOKEN_RECHECK_S = 10.0  # after a 401, the token is looked up again at most this often
SNAPSHOT_PATH = "/v1/snapshot"


@dataclass(frozen=True)
class RemotePoll:
    machine: RemoteMachine
    servers: tuple[ServerStatus, ...] = ()
    alerts: tuple[Alert, ...] = ()


def agent_token(agent: AgentConfig, environ: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """(the token or None, why there is none): `token_env` first, then the OS keyring."""
    missing = []
    if agent.token_env:
        value = environ.get(agent.token_env)
        if value:
            return value, ""
        missing.append(f"${agent.token_env} is not set")
    stored, why = secrets.read_secret(
        agent_keyring_user(agent.url),
        no_backend="no OS keyring here (name an environment variable with token_env)",
        not_stored="none is stored in the OS keyring (Settings → Remote machines)",
    )
    if stored:
        return stored, ""
    missing.append(why)
    return None, "; ".join(missing)


def store_agent_token(url: str, token: str) -> None:
    """Keep an agent's token in the OS keyring; raises secrets.SecretStoreError (with what to do)."""
    secrets.store_api_key(agent_keyring_user(url), token)


def delete_agent_token(url: str) -> None:
    secrets.delete_api_key(agent_keyring_user(url))


class RemoteAgent:
    """One `[[agents]]` entry; `poll()` from a worker thread (it blocks up to `timeout_s`)."""

    def __init__(self, config: AgentConfig, timeout_s: float = TIMEOUT_S) -> None:
        self.config = config
        self._client = make_client(config.url, timeout_s, trust_env=False)  # the token goes to the agent only
        self._headers: dict[str, str] = {}
        self._last_status: str | None = None
        self._bugs = BugLog(log)
        self._token_checked_s = -TOKEN_RECHECK_S
        self.token: str | None = None
        self.token_why = ""  # why there is no token
        self._load_token()

    def _load_token(self) -> bool:
        """Look the token up (again); True when it changed."""
        self._token_checked_s = time.monotonic()
        token, self.token_why = agent_token(self.config)
        changed = token != self.token
        self.token = token
        self._headers = auth_headers(token)
        return changed

    def close(self) -> None:
        self._client.close()

    def _machine(
        self,
        status: ServerState,
        reason: str | None,
        hardware: HardwareSnapshot | None = None,
        t_wall_s: float | None = None,
    ) -> RemoteMachine:
        return RemoteMachine(self.config.name, self.config.url, status, reason, hardware, t_wall_s)

    def poll(self) -> RemotePoll:
        try:
            result = self._poll()
        except Exception as exc:  # the one boundary of this thread: a bug, reported and logged once
            reason = self._bugs.report(exc, f"agent {self.config.name}: poll")
            result = RemotePoll(self._machine("error", reason))
        status = result.machine.status
        if status != self._last_status:
            detail = f" ({result.machine.reason})" if result.machine.reason else ""
            log.info("agent %s: %s → %s%s", self.config.name, self._last_status or "new", status, detail)
            self._last_status = status
        return result

    def _poll(self, retry: bool = True) -> RemotePoll:
        try:
            response = fetch(self._client, SNAPSHOT_PATH, headers=self._headers)
        except FetchError as exc:
            recheck = time.monotonic() - self._token_checked_s >= TOKEN_RECHECK_S
            if exc.http_status == 401 and retry and recheck and self._load_token():
                return self._poll(retry=False)  # a new token (saved in the settings meanwhile)
            return RemotePoll(self._machine(*self._failure(exc)))
        try:
            doc = snapshot_from_json(response.json())
        except (FetchError, RemoteDocError) as exc:  # not JSON, or not the document
            return RemotePoll(self._machine("error", f"not a snapshot document: {redact(str(exc))[:200]}"))
        servers, alerts = tag_remote(doc, self.config.name)
        return RemotePoll(self._machine("ok", None, doc.hardware, doc.t_wall_s), servers, alerts)

    def _failure(self, exc: FetchError) -> tuple[ServerState, str]:
        """The machine's status and reason for a failed request: fetch's when there was no answer,
        the agent's meaning of its HTTP status otherwise."""
        if exc.http_status is None:
            status: ServerState = exc.status if exc.status in SERVER_STATES else "error"
            hint = " — is `llm-tray agent` running there?" if status == "unreachable" else ""
            return status, exc.reason + hint
        if exc.http_status == 401:
            if self.token:
                return "unauthorized", "wrong token (401): the agent refused it"
            return "unauthorized", f"the agent wants a token (401): {self.token_why}"
        if exc.http_status == 503:
            return "loading", "the agent has no snapshot yet"
        return "error", f"HTTP {exc.http_status} from the agent"


class RemoteAgents:
    """Every `[[agents]]` entry, asked in parallel with the probes: `submit()` as a tick starts,
    `merge()` once the pipeline is done. One request per agent at a time; an agent that has not
    answered by then is shown as unreachable while its request finishes in the background."""

    def __init__(self, configs: Sequence[AgentConfig]) -> None:
        self.configs = tuple(configs)
        self._agents: list[RemoteAgent] | None = None  # made on the first tick (keyring reads block)
        self._pool: ThreadPoolExecutor | None = None
        self._polls: dict[str, Future[RemotePoll]] = {}

    def submit(self) -> None:
        if not self.configs:
            return
        if self._agents is None:
            self._agents = [RemoteAgent(config) for config in self.configs]
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llm-tray-agent")
        assert self._pool is not None
        for agent in self._agents:
            running = self._polls.get(agent.config.name)
            if running is None or running.done():
                self._polls[agent.config.name] = self._pool.submit(agent.poll)

    def merge(self, local: Snapshot, timeout_s: float) -> Snapshot:
        """`local` with every remote machine's servers, alerts and hardware added (waits ≤ timeout_s)."""
        if not self._agents:
            return local
        futures = [(agent.config, self._polls[agent.config.name]) for agent in self._agents]
        pending = [future for _, future in futures if not future.done()]
        if pending:
            wait(pending, timeout=max(timeout_s, 0.0))
        servers, alerts, machines = list(local.servers), list(local.alerts), []
        for config, future in futures:
            if not future.done():
                machines.append(
                    RemoteMachine(config.name, config.url, "unreachable", "no answer (agent hung?)")
                )
                continue
            result = future.result()
            machines.append(result.machine)
            servers += result.servers
            alerts += result.alerts
        return replace(local, servers=tuple(servers), alerts=tuple(alerts), machines=tuple(machines))

    def close(self) -> None:
        for agent in self._agents or ():
            agent.close()
        self._agents, self._polls = None, {}
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
