"""tasks=qm9 on the first molecules of qm9pack: PyG's units and atom references derived by hand, bonds and features,
the cache (reuse, damage, two processes building at once), splits, standardisation and metrics in paper units."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("rdkit")
pytest.importorskip("torch_geometric")
pytest.importorskip("filelock")

from mtl_bench.tasks import qm9_cache  # noqa: E402
from mtl_bench.tasks.qm9 import COLUMNS, QM9  # noqa: E402
from mtl_bench.tasks.qm9_cache import cache_path, load_graphs  # noqa: E402
from mtl_bench.tasks.qm9_molecules import molecule, qm9pack_files, read_rows  # noqa: E402

HAR2EV = 27.211386246
LIMIT = 300


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qm9cache")
    load_graphs("pyg", LIMIT, str(path))
    return str(path)


@pytest.fixture(scope="module")
def rows():
    return list(read_rows(qm9pack_files()[1], 10))


def test_units_and_atom_references_of_methane_by_hand(rows):
    # gdb 1 is methane: U0 = -40.47893 Ha, HOMO -0.3877 Ha, ZPVE 0.044749 Ha, mu 0 D, alpha 13.21 bohr^3 (its CSV row).
    y = molecule(rows[0]).y[0].double()
    assert rows[0]["SMILES"] == "C" and y.shape == (19,)
    torch.testing.assert_close(y[7], torch.tensor(-40.47893 * HAR2EV, dtype=torch.float64), rtol=1e-7, atol=0)
    torch.testing.assert_close(y[2], torch.tensor(-0.3877 * HAR2EV, dtype=torch.float64), rtol=1e-7, atol=0)
    # U0_atom = U0 minus PyG's atom references (eV) of C and 4 H: -17.1722 eV as PyG gives.
    u0_atom = -40.47893 * HAR2EV - (-1029.86312267 + 4 * -13.61312172)
    assert abs(y[12].item() - u0_atom) < 1e-4 and round(y[12].item(), 4) == -17.1722
    # G_atom of water (gdb 3): G - (O's + 2 H's G reference).
    water = molecule(rows[2]).y[0].double()
    g = float(rows[2]["GibbsFreeEnergy_298K_au"]) * HAR2EV
    assert abs(water[15].item() - (g - (-2043.01812778 + 2 * -13.90303183))) < 1e-3
    assert water[0].item() == pytest.approx(float(rows[2]["Dipole_debye"])) and water[11].item() == pytest.approx(
        float(rows[2]["Heatcapacity_Cv_cal_mol_K"])
    )


def test_pyg_node_and_edge_features_of_small_molecules(rows):
    methane = molecule(rows[0])
    assert methane.x.shape == (5, 11) and methane.edge_index.shape == (2, 8) and methane.edge_attr.shape == (8, 4)
    assert methane.x[0].tolist() == [0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 4]  # C: one-hot, Z=6, flags 0, 4 H
    assert methane.x[1].tolist() == [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    # Edges both ways, sorted by source * N + target, as PyG's process() leaves them.
    assert methane.edge_index.tolist() == [[0, 0, 0, 0, 1, 2, 3, 4], [1, 2, 3, 4, 0, 0, 0, 0]]
    kinds = {row["SMILES"]: molecule(row).edge_attr.sum(0).tolist() for row in rows[3:6]}
    assert kinds == {"C#C": [4, 0, 2, 0], "C#N": [2, 0, 2, 0], "C=O": [4, 2, 0, 0]}  # single, double, triple, arom.


def test_rdkit_features_perceive_hybridization(rows):
    pyg, rdkit = molecule(rows[3], "pyg"), molecule(rows[3], "rdkit")  # acetylene: sp carbons
    carbons = pyg.z == 6
    assert pyg.x[:, 6:10].abs().sum() == 0  # PyG reads its SDF unsanitized: no aromatic/sp flags
    assert rdkit.x[carbons, 7].tolist() == [1.0, 1.0]  # sp
    assert torch.equal(pyg.edge_index, rdkit.edge_index)


def test_bonds_follow_the_geometry(cache_dir):
    # SMILES atoms mapped onto XYZ order: every bond of the first 300 molecules is shorter than 2 Å.
    g = load_graphs("pyg", LIMIT, cache_dir)
    assert g["y"].shape == (LIMIT, 19) and g["index"][:3].tolist() == [1, 2, 3]
    for m in range(LIMIT):
        n0, e0, e1 = g["node_ptr"][m], g["edge_ptr"][m], g["edge_ptr"][m + 1]
        src, dst = g["edge_index"][:, e0:e1] + n0
        length = (g["pos"][src] - g["pos"][dst]).norm(dim=1)
        assert length.max() < 2.0, m
        # Valences in the Kekulé structure: H 1, C 4, N 3, O 2, F 1, give or take a zwitterion's charges
        # (N+ has 4, O- 1), which cancel over the molecule.
        order = g["edge_attr"][e0:e1, :3] @ torch.tensor([1.0, 2.0, 3.0])
        valence = torch.zeros(int(g["node_ptr"][m + 1] - n0)).index_add_(0, src - n0, order)
        expected = torch.tensor([{1: 1, 6: 4, 7: 3, 8: 2, 9: 1}[int(z)] for z in g["z"][n0 : g["node_ptr"][m + 1]]])
        assert (valence - expected).abs().max() <= 1 and valence.sum() == expected.sum(), m


def test_cache_is_reused_and_a_damaged_one_rebuilt(cache_dir, monkeypatch, caplog):
    first = load_graphs("pyg", LIMIT, cache_dir)
    monkeypatch.setattr(qm9_cache, "build", lambda *a: pytest.fail("rebuilt a sound cache"))
    again = load_graphs("pyg", LIMIT, cache_dir)
    assert torch.equal(first["edge_index"], again["edge_index"]) and torch.equal(first["y"], again["y"])
    monkeypatch.undo()
    path = cache_path(qm9_cache.cache_root(cache_dir), qm9pack_files()[0], "pyg", 20)
    load_graphs("pyg", 20, cache_dir)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a truncated file
    with caplog.at_level("WARNING", logger="mtl_bench"):
        rebuilt = load_graphs("pyg", 20, cache_dir)
    assert "damaged" in caplog.text and rebuilt["y"].shape == (20, 19)
    assert torch.equal(rebuilt["y"], first["y"][:20])


def test_the_cache_file_takes_its_mode_from_the_umask(tmp_path):
    """A group sharing tasks.cache_dir reads the cache: its mode is 0666 less the umask, as any new file's (mkstemp
    alone made it 0600)."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        load_graphs("pyg", 20, str(tmp_path / "umask022"))
        os.umask(0o077)
        load_graphs("pyg", 20, str(tmp_path / "umask077"))
    finally:
        os.umask(old)
    for folder, mode in (("umask022", 0o644), ("umask077", 0o600)):
        path = cache_path(qm9_cache.cache_root(str(tmp_path / folder)), qm9pack_files()[0], "pyg", 20)
        assert stat.S_IMODE(path.stat().st_mode) == mode, folder


