"""QM9 with the protocol of Nash-MTL (Navon et al., ICML 2022, sec. 6.2; AvivNavon/nash-mtl cce1840,
experiments/quantum_chemistry/trainer.py), the one FAMO (Liu et al., NeurIPS 2023) also follows.

Graphs: PyG's `QM9` node and edge features built from qm9pack (tasks/qm9_molecules.py, cached by
tasks/qm9_cache.py), each served with nash-mtl's `Complete` (every ordered pair of distinct atoms, the bond one-hot
zero for non-bonded pairs) and PyG's `Distance(norm=False)` (the distance appended): 5 edge features.
Split: a seeded permutation of the molecules; test = the first `n_test`, validation = the next `n_val`, train = the
rest (or its first `n_train`). Targets standardised; loss MSE on standardised targets; metric `mae` in the papers'
units (meV for energies), lower is better.

Their code standardises with the whole dataset's mean and std although it means the training split's
(`train_dataset.data.y` is the storage shared by every split): `standardize=train` (our default) uses the training
split's statistics, `standardize=all` theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from mtl_bench.tasks.base import Task, TaskSet
from mtl_bench.tasks.losses import mse_loss
from mtl_bench.tasks.qm9_cache import load_graphs
from mtl_bench.tasks.qm9_molecules import FEATURES

# PyG's 19 target columns by name. u0..g are the atomization energies (PyG 12-15) that the papers report as
# U0, U, H, G; the total energies (PyG 7-10) are u0_total..g_total.
COLUMNS = (
    "mu",
    "alpha",
    "homo",
    "lumo",
    "gap",
    "r2",
    "zpve",
    "u0_total",
    "u_total",
    "h_total",
    "g_total",
    "cv",
    "u0",
    "u",
    "h",
    "g",
    "rot_a",
    "rot_b",
    "rot_c",
)
NASH_MTL = ("mu", "alpha", "homo", "lumo", "r2", "zpve", "u0", "u", "h", "g", "cv")  # PyG [0,1,2,3,5,6,12..15,11]
EV = {"homo", "lumo", "gap", "zpve", "u0_total", "u_total", "h_total", "g_total", "u0", "u", "h", "g"}
STANDARDIZE = ("train", "all", "none")


@dataclass(frozen=True)
class MAE:
    """Sum over the batch of |pred - target| in the papers' unit: standardised values times `scale`."""

    scale: float

    def __call__(self, pred: Tensor, target: Tensor) -> dict[str, Tensor]:
        if pred.shape != target.shape:
            raise ValueError(f"prediction shape {tuple(pred.shape)} != target shape {tuple(target.shape)}")
        return {"mae": (pred.detach().float() - target).abs().sum() * self.scale}


class GraphSplit(Dataset):
    """Molecules `ids` of the collated `graphs`; item i is (PyG Data with x, edge_index, edge_attr (5 wide), pos, z;
    {task: target (1,)}); `collate` batches items into (PyG Batch, {task: (B, 1)})."""

    def __init__(self, graphs: Mapping[str, Any], ids: Tensor, y: Tensor, names: Sequence[str]) -> None:
        from torch_geometric.transforms import Distance

        self.graphs, self.ids, self.y, self.names = graphs, ids, y, list(names)
        self.distance = Distance(norm=False, cat=True)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> tuple[Any, dict[str, Tensor]]:
        from torch_geometric.data import Data

        g, m = self.graphs, int(self.ids[int(i)])
        n0, n1 = int(g["node_ptr"][m]), int(g["node_ptr"][m + 1])
        e0, e1 = int(g["edge_ptr"][m]), int(g["edge_ptr"][m + 1])
        edge_index, edge_attr = complete(g["edge_index"][:, e0:e1], g["edge_attr"][e0:e1], n1 - n0)
        data = Data(x=g["x"][n0:n1], z=g["z"][n0:n1], pos=g["pos"][n0:n1], edge_index=edge_index, edge_attr=edge_attr)
        data = self.distance(data)
        y = self.y[m]
        return data, {name: y[k : k + 1] for k, name in enumerate(self.names)}

    def collate(self, items: list[tuple[Any, dict[str, Tensor]]]) -> tuple[Any, dict[str, Tensor]]:
        from torch_geometric.data import Batch

        graphs = Batch.from_data_list([data for data, _ in items])
        return graphs, {name: torch.stack([t[name] for _, t in items]) for name in self.names}


