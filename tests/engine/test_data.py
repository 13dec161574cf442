"""engine/data.py's held-out rows: the seeded split a bilevel balancer's validation stream is drawn from."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from mtl_bench.engine.data import SampleIndex, Subset, hold_out
from mtl_bench.tasks.base import Split


def numbered_split(n: int) -> Split:
    return Split(torch.arange(n, dtype=torch.float32)[:, None], {"t": torch.arange(n)})


def test_held_out_rows_are_a_seeded_part_of_the_split_and_never_in_the_rest():
    kept, held = hold_out(numbered_split(100), 0.1, seed=3)
    assert isinstance(kept, Split) and isinstance(held, Split)  # tensor-resident: still indexed on the device
    kept_rows, held_rows = kept.targets["t"].tolist(), held.targets["t"].tolist()
    assert len(held_rows) == 10 and len(kept_rows) == 90
    assert sorted(kept_rows + held_rows) == list(range(100))
    assert held_rows == sorted(held_rows) and held.inputs[:, 0].tolist() == held_rows  # rows stay aligned
    _, again = hold_out(numbered_split(100), 0.1, seed=3)
    _, other = hold_out(numbered_split(100), 0.1, seed=4)
    assert again.targets["t"].tolist() == held_rows and other.targets["t"].tolist() != held_rows


class Recorded(Dataset):
    """A dataset read item by item that records the index objects it is asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int):
        self.asked.append(i)
        return torch.tensor([float(i)]), {"t": torch.tensor(i)}

    @staticmethod
    def collate(items):
        return torch.stack([x for x, _ in items]), {"t": torch.stack([y["t"] for _, y in items])}


def test_a_dataset_from_disk_keeps_each_draws_key_and_its_collate():
    data = Recorded()
    kept, held = hold_out(data, 0.25, seed=0)
    assert isinstance(held, Subset) and len(held) == 5 and len(kept) == 15
    assert held.collate is Recorded.collate
    row = held.rows[2]
    held[SampleIndex(2, key=12345)]
    assert data.asked[-1] == row and isinstance(data.asked[-1], SampleIndex) and data.asked[-1].key == 12345
    held[1]
    assert data.asked[-1] == held.rows[1] and not isinstance(data.asked[-1], SampleIndex)
