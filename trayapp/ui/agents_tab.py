"""The settings dialog's Remote machines tab: `[[agents]]` (docs/remote.md).

Each entry is a machine running `llm-tray agent`: its snapshot URL, the name the tray shows, and
its token. The token goes to the OS keyring through the injected `store_secret(user, secret)` (the
dialog's `store_api_key`, run off the GUI thread; user `agent_keyring_user(url)`), never into the
config file; a headless setup can name an environment
variable instead (`token_env`). Nothing here touches the network; the dialog reads `agents()`
when it saves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from urllib.parse import urlsplit

from PySide6.QtWidgets import QLabel, QLineEdit, QWidget

from trayapp.config.agents import AgentConfig, agent_keyring_user
from trayapp.ui.list_editor import ListEditor, SecretField

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


class AgentsTab(ListEditor[AgentConfig]):
    """The list of remote machines on the left, the selected one's fields on the right."""

    def __init__(
        self,
        agents: Sequence[AgentConfig],
        store_secret: Callable[[str, str], None] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(
            agents,
            caption="Machines running llm-tray agent, shown in the menu under their name",
            title="Remote machine",
            blank=AgentConfig(url="", name=""),
            item_text=agent_item,
            fill_form=self._fill_form_fields,
            read_form=self._read_form_fields,
            new_item=lambda: AgentConfig(url="", name=""),
            add_text="Add a remote machine…",
            parent=parent,
        )
        self._store_secret = store_secret
        form = self.form
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://gpu-box:9465")
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("the host part of the URL")
        self.token_env_edit = QLineEdit()
        self.token_env_edit.setPlaceholderText("optional, e.g. GPU_BOX_TOKEN")
        self.token = SecretField("token", "from the agent's `--new-token` file; kept in the OS keyring")
        self.token.button.clicked.connect(self.save_token)
        form.addRow("Agent URL", self.url_edit)
        form.addRow("Name", self.name_edit)
        self.token.add_rows(form, "Token")
        form.addRow("Or token from env variable", self.token_env_edit)
        hint = QLabel(HINT)
        hint.setWordWrap(True)
        form.addRow(hint)
        for edit in (self.url_edit, self.name_edit, self.token_env_edit):
            edit.textEdited.connect(self.store_form)
        self.focus_on_add = self.url_edit
        self.select(0 if self.items else -1)

    def agents(self) -> tuple[AgentConfig, ...]:
        """The machines as the widgets show them (a blank name: the URL's host)."""
        return tuple(replace(a, name=a.name or default_name(a.url)) for a in self.items)

    def _fill_form_fields(self, agent: AgentConfig) -> None:
        self.url_edit.setText(agent.url)
        self.name_edit.setText(agent.name)
        self.token_env_edit.setText(agent.token_env or "")
        self.token.edit.clear()
        self.token.status.setText("")

    def _read_form_fields(self, _agent: AgentConfig) -> AgentConfig:
        return AgentConfig(
            url=self.url_edit.text().strip().rstrip("/"),
            name=self.name_edit.text().strip(),
            token_env=self.token_env_edit.text().strip() or None,
        )

    def add_agent(self, url: str = "", name: str = "") -> None:
        """A new machine, selected with its URL field focused."""
        self.add(AgentConfig(url=url, name=name))

    def remove_agent(self) -> None:
        self.remove()

    def save_token(self) -> None:
        """Store the typed token in the OS keyring (in the background); on failure say why."""
        token, url = self.token.edit.text().strip(), self.url_edit.text().strip().rstrip("/")
        if not token or not url:
            self.token.status.setText("Type the agent URL and its token first.")
            return
        if self._store_secret is None:
            self.token.status.setText("No keyring here: name an environment variable instead.")
            return
        self.token.save(self._store_secret, agent_keyring_user(url), token)
