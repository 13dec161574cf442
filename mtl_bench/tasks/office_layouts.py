"""The two Office data sets' folder layouts and class names: data only, read by `office` (the shared reader,
which names the other data set when a tree is of the wrong kind) and by `office31` and `office_home`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class OfficeLayout:
    """Where a dataset's images are: each domain's folder of class folders, relative to `tasks.root`."""

    name: str  # "Office-31"
    option: str  # "office31"
    domains: Mapping[str, Sequence[str]]  # task (domain) -> folders that may hold its class folders, first found wins
    classes: Sequence[str]  # every class name
    pattern: str  # the layout in words, for messages
    split_folder: str  # LibMTL's examples/office/data_txt/<split_folder>

    @property
    def labels(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(sorted(self.classes))}

    def describe(self) -> str:
        return f"the {self.name} layout {self.pattern}, up to {len(self.classes)} class folders per domain"


OFFICE_31_CLASSES = (
    "back_pack",
    "bike",
    "bike_helmet",
    "bookcase",
    "bottle",
    "calculator",
    "desk_chair",
    "desk_lamp",
    "desktop_computer",
    "file_cabinet",
    "headphones",
    "keyboard",
    "laptop_computer",
    "letter_tray",
    "mobile_phone",
    "monitor",
    "mouse",
    "mug",
    "paper_notebook",
    "pen",
    "phone",
    "printer",
    "projector",
    "punchers",
    "ring_binder",
    "ruler",
    "scissors",
    "speaker",
    "stapler",
    "tape_dispenser",
    "trash_can",
)

OFFICE_HOME_CLASSES = (
    "Alarm_Clock",
    "Backpack",
    "Batteries",
    "Bed",
    "Bike",
    "Bottle",
    "Bucket",
    "Calculator",
    "Calendar",
    "Candles",
    "Chair",
    "Clipboards",
    "Computer",
    "Couch",
    "Curtains",
    "Desk_Lamp",
    "Drill",
    "Eraser",
    "Exit_Sign",
    "Fan",
    "File_Cabinet",
    "Flipflops",
    "Flowers",
    "Folder",
    "Fork",
    "Glasses",
    "Hammer",
    "Helmet",
    "Kettle",
    "Keyboard",
    "Knives",
    "Lamp_Shade",
    "Laptop",
    "Marker",
    "Monitor",
    "Mop",
    "Mouse",
    "Mug",
    "Notebook",
    "Oven",
    "Pan",
    "Paper_Clip",
    "Pen",
    "Pencil",
    "Postit_Notes",
    "Printer",
    "Push_Pin",
    "Radio",
    "Refrigerator",
    "Ruler",
    "Scissors",
    "Screwdriver",
    "Shelf",
    "Sink",
    "Sneakers",
    "Soda",
    "Speaker",
    "Spoon",
    "TV",
    "Table",
    "Telephone",
    "ToothBrush",
    "Toys",
    "Trash_Can",
    "Webcam",
)

OFFICE_31 = OfficeLayout(
    name="Office-31",
    option="office31",
    domains={d: (f"{d}/images", d) for d in ("amazon", "dslr", "webcam")},
    classes=OFFICE_31_CLASSES,
    pattern="{amazon,dslr,webcam}/images/<class>/<image>.jpg",
    split_folder="office-31",
)

OFFICE_HOME = OfficeLayout(
    name="Office-Home",
    option="office_home",
    domains={
        "Art": ("Art",),
        "Clipart": ("Clipart",),
        "Product": ("Product",),
        "Real_World": ("Real_World", "Real World"),
    },
    classes=OFFICE_HOME_CLASSES,
    pattern="{Art,Clipart,Product,Real_World}/<class>/<image>.jpg (or 'Real World')",
    split_folder="office-home",
)

LAYOUTS = (OFFICE_31, OFFICE_HOME)  # every known layout, for the hint at a tree of the wrong data set
