"""ListEditor (ui/list_editor.py), the settings dialog's one master-detail list editor: add, edit,
remove and what gets selected next, and the loading guard (showing an item never writes it back)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtWidgets import QLineEdit, QSpinBox
from pytestqt.qtbot import QtBot

from trayapp.ui.list_editor import ListEditor


@dataclass(frozen=True)
class Pet:
    name: str
    legs: int = 4


class PetEditor:
    """A ListEditor[Pet] with a name line and a legs spin box whose change signals (fired by
    programmatic sets too, like the real tabs' combo boxes and check boxes) store the form."""

    def __init__(self, qtbot: QtBot, pets: list[Pet]) -> None:
        self.reads: list[Pet] = []  # read_form's calls, each with the stored item it was given
        self.editor = ListEditor(
            pets,
            caption="Pets",
            title="Pet",
            blank=Pet("", 0),
            item_text=lambda pet: f"{pet.name} ({pet.legs} legs)",
            fill_form=self.fill,
            read_form=self.read,
            new_item=lambda: Pet("new"),
            add_text="Add a pet",
        )
        qtbot.addWidget(self.editor)
        self.name = QLineEdit()
        self.legs = QSpinBox()
        self.editor.form.addRow("Name", self.name)
        self.editor.form.addRow("Legs", self.legs)
        self.name.textChanged.connect(self.editor.store_form)
        self.legs.valueChanged.connect(self.editor.store_form)
        self.editor.focus_on_add = self.name
        self.editor.select(0 if pets else -1)

    def fill(self, pet: Pet) -> None:
        self.name.setText(pet.name)
        self.legs.setValue(pet.legs)

    def read(self, pet: Pet) -> Pet:
        self.reads.append(pet)
        return replace(pet, name=self.name.text(), legs=self.legs.value())

    def lines(self) -> list[str]:
        return [self.editor.list.item(row).text() for row in range(self.editor.list.count())]

    def shown(self) -> tuple[str, int]:
        return self.name.text(), self.legs.value()


def test_it_starts_on_the_first_item(qtbot: QtBot) -> None:
    pets = PetEditor(qtbot, [Pet("cat"), Pet("bird", 2)])
    assert pets.lines() == ["cat (4 legs)", "bird (2 legs)"]
    assert pets.editor.list.currentRow() == 0 and pets.shown() == ("cat", 4)
    assert pets.editor.box.isEnabled() and pets.editor.remove_button.isEnabled()
    assert pets.editor.add_button.text() == "Add a pet"


def test_an_empty_list_shows_the_blank_item_in_a_disabled_form(qtbot: QtBot) -> None:
    pets = PetEditor(qtbot, [])
    assert pets.editor.current() is None and pets.shown() == ("", 0)
    assert not pets.editor.box.isEnabled() and not pets.editor.remove_button.isEnabled()
    pets.editor.remove()  # nothing to remove: nothing happens
    assert pets.editor.items == []


def test_add_appends_the_new_item_selected_with_its_first_field_selected(qtbot: QtBot) -> None:
    pets = PetEditor(qtbot, [Pet("cat")])
    pets.editor.add_button.click()
    assert pets.editor.items == [Pet("cat"), Pet("new")]
    assert pets.lines() == ["cat (4 legs)", "new (4 legs)"]
    assert pets.editor.list.currentRow() == 1 and pets.shown() == ("new", 4)
    assert pets.name.selectedText() == "new"  # ready to be typed over
    pets.editor.add(Pet("spider", 8))
    assert pets.editor.current() == Pet("spider", 8) and pets.lines()[2] == "spider (8 legs)"


def test_editing_the_form_writes_the_selected_item_and_its_line(qtbot: QtBot) -> None:
    pets = PetEditor(qtbot, [Pet("cat"), Pet("bird", 2)])
    pets.editor.list.setCurrentRow(1)
    pets.name.setText("parrot")
    pets.legs.setValue(3)
    assert pets.editor.items == [Pet("cat"), Pet("parrot", 3)]  # the first is untouched
    assert pets.lines() == ["cat (4 legs)", "parrot (3 legs)"]


def test_remove_selects_the_item_that_took_its_place_else_the_new_last(qtbot: QtBot) -> None:
    pets = PetEditor(qtbot, [Pet("ant", 6), Pet("bird", 2), Pet("cat")])
    pets.editor.list.setCurrentRow(1)
    pets.editor.remove_button.click()  # the middle one: the next moves up into its row
    assert pets.editor.items == [Pet("ant", 6), Pet("cat")]
    assert pets.lines() == ["ant (6 legs)", "cat (4 legs)"]
    assert pets.editor.list.currentRow() == 1 and pets.shown() == ("cat", 4)
    pets.editor.remove()  # the last one: the one before it
    assert pets.editor.items == [Pet("ant", 6)]
    assert pets.editor.list.currentRow() == 0 and pets.shown() == ("ant", 6)
    pets.editor.remove()  # the only one: nothing left, the form blank and off
    assert pets.editor.items == [] and pets.lines() == []
    assert pets.shown() == ("", 0) and not pets.editor.box.isEnabled()


def test_filling_the_form_does_not_write_back(qtbot: QtBot) -> None:
    pets = PetEditor(qtbot, [Pet("cat"), Pet("bird", 2)])
    pets.editor.list.setCurrentRow(1)  # the name and legs signals fire while bird is shown
    pets.editor.list.setCurrentRow(0)
    pets.editor.add()
    pets.editor.remove()
    assert pets.reads == []  # read_form never ran: no half-filled form was stored
    assert pets.editor.items == [Pet("cat"), Pet("bird", 2)]
    assert pets.lines() == ["cat (4 legs)", "bird (2 legs)"]
    pets.legs.setValue(5)  # the user's edit afterwards is stored
    assert pets.reads == [Pet("bird", 2)] and pets.editor.items[1] == Pet("bird", 5)
