"""Topologies and traffic matrices in: topohub's embedded datasets, our topology JSON, matrix files.

Topology JSON (``--topology net.json``)::

    {"name": "tiny",
     "nodes": [{"name": "A", "lon": 2.35, "lat": 48.86}, {"name": "B"}, "C"],
     "links": [{"a": "A", "b": "B", "capacity_gbps": 400, "length_km": 350}, {"a": "B", "b": "C"}]}

Links are undirected (two directed links of the given capacity); a link without
``capacity_gbps`` gets DEFAULT_CAPACITY_GBPS, one without ``length_km`` makes paths count hops.

Traffic matrices (``--traffic FILE``), Gbps, rows = sources and columns = destinations in the
topology's node order (the diagonal is ignored): a ``.npy`` array of shape (T, n, n) or (n, n), or a
text file with one matrix per line, its n*n numbers row-major, separated by spaces or commas
(blank lines and ``#`` comments skipped), or a folder of one matrix per file (``.npy`` (n, n), or text with
n rows of n numbers), read in file-name order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lightrail.errors import ScenarioError
from lightrail.te.network import DEFAULT_CAPACITY_GBPS, Wan
from lightrail.validation import first_error, read_mapping

__all__ = ["TOPOLOGIES", "load_topology", "load_traffic", "load_traffic_array", "topohub_wan"]

#: Short names of the embedded topologies. Topology Zoo's Kdl (754 nodes) is not in topohub's data
#: (its generator leaves it out), so the large Topology Zoo network here is TataNld (143 nodes).
TOPOLOGIES = {"geant": "sndlib/geant", "abilene": "sndlib/abilene", "tatanld": "topozoo/TataNld",
              "geant2012": "topozoo/Geant2012", "germany50": "sndlib/germany50"}


def topohub_wan(key: str, *, name: str | None = None) -> Wan:
    """A topohub dataset (``"sndlib/geant"``, ``"topozoo/Abilene"``) as a Wan, node positions kept.
    SNDlib topologies carry measured demands: their row sums become the gravity model's masses."""
    try:
        import topohub
    except ImportError:
        raise ScenarioError("the topohub package is not installed", field="--topology",
                            fix="pip install 'lightrail[te]' (make setup installs it)") from None
    try:
        data = topohub.get(key)
    except (KeyError, FileNotFoundError, ValueError):
        raise ScenarioError(f"no topohub topology {key!r}", field="--topology",
                            fix=f"use {', '.join(TOPOLOGIES)}, a topohub key such as topozoo/Abilene, "
                                "or a topology .json file") from None
    ids = [str(v["id"]) for v in data["nodes"]]
    index = {v: i for i, v in enumerate(ids)}
    pos = np.array([v.get("pos", [np.nan, np.nan]) for v in data["nodes"]], dtype=float).reshape(-1, 2)
    edges = [(index[str(e["source"])], index[str(e["target"])]) for e in data["edges"]]
    km = [e.get("dist", np.nan) for e in data["edges"]]
    mass = None
    demands = data["graph"].get("demands") or {}
    if demands:
        mass = np.zeros(len(ids))
        for s, row in demands.items():
            mass[index[str(s)]] += sum(row.values())
            for t, v in row.items():
                mass[index[str(t)]] += v
        mass = mass if mass.sum() > 0 else None
    names = [str(v.get("name", v["id"])) for v in data["nodes"]]
    if len(set(names)) != len(names):
        names = [f"{n}#{i}" for i, n in enumerate(names)]
    return Wan.from_edges(name or key, names, edges, length_km=km, lon=pos[:, 0], lat=pos[:, 1], mass=mass)


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    lon: float | None = None
    lat: float | None = None


