"""Pareto HyperNetworks (Navon et al., ICLR 2021): a chunked hypernetwork emits the target network's weights from
the preference; as AvivNavon/pareto-hypernetworks 6355fd2 experiments/multimnist/models.py `ResnetHyper`."""

from __future__ import annotations

import math
from typing import Iterator, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtl_bench.models.base import ModelOutput
from mtl_bench.models.fronts.base import ModelFactory, PreferenceModel


class ChunkedHypernetwork(nn.Module):
    """r (T,) to a flat weight vector, chunk by chunk (PHN's ResnetHyper): the preference embedding Σ_i r_i e_i
    (rows of an embedding of the T tasks) is concatenated to each chunk's embedding, an MLP of three linear layers
    (ReLU between) maps it to a hidden vector h, and the chunk is [W_1 h, ..., W_m h] (m = `num_ws` matrices of
    `w_dim` rows); the chunks are concatenated and cut into the target's parameter shapes in order. Embeddings
    and the W matrices are initialised N(0, 0.1²) as PHN's."""

    def __init__(
        self,
        tasks: int,
        shapes: Mapping[str, torch.Size],
        preference_embedding_dim: int,
        chunk_embedding_dim: int,
        hidden_dim: int,
        num_ws: int,
        w_dim: int,
    ) -> None:
        super().__init__()
        self.shapes = dict(shapes)
        total = sum(math.prod(s) for s in self.shapes.values())
        self.num_chunks = max(1, math.ceil(total / (num_ws * w_dim)))
        self.chunk_embedding_matrix = nn.Embedding(self.num_chunks, chunk_embedding_dim)
        self.preference_embedding_matrix = nn.Embedding(tasks, preference_embedding_dim)
        self.fc = nn.Sequential(
            nn.Linear(preference_embedding_dim + chunk_embedding_dim, hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, hidden_dim),
        )
        self.ws = nn.ParameterList(nn.Parameter(torch.empty(w_dim, hidden_dim)) for _ in range(num_ws))
        nn.init.normal_(self.preference_embedding_matrix.weight, mean=0.0, std=0.1)
        nn.init.normal_(self.chunk_embedding_matrix.weight, mean=0.0, std=0.1)
        for w in self.ws:
            nn.init.normal_(w, mean=0.0, std=0.1)

    def forward(self, preference: Tensor) -> dict[str, Tensor]:
        # All chunks at once: row c of `rep` is PHN's hidden representation of chunk c.
        embedded = preference.to(self.preference_embedding_matrix.weight) @ self.preference_embedding_matrix.weight
        chunks = self.chunk_embedding_matrix.weight
        rep = self.fc(torch.cat((embedded.expand(len(chunks), -1), chunks), dim=1))
        flat = torch.cat([F.linear(rep, w) for w in self.ws], dim=1).reshape(-1)
        out, position = {}, 0
        for name, shape in self.shapes.items():
            n = math.prod(shape)
            out[name] = flat[position : position + n].reshape(shape)
            position += n
        return out


def _layers(trunk: nn.Module) -> list[str]:
    """The trunk's modules that hold parameters of their own, in order (their qualified names)."""
    return [name for name, m in trunk.named_modules() if any(True for _ in m.parameters(recurse=False))]


class PHN(PreferenceModel):
    """The wrapped model is the target network: its heads and its last `trunk_layers` layers with parameters (every
    one: null, as PHN generates its whole LeNet and ResNet-18) are generated from r by a chunked hypernetwork;
    the rest of the trunk is trained as usual. Shared parameters: the hypernetwork's and the trunk's own.

    Differences from the reference: the target is any backbone run with the generated tensors in place of its
    parameters (torch.func.functional_call; BatchNorm keeps its running statistics, where PHN's ResNet target
    always normalises by the batch); its `layer_to_shape` is the target's parameter names and shapes in order.
    """

    def __init__(
        self,
        model: ModelFactory,
        input_shape: Sequence[int],
        heads: Mapping[str, int],
        trunk_layers: Optional[int] = None,
        preference_embedding_dim: int = 32,
        chunk_embedding_dim: int = 64,
        hidden_dim: int = 100,
        num_ws: int = 11,
        w_dim: int = 100,
    ) -> None:
        """
        model: the target network's factory (given by the engine: the `model` option with its architecture).
        input_shape: one sample's shape (given by the engine from the task set).
        heads: each task's output width (given by the engine from the task set).
        trunk_layers: how many of the trunk's last layers with parameters are generated (0: the heads only); null:
            all of them.
        preference_embedding_dim: width of the preference's embedding (PHN's 32).
        chunk_embedding_dim: width of each chunk's embedding (PHN's 64).
        hidden_dim: width of the hypernetwork's MLP (PHN's 100).
        num_ws: matrices W per chunk (PHN's 11).
        w_dim: rows of each W: a chunk is num_ws * w_dim generated numbers (PHN's ResNet-18: 10000).
        """
        super().__init__(list(heads))
        for key, value in (
            ("preference_embedding_dim", preference_embedding_dim),
            ("chunk_embedding_dim", chunk_embedding_dim),
            ("hidden_dim", hidden_dim),
            ("num_ws", num_ws),
            ("w_dim", w_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: must be an integer >= 1, got {value!r}")
        self.model = model(input_shape=input_shape, heads=heads)
        layers = _layers(self.model.trunk)
        if trunk_layers is not None and (isinstance(trunk_layers, bool) or not 0 <= trunk_layers <= len(layers)):
            raise ValueError(
                f"trunk_layers: must be null or 0..{len(layers)} (the trunk's layers with parameters), "
                f"got {trunk_layers!r}"
            )
        chosen = layers if trunk_layers is None else layers[len(layers) - trunk_layers :]
        shapes: dict[str, torch.Size] = {}
        for layer in chosen:
            prefix = f"trunk.{layer}" if layer else "trunk"
            for name, param in self.model.get_submodule(prefix).named_parameters(recurse=False):
                shapes[f"{prefix}.{name}"] = param.shape
        for task in heads:
            for name, param in self.model.heads[task].named_parameters():
                shapes[f"heads.{task}.{name}"] = param.shape
        # The generated tensors replace the target's parameters: those become buffers (not trained, not saved).
        for full in shapes:
            owner, _, leaf = full.rpartition(".")
            owning = self.model.get_submodule(owner)
            removed = owning._parameters.pop(leaf)
            assert removed is not None
            owning.register_buffer(leaf, removed.detach(), persistent=False)
        self.hypernetwork = ChunkedHypernetwork(
            len(heads), shapes, preference_embedding_dim, chunk_embedding_dim, hidden_dim, num_ws, w_dim
        )

    def shared_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.hypernetwork.parameters()
        yield from self.inner.shared_parameters()

    def task_parameters(self, task: str) -> Iterator[nn.Parameter]:
        return iter(())  # every head is generated by the shared hypernetwork

    def shared_rep_problem(self) -> Optional[str]:
        return (
            "PHN generates the heads from the hypernetwork, so the losses reach the shared parameters also "
            "outside the shared representation; use grad_source=shared_params"
        )

    def forward(self, x: Tensor, tasks: Optional[Sequence[str]] = None) -> ModelOutput:
        return torch.func.functional_call(self.inner, self.hypernetwork(self.preference), (x,), {"tasks": tasks})