def test_two_processes_build_once(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, logging
        from mtl_bench.tasks import qm9_cache
        built = []
        real = qm9_cache.build
        qm9_cache.build = lambda *a: built.append(1) or real(*a)
        g = qm9_cache.load_graphs("pyg", 40, {str(tmp_path)!r})
        print(len(built), g["y"].shape[0])
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(int(o[0]) for o in outs) == [0, 1] and all(o[1] == "40" for o in outs)
    assert [p.name for p in (tmp_path / "qm9").iterdir() if p.suffix == ".tmp"] == []


def test_task_set_splits_standardisation_and_paper_units(cache_dir):
    ts = QM9(n_test=50, n_val=50, split_seed=1, limit=LIMIT, cache_dir=cache_dir)
    assert ts.task_names == ["mu", "alpha", "homo", "lumo", "r2", "zpve", "u0", "u", "h", "g", "cv"]
    assert [COLUMNS.index(n) for n in ts.task_names] == [0, 1, 2, 3, 5, 6, 12, 13, 14, 15, 11]  # Nash-MTL's
    assert (len(ts.train), len(ts.val), len(ts.test)) == (200, 50, 50)
    ids = torch.cat([ts.test.ids, ts.val.ids, ts.train.ids])
    assert sorted(ids.tolist()) == list(range(LIMIT))
    assert not torch.equal(ids, QM9(n_test=50, n_val=50, split_seed=2, limit=LIMIT, cache_dir=cache_dir).test.ids)
    train_y = ts.train.y[ts.train.ids]
    torch.testing.assert_close(train_y.mean(0), torch.zeros(11), atol=1e-5, rtol=0)
    torch.testing.assert_close(train_y.std(0), torch.ones(11), atol=1e-5, rtol=0)
    data, targets = ts.train.collate([ts.train[i] for i in range(4)])
    sizes = data.ptr.diff()
    assert data.num_graphs == 4 and data.edge_attr.shape == (int((sizes * (sizes - 1)).sum()), 5)
    assert targets["homo"].shape == (4, 1)
    # Complete + Distance(norm=False): the fifth edge feature is the distance in Å.
    src, dst = data.edge_index
    torch.testing.assert_close(data.edge_attr[:, 4], (data.pos[src] - data.pos[dst]).norm(dim=1))
    # MAE in meV for energies: one standard deviation off is std * 1000 per molecule.
    homo = ts.tasks[2]
    pred = targets["homo"] + 1
    mae = homo.metrics(pred, targets["homo"])["mae"]
    torch.testing.assert_close(mae, 4 * ts.std[2] * 1000)
    mae = ts.tasks[0].metrics(targets["mu"] - 2, targets["mu"])["mae"]  # mu in D, no conversion
    assert mae.item() == pytest.approx(4 * 2 * ts.std[0].item())


def test_whole_dataset_statistics_option(cache_dir):
    ts = QM9(n_test=50, n_val=50, standardize="all", limit=LIMIT, cache_dir=cache_dir)
    all_y = ts.train.y  # every molecule, standardised
    torch.testing.assert_close(all_y[:, 0].mean(), torch.tensor(0.0), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"targets": ["mu", "bogus"]}, r"^targets: must be distinct names from mu, alpha.*\(unknown: bogus\)"),
        ({"standardize": "median"}, r"^standardize: must be one of train, all, none"),
        ({"features": "xyz"}, r"^features: must be one of pyg, rdkit"),
        ({"n_test": 200, "n_val": 100}, r"^n_test: n_test \+ n_val = 300 leaves no training molecules of 300"),
        ({"n_train": 1000}, r"^n_train: 1000 > the 200 molecules left for training"),
    ],
)
def test_bad_options_are_one_line(cache_dir, kwargs, message):
    options = {"n_test": 50, "n_val": 50, "limit": LIMIT, "cache_dir": cache_dir, **kwargs}
    with pytest.raises(ValueError, match=message):
        QM9(**options)