class _Link(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: str
    b: str
    capacity_gbps: float = Field(DEFAULT_CAPACITY_GBPS, gt=0)
    length_km: float | None = Field(None, ge=0)


class _Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "custom"
    nodes: list[_Node | str] = Field(min_length=2)
    links: list[_Link] = Field(min_length=1)

    @model_validator(mode="after")
    def _ends_are_nodes(self):
        names = {n if isinstance(n, str) else n.name for n in self.nodes}
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in names:
                    raise ValueError(f"links[{i}] names node {end!r}, which is not in nodes")
        return self


def load_topology(spec: str) -> Wan:
    """A short name (``geant``), a topohub key (``topozoo/Abilene``) or a topology ``.json`` file."""
    if spec.lower() in TOPOLOGIES:
        return topohub_wan(TOPOLOGIES[spec.lower()], name=spec.lower())
    if spec.endswith(".json"):
        raw = read_mapping(spec, field="--topology", what="a topology .json file")
        try:
            topo = _Topology.model_validate(raw)
        except ValidationError as e:
            raise first_error(e, source="--topology", hint="see `lightrail te --help` for the format") from None
        nodes = [_Node(name=n) if isinstance(n, str) else n for n in topo.nodes]
        index = {n.name: i for i, n in enumerate(nodes)}
        km = [np.nan if k.length_km is None else k.length_km for k in topo.links]
        return Wan.from_edges(topo.name, [n.name for n in nodes], [(index[k.a], index[k.b]) for k in topo.links],
                              capacity=[k.capacity_gbps for k in topo.links], length_km=km,
                              lon=[np.nan if n.lon is None else n.lon for n in nodes],
                              lat=[np.nan if n.lat is None else n.lat for n in nodes])
    if "/" in spec and not Path(spec).exists():
        return topohub_wan(spec)
    raise ScenarioError(f"unknown topology {spec!r}", field="--topology",
                        fix=f"use {', '.join(TOPOLOGIES)}, a topohub key such as topozoo/Abilene, "
                            "or a topology .json file")


def load_traffic(path: str | Path, n: int) -> np.ndarray:
    """Matrices of shape (T, n, n) in Gbps from a ``.npy`` or text file, or a folder of one matrix per file
    (see the module docstring)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix in (".npy", ".txt", ".csv"))
        if not files:
            raise ScenarioError(f"no .npy, .txt or .csv file in {str(path)!r}", field="--traffic",
                                fix="one matrix per file, named in time order")
        return np.concatenate([_one_matrix(f, n) for f in files])
    if not path.is_file():
        raise ScenarioError(f"no file {str(path)!r}", field="--traffic", fix="give a .npy or text matrix file")
    try:
        if path.suffix == ".npy":
            tms = np.load(path, allow_pickle=False).astype(float)
        else:
            rows = []
            for number, line in enumerate(path.read_text().splitlines(), 1):
                line = line.split("#", 1)[0].replace(",", " ").strip()
                if line:
                    row = np.array(line.split(), dtype=float)
                    if row.size != n * n:
                        raise ScenarioError(f"line {number} has {row.size} numbers, not {n}*{n} = {n * n}",
                                            field="--traffic", fix="one n*n matrix per line, in node order")
                    rows.append(row)
            tms = np.array(rows).reshape(-1, n, n)
    except (OSError, ValueError) as e:
        raise ScenarioError(f"cannot read {path.name}: {str(e).splitlines()[0]}", field="--traffic",
                            fix="numbers only, one matrix per line, or a .npy array") from None
    return load_traffic_array(tms, n)


def _one_matrix(path: Path, n: int) -> np.ndarray:
    """One (1, n, n) matrix from a file of a folder: a .npy (n, n) array, or n*n numbers in any layout."""
    if path.suffix == ".npy":
        tms = load_traffic(path, n)
    else:
        try:
            numbers = np.array(path.read_text().split("#", 1)[0].replace(",", " ").split(), dtype=float)
        except (OSError, ValueError) as e:
            raise ScenarioError(f"cannot read {path.name}: {str(e).splitlines()[0]}", field="--traffic",
                                fix="numbers only: n rows of n, or one line of n*n") from None
        if numbers.size != n * n:
            raise ScenarioError(f"{path.name} has {numbers.size} numbers, not {n}*{n} = {n * n}", field="--traffic",
                                fix="one n*n matrix per file, in node order")
        tms = load_traffic_array(numbers.reshape(1, n, n), n)
    if len(tms) != 1:
        raise ScenarioError(f"{path.name} holds {len(tms)} matrices", field="--traffic", fix="one matrix per file")
    return tms


def load_traffic_array(tms: np.ndarray, n: int) -> np.ndarray:
    """``tms`` checked: shape (T, n, n), finite, non-negative."""
    if tms.ndim == 2:
        tms = tms[None]
    if tms.ndim != 3 or tms.shape[1:] != (n, n) or len(tms) == 0:
        raise ScenarioError(f"matrices of shape {tms.shape}, not (T, {n}, {n})", field="--traffic",
                            fix=f"the topology has {n} nodes")
    if not np.all(np.isfinite(tms)) or np.any(tms < 0):
        raise ScenarioError("a demand is negative or not a number", field="--traffic", fix="demands are Gbps >= 0")
    return tms
