"""engine/data.py: the held-out rows a bilevel balancer's validation stream is drawn from; on CUDA, pinned memory and
non-blocking copies."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from mtl_bench.engine.data import SampleIndex, Subset, hold_out
from mtl_bench.engine.recipe import train
from mtl_bench.tasks.base import Split
from tests.helpers.dense_tree import write_nyuv2


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


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bilevel_run_holds_out_rows_of_a_task_set_read_from_disk(compose_cfg, tmp_path, workers):
    """NYUv2's tree served by a DataLoader (workers receive the Subset and its keyed indices) trains Auto-λ."""
    root = write_nyuv2(tmp_path / "nyuv2", n_train=6, n_val=3)
    overrides = [
        "tasks=nyuv2",
        f"tasks.root={root}",
        "model._target_=tests.helpers.dense_tree.TinyDense",
        "balancer=auto_lambda",
        "trainer=smoke",
        "trainer.max_steps=2",
        "trainer.batch_size=2",
        "trainer.eval_every=2",
        "trainer.device=cpu",
        "trainer.validation_holdout=0.34",  # 2 of the 6 training images
        f"trainer.num_workers={workers}",
    ]
    result = train(compose_cfg(*overrides), tmp_path / "run", overrides=overrides)  # drops mlp's keys TinyDense lacks
    assert result.step == 2
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["balancer"]
    assert state["weighting.opt_step"].item() == 2 and torch.isfinite(state["weighting.logits"]).all()


class Moved:
    """A batch part that records how it was moved."""

    def __init__(self) -> None:
        self.moves: list[tuple[torch.device, bool]] = []

    def to(self, device, non_blocking=False):
        self.moves.append((torch.device(device), non_blocking))
        return self


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_on_cuda_the_data_path_pins_memory_and_copies_without_blocking(monkeypatch, device):
    """No GPU needed: the loader is replaced by one that records its options, and pinning by a recorder."""
    from mtl_bench.engine import data
    from mtl_bench.engine.data import BatchSource, StepSampler, eval_batches

    device = torch.device(device)
    loaders: list[dict] = []
    parts: list[Moved] = []

    def loader(dataset, **options):
        loaders.append(options)
        while True:
            inputs, target = Moved(), Moved()
            parts.extend([inputs, target])
            yield inputs, {"t": target}

    pinned: list[int] = []
    monkeypatch.setattr(data, "DataLoader", lambda dataset, **options: loader(dataset, **options))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self.numel()) or self)

    class Disk(Dataset):
        def __len__(self) -> int:
            return 8

    BatchSource(Disk(), StepSampler(8, 4, seed=0), 0, 4, device).batch(0)
    next(eval_batches(Disk(), 4, device))
    cuda = device.type == "cuda"
    assert [options["pin_memory"] for options in loaders] == [cuda, cuda]
    assert all(part.moves == [(device, True)] for part in parts)  # every copy non-blocking
    # A tensor-resident split: the step's indices come from a permutation pinned once an epoch on CUDA.
    split = numbered_split(8)
    source = BatchSource(split, StepSampler(8, 4, seed=0), 0, 4, device)
    inputs, targets = source.batch(0)
    assert pinned == ([8] if cuda else [])
    assert torch.equal(inputs[:, 0].long(), targets["t"])
