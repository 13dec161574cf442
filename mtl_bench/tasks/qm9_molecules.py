"""QM9 molecules from qm9pack's CSVs as PyTorch Geometric's `QM9` graphs (torch_geometric/datasets/qm9.py, 2.8.1).

PyG reads its SDF; qm9pack (R. Ramakrishnan, the QM9 author) ships the same 130,831 molecules as CSV rows with
SMILES, elements and XYZ coordinates. Bonds in XYZ atom order: RDKit's connectivity of the XYZ block, onto which
the SMILES with explicit hydrogens is matched (the SMILES atom order differs in ~0.3% of molecules); where no match
exists (2 molecules), RDKit's `DetermineBonds` on the XYZ. Targets: PyG's 19 columns in PyG's units.
"""

from __future__ import annotations

import ast
import csv
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

INSTALL = "pip install 'mtl-bench[chem]'"
HAR2EV = 27.211386246  # PyG's Hartree -> eV
TYPES = {"H": 0, "C": 1, "N": 2, "O": 3, "F": 4}
NUMBERS = {"H": 1, "C": 6, "N": 7, "O": 8, "F": 9}
# PyG's `atomrefs` for U0, U, H, G (eV) of H, C, N, O, F: X_atom = X - sum over atoms of the reference.
ATOMREF = {
    "H": (-13.61312172, -13.5745904, -13.54887564, -13.90303183),
    "C": (-1029.86312267, -1029.82456413, -1029.79887659, -1030.25891228),
    "N": (-1485.30251237, -1485.26398105, -1485.2382935, -1485.71166277),
    "O": (-2042.61123593, -2042.5727046, -2042.54701705, -2043.01812778),
    "F": (-2713.48485589, -2713.44632457, -2713.42063702, -2713.88796536),
}
# PyG's 19 target columns, each as (CSV column, factor to PyG's unit).
TARGETS = (
    ("Dipole_debye", 1.0),  # 0 mu (D)
    ("Polarizability_bohr3", 1.0),  # 1 alpha (bohr^3)
    ("HOMO_au", HAR2EV),  # 2 homo (eV)
    ("LUMO_au", HAR2EV),  # 3 lumo (eV)
    ("HOMO_LUMO_gap_au", HAR2EV),  # 4 gap (eV)
    ("R2_bohr2", 1.0),  # 5 r2 (bohr^2)
    ("ZPVE_au", HAR2EV),  # 6 zpve (eV)
    ("InternalEnergy_0K_au", HAR2EV),  # 7 U0 (eV)
    ("InternalEnergy_298K_au", HAR2EV),  # 8 U (eV)
    ("Enthalphy_298K_au", HAR2EV),  # 9 H (eV)
    ("GibbsFreeEnergy_298K_au", HAR2EV),  # 10 G (eV)
    ("Heatcapacity_Cv_cal_mol_K", 1.0),  # 11 cv (cal/mol K)
)  # 12-15: U0_atom, U_atom, H_atom, G_atom (eV) from 7-10; 16-18: A, B, C (GHz)
ROTATIONS = ("RotA_GHz", "RotB_GHz", "RotC_GHz")
FEATURES = ("pyg", "rdkit")


def require_chem() -> None:
    """ImportError in one line naming the extra when rdkit or torch_geometric is missing."""
    for module in ("rdkit", "torch_geometric"):
        try:
            with warnings.catch_warnings():  # torch_geometric 2.8's import warns that torch.jit.script is deprecated
                warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
                __import__(module)
        except ImportError as err:
            raise ImportError(f"tasks=qm9 needs {module}: {INSTALL}") from err


