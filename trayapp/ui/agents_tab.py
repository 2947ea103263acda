"""The settings dialog's Remote machines tab: `[[agents]]` (docs/remote.md).

Each entry is a machine running `llm-tray agent`: its snapshot URL, the name the tray shows, and
its token. The token goes to the OS keyring through the injected `store_secret(user, secret)` (the
dialog's `store_api_key`, run off the GUI thread; user `agent_keyring_user(url)`), never into the
config file; a headless setup can name an environment
variable instead (`token_env`). Nothing here touches the network; the dialog reads `agents()`
when it saves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from urllib.parse import urlsplit

from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import Shiboken

from trayapp.config.agents import AgentConfig, agent_keyring_user
from trayapp.ui.worker import run_in_background

log = logging.getLogger(__name__)

HINT = (
    "On the remote machine: <code>llm-tray agent --new-token</code>, then <code>llm-tray agent "
    "--snapshot-address 0.0.0.0 --snapshot-port 9465</code>. No TLS: on an untrusted network use an "
    "SSH tunnel (<code>ssh -L 9465:127.0.0.1:9465 gpu-box</code>, URL http://127.0.0.1:9465)."
)


def agent_item(agent: AgentConfig) -> str:
    """The list's line: 'gpu-box — http://gpu-box:9465'."""
    return f"{agent.name or default_name(agent.url) or '?'} — {agent.url or '?'}"


def default_name(url: str) -> str:
    """The host part of the URL (the name a blank name field stands for)."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


class AgentsTab(QWidget):
    """The list of remote machines on the left, the selected one's fields on the right."""

    def __init__(
        self,
        agents: Sequence[AgentConfig],
        store_secret: Callable[[str, str], None] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._agents: list[AgentConfig] = list(agents)
        self._store_secret = store_secret
        self._loading = False
        layout = QHBoxLayout(self)
        left = QVBoxLayout()
        self.agent_list = QListWidget()
        self.agent_list.addItems([agent_item(a) for a in self._agents])
        self.agent_list.currentRowChanged.connect(self._select)
        left.addWidget(QLabel("Machines running llm-tray agent, shown in the menu under their name"))
        left.addWidget(self.agent_list)
        row = QHBoxLayout()
        self.add_button = QPushButton("Add a remote machine…")
        self.add_button.clicked.connect(lambda: self.add_agent())
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_agent)
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        left.addLayout(row)
        layout.addLayout(left, 1)

        self.box = QGroupBox("Remote machine")
        form = QFormLayout(self.box)
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://gpu-box:9465")
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("the host part of the URL")
        self.token_env_edit = QLineEdit()
        self.token_env_edit.setPlaceholderText("optional, e.g. GPU_BOX_TOKEN")
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("from the agent's `--new-token` file; kept in the OS keyring")
        self.token_button = QPushButton("Save token in keyring")
        self.token_button.clicked.connect(self.save_token)
        self.token_status = QLabel()
        self.token_status.setWordWrap(True)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token_edit, 1)
        token_row.addWidget(self.token_button)
        form.addRow("Agent URL", self.url_edit)
        form.addRow("Name", self.name_edit)
        form.addRow("Token", token_row)
        form.addRow("", self.token_status)
        form.addRow("Or token from env variable", self.token_env_edit)
        hint = QLabel(HINT)
        hint.setWordWrap(True)
        form.addRow(hint)
        for edit in (self.url_edit, self.name_edit, self.token_env_edit):
            edit.textEdited.connect(self._store_fields)
        layout.addWidget(self.box, 2)
        self._select(0 if self._agents else -1)

    def agents(self) -> tuple[AgentConfig, ...]:
        """The machines as the widgets show them (a blank name: the URL's host)."""
        return tuple(replace(a, name=a.name or default_name(a.url)) for a in self._agents)

    def _select(self, row: int) -> None:
        valid = 0 <= row < len(self._agents)
        self.box.setEnabled(valid)
        self.remove_button.setEnabled(valid)
        agent = self._agents[row] if valid else AgentConfig(url="", name="")
        self._loading = True
        self.url_edit.setText(agent.url)
        self.name_edit.setText(agent.name)
        self.token_env_edit.setText(agent.token_env or "")
        self.token_edit.clear()
        self.token_status.setText("")
        self._loading = False
        if valid and self.agent_list.currentRow() != row:
            self.agent_list.setCurrentRow(row)

    def _store_fields(self, *_args: object) -> None:
        row = self.agent_list.currentRow()
        if self._loading or not 0 <= row < len(self._agents):
            return
        agent = AgentConfig(
            url=self.url_edit.text().strip().rstrip("/"),
            name=self.name_edit.text().strip(),
            token_env=self.token_env_edit.text().strip() or None,
        )
        self._agents[row] = agent
        self.agent_list.item(row).setText(agent_item(agent))

    def add_agent(self, url: str = "", name: str = "") -> None:
        """A new machine, selected with its URL field focused."""
        self._agents.append(AgentConfig(url=url, name=name))
        self.agent_list.addItem(agent_item(self._agents[-1]))
        self._select(len(self._agents) - 1)
        self.url_edit.setFocus()

    def remove_agent(self) -> None:
        row = self.agent_list.currentRow()
        if not 0 <= row < len(self._agents):
            return
        del self._agents[row]
        self.agent_list.takeItem(row)
        self._select(min(row, len(self._agents) - 1))

    def save_token(self) -> None:
        """Store the typed token in the OS keyring (in the background); on failure say why."""
        token, url = self.token_edit.text().strip(), self.url_edit.text().strip().rstrip("/")
        store = self._store_secret
        if not token or not url:
            self.token_status.setText("Type the agent URL and its token first.")
            return
        if store is None:
            self.token_status.setText("No keyring here: name an environment variable instead.")
            return
        self.token_button.setEnabled(False)
        self.token_status.setText("Saving the token in the OS keyring…")

        def done(_result: object) -> None:
            if not Shiboken.isValid(self):
                return
            self.token_button.setEnabled(True)
            self.token_edit.clear()
            self.token_status.setText("✓ Token saved in the OS keyring.")
            log.info("agent token stored in the keyring")

        def failed(exc: BaseException) -> None:
            if not Shiboken.isValid(self):
                return
            self.token_button.setEnabled(True)
            self.token_status.setText(f"✗ Could not store the token: {exc}")
            log.warning("keyring: %s", exc)

        user = agent_keyring_user(url)
        run_in_background(lambda: store(user, token), done, failed, name="llm-tray-keyring")