def complete(edge_index: Tensor, edge_attr: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """nash-mtl's `Complete`: every ordered pair (i, j), i != j, in row-major order; the bond's features where
    (i, j) is a bond, zeros elsewhere."""
    full = torch.zeros(n * n, edge_attr.shape[1], dtype=edge_attr.dtype)
    full[edge_index[0] * n + edge_index[1]] = edge_attr
    keep = ~torch.eye(n, dtype=torch.bool).reshape(-1)
    rows = torch.arange(n).repeat_interleave(n)
    cols = torch.arange(n).repeat(n)
    return torch.stack([rows[keep], cols[keep]]), full[keep]


class QM9(TaskSet):
    """One regression task per target (out_dim 1): loss MSE on standardised targets, metric `mae` (lower is
    better) in the papers' units: meV for energies, D for mu, bohr^3 for alpha, bohr^2 for r2, cal/mol K for cv,
    GHz for rot_*. Batches are PyG `Batch`es."""

    def __init__(
        self,
        targets: Sequence[str] = NASH_MTL,
        n_test: int = 10_000,
        n_val: int = 10_000,
        n_train: Optional[int] = None,
        split_seed: int = 0,
        standardize: str = "train",
        features: str = "pyg",
        limit: Optional[int] = None,
        cache_dir: Optional[str] = None,
        reference: Optional[Mapping[str, Mapping[str, float]]] = None,
    ) -> None:
        """
        targets: PyG target names, one task each (default: the 11 of Nash-MTL and FAMO); see COLUMNS.
        n_test: molecules in the test split (the first of the permutation).
        n_val: molecules in the validation split (the next ones).
        n_train: null: every other molecule trains; a number: only the first n_train of them (reduced runs).
        split_seed: seed of the permutation (the presets pass the run's seed, as nash-mtl shuffles per seed).
        standardize: train (training split's mean and std), all (the whole dataset's: nash-mtl's code), none.
        features: pyg (PyG's node features: aromatic and sp/sp2/sp3 all 0, Kekulé bonds) or rdkit (perceived).
        limit: null: all 130,831 molecules; a number: only the first `limit` (tests; part of the cache key).
        cache_dir: where the graphs are cached; null: $XDG_CACHE_HOME/mtl-bench or ~/.cache/mtl-bench.
        reference: single-task metrics {target: {metric: value}} for `mtl-bench report -b reference`; entries of
            targets not trained are dropped (the shipped table covers Nash-MTL's 11, a run may train fewer).
        """
        names = list(targets)
        unknown = [name for name in names if name not in COLUMNS]
        if not names or unknown or len(set(names)) != len(names):
            raise ValueError(
                f"targets: must be distinct names from {', '.join(COLUMNS)}; got {names!r}"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        if standardize not in STANDARDIZE:
            raise ValueError(f"standardize: must be one of {', '.join(STANDARDIZE)}, got {standardize!r}")
        if features not in FEATURES:
            raise ValueError(f"features: must be one of {', '.join(FEATURES)}, got {features!r}")
        for key, value in (("n_test", n_test), ("n_val", n_val)):
            if value <= 0:
                raise ValueError(f"{key}: must be > 0, got {value}")
        if n_train is not None and n_train <= 0:
            raise ValueError(f"n_train: must be null (the rest) or > 0, got {n_train}")
        graphs = load_graphs(features, limit, cache_dir)
        m = int(graphs["y"].shape[0])
        if n_test + n_val >= m:
            raise ValueError(
                f"n_test: n_test + n_val = {n_test + n_val} leaves no training molecules of {m}; "
                "set smaller tasks.n_test and tasks.n_val"
            )
        perm = torch.randperm(m, generator=torch.Generator().manual_seed(split_seed))
        ids = {"test": perm[:n_test], "val": perm[n_test : n_test + n_val], "train": perm[n_test + n_val :]}
        if n_train is not None:
            if n_train > len(ids["train"]):
                raise ValueError(f"n_train: {n_train} > the {len(ids['train'])} molecules left for training")
            ids["train"] = ids["train"][:n_train]
        y = graphs["y"][:, [COLUMNS.index(name) for name in names]]
        if standardize == "none":
            mean, std = torch.zeros(len(names)), torch.ones(len(names))
        else:
            rows = y[ids["train"]] if standardize == "train" else y
            mean, std = rows.mean(dim=0), rows.std(dim=0)
        self.mean, self.std = mean, std
        y = (y - mean) / std
        scale = [float(s) * (1000.0 if name in EV else 1.0) for name, s in zip(names, std)]
        tasks = [
            Task(
                name=name,
                out_dim=1,
                loss=mse_loss,
                metrics=MAE(s),
                higher_is_better={"mae": False},
                initial_loss=1.0 if standardize == "train" else None,  # predicting the mean: the variance, 1
            )
            for name, s in zip(names, scale)
        ]
        splits = {split: GraphSplit(graphs, i, y, names) for split, i in ids.items()}
        unknown = [name for name in reference or {} if name not in COLUMNS]
        if unknown:
            raise ValueError(f"reference: {', '.join(unknown)} is not a QM9 target; targets: {', '.join(COLUMNS)}")
        if reference is not None:
            reference = {name: values for name, values in reference.items() if name in names}
        super().__init__(tasks, (int(graphs["x"].shape[1]),), reference=reference, **splits)