def test_without_the_extra_the_error_names_it(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ImportError, match=r"^tasks=qm9 needs qm9pack: pip install 'mtl-bench\[chem\]'$"):
        qm9pack_files()


@pytest.mark.slow
def test_full_build_matches_pyg_counts(tmp_path):
    # The whole of qm9pack (~5-15 min on 2 cores): PyG's QM9 documents 130,831 molecules (after removing the 3,054
    # uncharacterized), ~18.0 nodes and ~37.3 directed edges per molecule.
    g = load_graphs("pyg", None, str(tmp_path))
    m = g["y"].shape[0]
    assert m == 130_831 and g["index"].unique().numel() == m
    assert round(g["x"].shape[0] / m, 2) == 18.03 and round(g["edge_index"].shape[1] / m, 2) == 37.31
    assert g["fallbacks"] == 2  # no SMILES match onto the XYZ connectivity: bonds from DetermineBonds
    assert torch.isfinite(g["y"]).all()
    # Edge-type totals against the molecular formulas: Kekulé bonds (no aromatic type), and the bond orders sum to
    # half the atoms' neutral valences (H 1, C 4, N 3, O 2, F 1; a zwitterion's charges cancel).
    kinds = g["edge_attr"].sum(0)
    assert kinds[3] == 0
    valences = torch.tensor([0, 1, 0, 0, 0, 0, 4, 3, 2, 1], dtype=torch.float64)[g["z"]].sum()
    assert (kinds[:3].double() @ torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)) / 2 == valences / 2
    assert kinds[:3].sum() == g["edge_index"].shape[1]


def test_mae_and_delta_m_as_nash_mtl_computes_them(cache_dir):
    # nash-mtl experiments/quantum_chemistry/trainer.py `evaluate` and utils.py `delta_fn`, on the same predictions:
    # MAE of de-standardised outputs, x1000 at their indices [2, 3, 5, 6, 7, 8, 9], Δm against their BASE.
    from omegaconf import OmegaConf

    from mtl_bench.analysis.delta_m import delta_m_flat, relative_drops
    from mtl_bench.catalog import conf_root

    shipped = OmegaConf.to_container(OmegaConf.load(conf_root() / "tasks" / "qm9.yaml").reference)
    ts = QM9(n_test=50, n_val=50, limit=LIMIT, cache_dir=cache_dir, reference=shipped)
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(37, 11, generator=gen)
    out = target + 0.3 * torch.randn(37, 11, generator=gen)
    theirs = torch.nn.functional.l1_loss(out * ts.std, target * ts.std, reduction="none").sum(0) / 37
    theirs[[2, 3, 5, 6, 7, 8, 9]] *= 1000
    base = torch.tensor(
        [0.0671, 0.1814, 60.576, 53.915, 0.5027, 4.539, 58.838, 64.244, 63.852, 66.223, 0.07212], dtype=torch.float64
    )
    their_delta = ((theirs.double() - base) / base).mean().item() * 100
    ours = {
        t.name: {"mae": t.metrics(out[:, i : i + 1], target[:, i : i + 1])["mae"].item() / 37}
        for i, t in enumerate(ts.tasks)
    }
    torch.testing.assert_close(torch.tensor([ours[t]["mae"] for t in ts.task_names]), theirs, rtol=1e-5, atol=0)
    higher = {t.name: t.higher_is_better for t in ts.tasks}
    assert ts.reference is not None and [ts.reference[t]["mae"] for t in ts.task_names] == base.tolist()
    assert delta_m_flat(relative_drops(ours, ts.reference, higher)) == pytest.approx(their_delta, rel=1e-5)
