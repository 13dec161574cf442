"""The QM9 graphs built once into one file under the user's cache directory (as PyG's `process()` does).

The file name is the key: qm9pack's version, the featurization, the molecule limit and our format version. One
process builds while the others wait on a file lock; the build goes to a temporary file renamed into place, so a
reader never sees half a cache. A cache that does not load or whose contents disagree with its key is rebuilt.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from mtl_bench.files import atomic_write
from mtl_bench.tasks.qm9_molecules import FEATURES, molecule, qm9pack_files, read_rows, require_chem

log = logging.getLogger("mtl_bench")
FORMAT = 1  # bump when the layout or the featurization code changes
FULL = 130_831  # molecules in qm9pack 1.0.3 (PyG's QM9 without the 3,054 uncharacterized)
KEYS = ("x", "z", "pos", "edge_index", "edge_attr", "y", "index", "node_ptr", "edge_ptr")


def cache_root(cache_dir: Optional[str] = None) -> Path:
    """`cache_dir`, else $XDG_CACHE_HOME/mtl-bench, else ~/.cache/mtl-bench."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mtl-bench"


def cache_path(root: Path, version: str, features: str, limit: Optional[int]) -> Path:
    size = "all" if limit is None else f"first{limit}"
    return root / "qm9" / f"qm9pack-{version}_{features}_{size}_v{FORMAT}.pt"


def load_graphs(features: str = "pyg", limit: Optional[int] = None, cache_dir: Optional[str] = None) -> dict[str, Any]:
    """The collated graphs (see `build`), from the cache, building it first when missing or damaged."""
    from filelock import FileLock

    require_chem()
    if features not in FEATURES:
        raise ValueError(f"features: must be one of {', '.join(FEATURES)}, got {features!r}")
    if limit is not None and not (isinstance(limit, int) and limit > 0):
        raise ValueError(f"limit: must be null (every molecule) or a positive number of molecules, got {limit!r}")
    version, files = qm9pack_files()
    path = cache_path(cache_root(cache_dir), version, features, limit)
    meta = {"format": FORMAT, "qm9pack": version, "features": features, "limit": limit}
    graphs = _read(path, meta)  # the common case: built already, no lock needed (the file appears by rename)
    if graphs is not None:
        return graphs
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        graphs = _read(path, meta)  # another process may have built it while we waited
        if graphs is None:
            if path.exists():
                log.warning("QM9 cache %s is damaged: rebuilding it", path)
            graphs = build(files, features, limit)
            graphs["meta"] = meta
            _write(path, graphs)
            log.info("QM9 cache written: %s", path)
    return graphs


def build(files: list[Path], features: str, limit: Optional[int]) -> dict[str, Any]:
    """Every molecule's tensors concatenated; molecule i's nodes are node_ptr[i]:node_ptr[i+1] (edge_index local
    to its molecule), its edges edge_ptr[i]:edge_ptr[i+1]; y (M, 19) in PyG's units; index = qm9pack's Index."""
    from rich.progress import track

    total = FULL if limit is None else min(limit, FULL)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("x", "z", "pos", "edge_index", "edge_attr", "y")}
    index, nodes, edges, fallbacks = [], [0], [0], 0
    rows = read_rows(files, limit)
    bar = sys.stderr.isatty()
    for row in track(rows, total=total, description="QM9 graphs", disable=not bar) if bar else rows:
        mol = molecule(row, features)
        for key in parts:
            parts[key].append(getattr(mol, key))
        index.append(mol.index)
        nodes.append(nodes[-1] + mol.x.shape[0])
        edges.append(edges[-1] + mol.edge_index.shape[1])
        fallbacks += mol.fallback
        if not bar and len(index) % 10_000 == 0:
            log.info("QM9 graphs: %d/%d", len(index), total)
    graphs: dict[str, Any] = {
        key: torch.cat(values, dim=1 if key == "edge_index" else 0) for key, values in parts.items()
    }
    graphs["index"] = torch.tensor(index, dtype=torch.long)
    graphs["node_ptr"] = torch.tensor(nodes, dtype=torch.long)
    graphs["edge_ptr"] = torch.tensor(edges, dtype=torch.long)
    graphs["fallbacks"] = fallbacks
    return graphs


def _write(path: Path, graphs: dict[str, Any]) -> None:
    """Atomic (readers see the old state or the whole file), with the mode the user's umask gives a new file, so a
    group sharing tasks.cache_dir can read it (mkstemp alone makes it 0600)."""
    atomic_write(path, lambda f: torch.save(graphs, f))


def _read(path: Path, meta: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The cache if it loads and is consistent with its key, else None (missing or damaged)."""
    if not path.is_file():
        return None
    try:
        graphs = torch.load(path, weights_only=True)
        ok = _consistent(graphs, meta)
    except Exception:  # any unreadable file is a damaged cache: torch.load raises many kinds
        return None
    return graphs if ok else None


def _consistent(graphs: Any, meta: dict[str, Any]) -> bool:
    if not isinstance(graphs, dict) or graphs.get("meta") != meta or any(k not in graphs for k in KEYS):
        return False
    m = graphs["y"].shape[0]
    node_ptr, edge_ptr = graphs["node_ptr"], graphs["edge_ptr"]
    return bool(
        m > 0
        and graphs["y"].shape[1] == 19
        and node_ptr.shape == edge_ptr.shape == (m + 1,)
        and int(node_ptr[-1]) == graphs["x"].shape[0] == graphs["z"].shape[0] == graphs["pos"].shape[0]
        and int(edge_ptr[-1]) == graphs["edge_index"].shape[1] == graphs["edge_attr"].shape[0]
        and graphs["index"].shape == (m,)
        and bool(torch.isfinite(graphs["y"]).all())
    )