def qm9pack_files() -> tuple[str, list[Path]]:
    """(qm9pack's version, its three data CSVs), found through the installed distribution's metadata:
    `import qm9pack` (and so `importlib.resources.files("qm9pack")`) fails with setuptools >= 81."""
    try:
        dist = metadata.distribution("qm9pack")
    except metadata.PackageNotFoundError as err:
        raise ImportError(f"tasks=qm9 needs qm9pack: {INSTALL}") from err
    files = [Path(str(dist.locate_file(f"qm9pack/data/qm9_part{i}.csv"))) for i in (1, 2, 3)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ImportError(f"qm9pack {dist.version} lacks {', '.join(missing)}: reinstall it ({INSTALL})")
    return dist.version, files


def read_rows(files: list[Path], limit: int | None = None) -> Iterator[dict[str, str]]:
    """The CSV rows in file order (= PyG's order: ascending Index), the first `limit` of them if given."""
    csv.field_size_limit(sys.maxsize)  # the frequency and Mulliken columns are long
    n = 0
    for path in files:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if limit is not None and n >= limit:
                    return
                n += 1
                yield row


def targets(row: dict[str, str], elements: list[str]) -> list[float]:
    """PyG's 19 targets of one molecule, in PyG's units (computed in float64, stored in float32 as PyG)."""
    y = [float(row[column]) * factor for column, factor in TARGETS]
    atomized = [y[7 + k] - sum(ATOMREF[e][k] for e in elements) for k in range(4)]
    return [*y, *atomized, *(float(row[c]) for c in ROTATIONS)]


@dataclass
class Molecule:
    """One graph's tensors, as PyG's `QM9` holds them (edges both ways, sorted by source * N + target)."""

    x: Tensor  # (N, 11) float: one-hot H,C,N,O,F; atomic number; aromatic; sp; sp2; sp3; number of H
    z: Tensor  # (N,) long
    pos: Tensor  # (N, 3) float, Å
    edge_index: Tensor  # (2, E) long
    edge_attr: Tensor  # (E, 4) float: one-hot single, double, triple, aromatic
    y: Tensor  # (1, 19) float
    index: int  # qm9pack's Index (1-based gdb number)
    fallback: bool  # bonds from DetermineBonds (no SMILES match)


def molecule(row: dict[str, str], features: str = "pyg") -> Molecule:
    """One CSV row as a graph. `features`: "pyg" = PyG's (its SDF read with sanitize=False: aromatic and
    sp/sp2/sp3 all 0, Kekulé bonds); "rdkit" = RDKit-perceived aromaticity and hybridization, aromatic bonds."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdDetermineBonds

    # A warning per odd valence would flood the build's output.
    RDLogger.DisableLog("rdApp.*")  # type: ignore[attr-defined]
    elements = ast.literal_eval(row["Elements"])
    xyz = ast.literal_eval(row["XYZ_Ang"])  # some coordinates are written `0.`: not JSON
    block = f"{len(elements)}\n\n" + "".join(f"{e} {x:.10f} {y:.10f} {z:.10f}\n" for e, (x, y, z) in zip(elements, xyz))
    geometry = Chem.MolFromXYZBlock(block)
    connectivity = Chem.Mol(geometry)
    rdDetermineBonds.DetermineConnectivity(connectivity)
    chem = Chem.AddHs(Chem.MolFromSmiles(row["SMILES"]))
    match = connectivity.GetSubstructMatch(_bare_graph(chem)) if chem is not None else ()
    if match:
        order = list(match)  # SMILES atom i is XYZ atom order[i]
    else:
        chem = Chem.Mol(geometry)
        rdDetermineBonds.DetermineBonds(chem, charge=0)
        order = list(range(len(elements)))
    if features == "pyg":
        Chem.Kekulize(chem, clearAromaticFlags=True)
    n = len(elements)
    bond_types = {
        Chem.BondType.SINGLE: 0,
        Chem.BondType.DOUBLE: 1,
        Chem.BondType.TRIPLE: 2,
        Chem.BondType.AROMATIC: 3,
    }
    rows, cols, kinds = [], [], []
    for bond in chem.GetBonds():
        a, b = order[bond.GetBeginAtomIdx()], order[bond.GetEndAtomIdx()]
        rows += [a, b]
        cols += [b, a]
        kinds += 2 * [bond_types[bond.GetBondType()]]
    edge_index = torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1)
    kind = torch.tensor(kinds, dtype=torch.long)
    perm = (edge_index[0] * n + edge_index[1]).argsort()
    edge_index, kind = edge_index[:, perm], kind[perm]
    z = torch.tensor([NUMBERS[e] for e in elements], dtype=torch.long)
    flags = torch.zeros(n, 4)  # aromatic, sp, sp2, sp3
    if features == "rdkit":
        hybrid = (Chem.HybridizationType.SP, Chem.HybridizationType.SP2, Chem.HybridizationType.SP3)
        for atom in chem.GetAtoms():
            i = order[atom.GetIdx()]
            flags[i, 0] = float(atom.GetIsAromatic())
            for k, h in enumerate(hybrid):
                flags[i, 1 + k] = float(atom.GetHybridization() == h)
    num_hs = torch.zeros(n).index_add_(0, edge_index[1], (z[edge_index[0]] == 1).float())
    x = torch.cat(
        [
            torch.nn.functional.one_hot(torch.tensor([TYPES[e] for e in elements]), len(TYPES)).float(),
            z.float().unsqueeze(1),
            flags,
            num_hs.unsqueeze(1),
        ],
        dim=1,
    )
    return Molecule(
        x=x,
        z=z,
        pos=torch.tensor(xyz, dtype=torch.float64).float().reshape(n, 3),
        edge_index=edge_index,
        edge_attr=torch.nn.functional.one_hot(kind, len(bond_types)).float().reshape(-1, len(bond_types)),
        y=torch.tensor([targets(row, elements)], dtype=torch.float64).float(),
        index=int(row["Index"]),
        fallback=not match,
    )


def _bare_graph(mol: Any) -> Any:
    """The molecule's graph alone (single bonds, no charges or aromatic flags), to match onto XYZ connectivity."""
    from rdkit import Chem

    bare = Chem.RWMol(mol)
    for atom in bare.GetAtoms():
        atom.SetFormalCharge(0)
        atom.SetIsAromatic(False)
        atom.SetNoImplicit(True)
    for bond in bare.GetBonds():
        bond.SetBondType(Chem.BondType.SINGLE)
        bond.SetIsAromatic(False)
    return bare
