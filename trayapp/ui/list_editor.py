"""The settings dialog's list editor, and the secret field its forms use.

`ListEditor[T]` edits a list of frozen values (servers, proxies, remote machines): the list with
Add and Remove on the left, the selected item's form on the right. The owner adds its fields to
`form`, connects their edit signals to `store_form`, and gives the hooks: `item_text` (the list's
line), `fill_form` (show an item), `read_form` (the item as the form shows it, from the stored one)
and `new_item` (what Add adds). Filling the form never writes back into the list.

`SecretField` is a password line, a "Save … in keyring" button and a status line: the secret goes
to the OS keyring off the GUI thread, never into the config file, and the status says how it went.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

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

from trayapp.ui.worker import run_in_background

log = logging.getLogger(__name__)

T = TypeVar("T")


class ListEditor(QWidget, Generic[T]):
    """The items on the left (with Add and Remove), the selected one's form on the right.

    The form starts empty and nothing is shown until the owner, having built the form, calls
    `select` (the hooks may use widgets that do not exist yet while the editor is built).
    """

    def __init__(
        self,
        items: Sequence[T],
        *,
        caption: str,  # above the list
        title: str,  # the form's group box
        blank: T,  # what the (disabled) form shows when nothing is selected
        item_text: Callable[[T], str],
        fill_form: Callable[[T], None],
        read_form: Callable[[T], T],
        new_item: Callable[[], T],
        add_text: str = "Add",
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.items: list[T] = list(items)
        self._blank = blank
        self._item_text = item_text
        self._fill_form = fill_form
        self._read_form = read_form
        self._new_item = new_item
        self._loading = False  # True while fill_form runs: the fields' signals must not write back
        self.focus_on_add: QWidget | None = None  # the field that gets the focus after Add
        layout = QHBoxLayout(self)
        left = QVBoxLayout()
        self.list = QListWidget()
        self.list.addItems([item_text(item) for item in self.items])
        self.list.currentRowChanged.connect(self.select)
        left.addWidget(QLabel(caption))
        left.addWidget(self.list)
        buttons = QHBoxLayout()
        self.add_button = QPushButton(add_text)
        self.add_button.clicked.connect(lambda: self.add())
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.remove_button)
        left.addLayout(buttons)
        layout.addLayout(left, 1)
        self.box = QGroupBox(title)
        self.form = QFormLayout(self.box)
        layout.addWidget(self.box, 2)

    def current(self) -> T | None:
        """The selected item; None when nothing is selected."""
        row = self.list.currentRow()
        return self.items[row] if 0 <= row < len(self.items) else None

    def select(self, row: int) -> None:
        """Show item `row` in the form; out of range (-1): the blank item, in a disabled form."""
        valid = 0 <= row < len(self.items)
        self.box.setEnabled(valid)
        self.remove_button.setEnabled(valid)
        self._loading = True
        try:
            self._fill_form(self.items[row] if valid else self._blank)
        finally:
            self._loading = False
        if valid and self.list.currentRow() != row:
            self.list.setCurrentRow(row)

    def store_form(self, *_signal_args: object) -> T | None:
        """Write the form back into the selected item and its line; the item, or None if nothing was
        stored (nothing selected, or the form is being filled)."""
        row = self.list.currentRow()
        if self._loading or not 0 <= row < len(self.items):
            return None
        self.set_item(row, self._read_form(self.items[row]))
        return self.items[row]

    def set_item(self, row: int, item: T) -> None:
        self.items[row] = item
        self.list.item(row).setText(self._item_text(item))

    def add(self, item: T | None = None) -> None:
        """Append `item` (by default `new_item()`), select it and focus `focus_on_add`."""
        self.items.append(self._new_item() if item is None else item)
        self.list.addItem(self._item_text(self.items[-1]))
        self.select(len(self.items) - 1)
        field = self.focus_on_add
        if field is not None:
            field.setFocus()
            if isinstance(field, QLineEdit):
                field.selectAll()

    def remove(self) -> None:
        """Remove the selected item and select the one that took its place (or the new last one)."""
        row = self.list.currentRow()
        if not 0 <= row < len(self.items):
            return
        del self.items[row]
        self.list.takeItem(row)
        self.select(min(row, len(self.items) - 1))


class SecretField:
    """A secret's password line with its "Save <what> in keyring" button, and a status line below."""

    def __init__(self, what: str, placeholder: str) -> None:
        self.what = what  # "key", "token"
        self.edit = QLineEdit()
        self.edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.edit.setPlaceholderText(placeholder)
        self.button = QPushButton(f"Save {what} in keyring")
        self.status = QLabel()
        self.status.setWordWrap(True)

    def add_rows(self, form: QFormLayout, label: str) -> None:
        row = QHBoxLayout()
        row.addWidget(self.edit, 1)
        row.addWidget(self.button)
        form.addRow(label, row)
        form.addRow("", self.status)

    def save(
        self,
        store: Callable[[str, str], None],
        user: str,
        secret: str,
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        """Run `store(user, secret)` in the background; then clear the line and call `on_saved`, or
        show why it failed (the reason, never the secret)."""
        self.button.setEnabled(False)
        self.status.setText(f"Saving the {self.what} in the OS keyring…")

        def done(_result: object) -> None:
            if not Shiboken.isValid(self.button):
                return  # the dialog closed meanwhile
            self.button.setEnabled(True)
            self.edit.clear()
            self.status.setText(f"✓ {self.what.capitalize()} saved in the OS keyring.")
            log.info("%s stored in the OS keyring", self.what)
            if on_saved is not None:
                on_saved()

        def failed(exc: BaseException) -> None:
            if not Shiboken.isValid(self.button):
                return
            self.button.setEnabled(True)
            self.status.setText(f"✗ Could not store the {self.what}: {exc}")
            log.warning("keyring: %s", exc)

        run_in_background(lambda: store(user, secret), done, failed, name="llm-tray-keyring")
