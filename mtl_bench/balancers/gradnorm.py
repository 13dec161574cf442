"""Chen et al., ICML 2018, "GradNorm: Gradient Normalization for Adaptive Loss Balancing in Deep Multitask Networks"."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from mtl_bench import tags
from mtl_bench.balancers.adam_update import adam_update
from mtl_bench.balancers.checks import at_least, number, one_of, pair
from mtl_bench.gradient_engine.balancer import Context
from mtl_bench.gradient_engine.graph import task_params, upstream_leaves
from mtl_bench.gradient_engine.leaf_grads import leaf_grads_root
from mtl_bench.gradient_engine.rank_average import average_by_name
from mtl_bench.gradient_engine.staged import JOINT, PER_TASK, StagedBalancer

GRAD_SOURCES = ("last_shared", "shared_rep")
OPTIMIZERS = ("adam", "sgd")
INITIAL_LOSSES = ("first_step", "theoretical")


class GradNormTerms(NamedTuple):
    grad: Tensor  # ∂L_grad/∂w
    weighted_norms: Tensor  # G_i = w_i·n_i
    target: Tensor  # Ḡ·r_i^α, a constant for the derivative
    loss_ratio: Tensor  # L̃_i = L_i / L_i(0)
    l_grad: Tensor  # Σ_i |G_i − target_i|


def gradnorm_terms(
    weights: Tensor, norms: Tensor, losses: Tensor, initial_losses: Tensor, alpha: float
) -> GradNormTerms:
    """The paper's L_grad and its gradient with respect to the task weights, in closed form.

    `norms[i]` = n_i = ‖∇_W L_i‖ (unweighted), so G_i = ‖∇_W (w_i L_i)‖ = w_i·n_i. With the target held
    constant, ∂L_grad/∂w_i = sign(G_i − target_i)·n_i: no second backward through the network, and no
    gradient of L_grad can leak into the network's parameters.
    """
    loss_ratio = losses / initial_losses
    inverse_rate = loss_ratio / loss_ratio.mean()  # r_i
    weighted = weights * norms
    target = weighted.mean() * inverse_rate.pow(alpha)
    diff = weighted - target
    return GradNormTerms(torch.sign(diff) * norms, weighted, target, loss_ratio, diff.abs().sum())


class LinearGradNorms:
    """‖∇_W L‖ over an `nn.Linear`'s weight (and bias) from its input `a` and δ = ∂L/∂output, per loss.

    ∇_W L = δᵀ[a, 1] and ‖δᵀA‖²_F = ⟨δδᵀ, AAᵀ⟩. With N rows (batch items) and N ≤ in+1, the Gram matrix
    K = AAᵀ (N×N) is computed once per step and each loss costs one N×N×out matmul: ‖·‖² = ⟨Kδ, δ⟩;
    otherwise ‖aᵀδ‖² is cheaper. The ones column is never built: K = aaᵀ + 1 and ‖1ᵀδ‖² = ‖Σ_rows δ‖².
    K is symmetric, so with its rows in B blocks ⟨Kδ, δ⟩ = Σ_i ⟨K_ii δ_i + 2 Σ_{j>i} K_ij δ_j, δ_i⟩: only the
    blocks on and above the diagonal are multiplied, (B+1)/2B of the products (B = 4: 5/8; measured 0.7× the
    time of the full product at N=256, out=512 on one CPU thread; smaller blocks lose more to matmul overhead).
    One loss at a time, so each δ can be freed at once (a batched (N, T·out) matmul measured 2× slower
    on CPU, memory-bound, and holds all T gradients). Float32 throughout.
    """

    BLOCKS = 4
    MIN_BLOCK_ROWS = 32  # below this a block's matmul is too small to pay for itself: fewer blocks

    def __init__(self, inputs: Tensor, bias: bool) -> None:
        self.a = inputs.reshape(-1, inputs.shape[-1]).float()
        self.rows, self.bias = self.a.shape[0], bias
        self.gram = self.a @ self.a.T + float(bias) if self.rows <= self.a.shape[1] + bias else None
        blocks = max(1, min(self.BLOCKS, self.rows // self.MIN_BLOCK_ROWS))
        self.bounds = [self.rows * i // blocks for i in range(blocks + 1)]
        if self.gram is not None:
            for start, end in zip(self.bounds[:-1], self.bounds[1:]):
                self.gram[start:end, end:] *= 2  # each block above the diagonal stands for itself and its mirror

    def __call__(self, output_grad: Tensor) -> Tensor:
        d = output_grad.reshape(self.rows, -1).float()
        if self.gram is not None:
            rows = [self.gram[s:e, s:] @ d[s:] for s, e in zip(self.bounds[:-1], self.bounds[1:])]
            squared = torch.vdot(torch.cat(rows).reshape(-1), d.reshape(-1))
        else:
            squared = (self.a.T @ d).square().sum()
            if self.bias:
                squared = squared + d.sum(0).square().sum()
        return squared.clamp_min(0).sqrt()  # rounding in the Gram form can dip just below 0


def linear_weight_grad_norms(inputs: Tensor, output_grads: Sequence[Tensor], bias: bool) -> Tensor:
    """`LinearGradNorms` for several losses at once: one norm per output gradient."""
    norm = LinearGradNorms(inputs, bias)
    return torch.stack([norm(d) for d in output_grads])


class GradNorm(StagedBalancer):
    """Learnable task weights w_i (start at 1) that equalise the tasks' gradient norms at the last shared layer.

    Each step: n_i = ‖∇_W L_i‖ over the last shared layer W (`grad_source="last_shared"`) or over the
    shared representation (`"shared_rep"`, cheaper); G_i = w_i n_i; L̃_i = L_i / L_i(0) with L_i(0) the
    first step's loss (or `initial_losses`, e.g. log C for C-class cross-entropy); r_i = L̃_i / mean(L̃);
    L_grad = Σ_i |G_i − Ḡ r_i^α| with the target held constant. The network is trained on Σ w_i L_i with
    the current weights; then w takes one step of its own optimizer (Adam or SGD, `lr`) on ∂L_grad/∂w
    (closed form, see `gradnorm_terms`), is clamped to ≥ `min_weight` (a weight at 0 would stay there and
    can make the renormalisation divide by 0) and renormalised to Σ w = T.

    W is `shared_layer` (the model's last shared module), or `shared_params` when no layer is given. For an
    `nn.Linear` the norms come from its input and output captured by a forward hook: a backward through the
    heads only gives δ_i = ∂L_i/∂output, and `LinearGradNorms` turns it into n_i; no per-task backward through
    the trunk. Any other module (or `shared_params`) takes per-task gradients of its parameters. The
    Linear path hooks the layer when the balancer is built, so build it before the training forwards;
    it expects the layer to run once per forward (`remove_hook()` detaches it).

    Metrics: `weight/<task>` (w used this step), `grad_norm/<task>` (n_i), `gradnorm/norm_share/<task>` (G_i / Σ G,
    the share of the weighted norms; rescaled_norm's `ratio/<task>` is a share of raw norms),
    `gradnorm/target/<task>`, `gradnorm/loss_ratio/<task>` (L̃_i), `gradnorm/L_grad`.
    Under DDP n_i and L_i are averaged across ranks (by name) before the update, so all ranks hold the
    same weights. The weights, L_i(0) and the optimizer's moments are buffers: `state_dict` has them all.
    """

    weights: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    opt_step: Tensor
    initial_losses: Tensor
    initialized: Tensor

    def __init__(
        self,
        task_names: Sequence[str],
        shared_layer: nn.Module | None = None,
        *,
        shared_params: Iterable[Tensor] | None = None,
        alpha: float = 1.5,
        lr: float = 0.025,
        grad_source: str = "last_shared",
        optimizer: str = "adam",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        initial_losses: str | Mapping[str, float] = "first_step",
        initial_losses_known: Mapping[str, float | None] | None = None,
        min_weight: float = 1e-6,
    ) -> None:
        """
        task_names: the tasks (given by the engine).
        shared_layer: the model's last shared layer, W (given by the engine).
        shared_params: measure at these parameters instead of `shared_layer`.
        alpha: the restoring force (>= 0); the paper uses 0.12 on its toy regression, 1.5 on NYUv2.
        lr: the learning rate of the weights' own optimizer (> 0).
        grad_source: where n_i is measured: last_shared (the paper's W) or shared_rep (cheaper).
        optimizer: the weights' optimizer: adam or sgd.
        betas: Adam's betas for the weights, each in [0, 1).
        eps: Adam's eps for the weights (> 0).
        initial_losses: L_i(0): first_step (the paper), theoretical (each task's uninformed loss, e.g. log C
            for C-class cross-entropy) or a mapping task: loss.
        initial_losses_known: each task's theoretical initial loss or None (given by the engine).
        min_weight: the weights are clamped to at least this (> 0) before renormalising.
        """
        super().__init__(task_names)
        one_of("grad_source", grad_source, GRAD_SOURCES)
        one_of("optimizer", optimizer, OPTIMIZERS)
        self.alpha, self.lr = at_least("alpha", alpha, 0), number("lr", lr, 0, above=True)
        self.betas, self.eps = pair("betas", betas, 0, 1, below=True), number("eps", eps, 0, above=True)
        self.min_weight = number("min_weight", min_weight, 0, above=True)
        initial = self._initial_losses(initial_losses, initial_losses_known)
        self.grad_source, self.optimizer = grad_source, optimizer
        self._layer_params: list[Tensor] = []
        self._linear: nn.Linear | None = None
        self._io: tuple[Tensor, Tensor] | None = None
        self._hook: RemovableHandle | None = None
        if grad_source == "last_shared":
            self._setup_layer(shared_layer, shared_params)

        n = len(self.task_names)
        self.register_buffer("weights", torch.ones(n))
        self.register_buffer("exp_avg", torch.zeros(n))
        self.register_buffer("exp_avg_sq", torch.zeros(n))
        self.register_buffer("opt_step", torch.zeros(()))
        self.register_buffer("initial_losses", torch.ones(n))
        self.register_buffer("initialized", torch.tensor(initial is not None))
        if initial is not None:
            if set(initial) != set(self.task_names):
                raise ValueError(
                    f"initial_losses: tasks {sorted(initial)} do not match the tasks {sorted(self.task_names)}"
                )
            values = [number(f"initial_losses.{name}", initial[name], 0, above=True) for name in self.task_names]
            self.initial_losses.copy_(torch.tensor(values))

    def _initial_losses(
        self, given: str | Mapping[str, float], known: Mapping[str, float | None] | None
    ) -> Mapping[str, float] | None:
        """None for first_step; the tasks' theoretical losses; or the mapping given."""
        if isinstance(given, str):
            if given not in INITIAL_LOSSES:
                raise ValueError(f"initial_losses: {given!r} is not one of {', '.join(INITIAL_LOSSES)} or a mapping")
            if given == "first_step":
                return None
            missing = [name for name in self.task_names if (known or {}).get(name) is None]
            if missing:
                raise ValueError(
                    f"initial_losses: tasks {missing} declare no theoretical initial loss (allowed here: first_step)"
                )
            return {name: float(known[name]) for name in self.task_names}  # type: ignore[index,arg-type]
        return given

    def _setup_layer(self, layer: nn.Module | None, params: Iterable[Tensor] | None) -> None:
        if layer is None and params is None:
            raise ValueError("shared_layer: grad_source='last_shared' needs shared_layer= (or shared_params=)")
        if layer is None:
            self._layer_params = [p for p in params or [] if p.requires_grad]
        elif isinstance(layer, nn.Linear):
            self._linear = layer
            self._hook = layer.register_forward_hook(self._capture)
        else:
            self._layer_params = [p for p in layer.parameters() if p.requires_grad]
        if self._linear is None and not self._layer_params:
            raise ValueError("the last shared layer has no trainable parameters to measure gradient norms on")

    def __setattr__(self, name: str, value: object) -> None:
        # The shared layer belongs to the model: keep it out of this module's children and state_dict.
        if name == "_linear":
            self.__dict__[name] = value
        else:
            super().__setattr__(name, value)  # type: ignore[arg-type]  # torch: Tensor | Module; any value works

    def remove_hook(self) -> None:
        """Detach the forward hook from the shared layer (the balancer cannot measure after this)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _capture(self, module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        if torch.is_grad_enabled() and output.requires_grad:  # evaluation forwards are not training steps
            self._io = (args[0].detach(), output)

    def extra_repr(self) -> str:
        return (
            f"tasks={self.task_names}, alpha={self.alpha}, lr={self.lr}, grad_source={self.grad_source}, "
            f"optimizer={self.optimizer}"
        )

    # ------------------------------------------------------------------ measuring n_i

    def _norms_and_direction(
        self, losses: Sequence[Tensor], shared: Tensor, scale: Tensor | None, weights: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, list[tuple[Tensor, Tensor]]] | None:
        """n_i from one backward per task that stops at the measured tensor (`shared`, or the hooked Linear's
        output) and also gives the task's own parameters (its head); with it, what the step's backward of Σ w_i L_i
        needs: Σ w_i δ_i at that tensor and w_i ∇L_i at each head, so the heads' backward does not run twice.
        Returns (norms, that tensor, Σ w_i δ_i, the heads' (parameter, w_i ∇L_i)), or None where that does not hold
        (the generic per-parameter path, or a loss that reads the trunk's parameters other than through that tensor):
        then `_norms` and the full backward."""
        norm_of: Callable[[Tensor], Tensor]
        if self.grad_source == "shared_rep":
            at, norm_of = shared, lambda g: torch.linalg.vector_norm(g, dtype=torch.float32)
        elif self._linear is not None and self._io is not None:
            inputs, at = self._io
            norm_of = LinearGradNorms(inputs, self._linear.bias is not None)
        else:
            return None
        trunk = upstream_leaves(at)
        found = [task_params(loss, at, trunk) for loss in losses]
        if not all(cut for _, cut in found):
            return None
        self._io = None  # release the activations with the graph
        norms, direction, product = [], None, None
        heads = []  # (parameter, w_k ∇L_k): a parameter two tasks reach gets the sum (`leaf_grads_root`)
        for k, (loss, (own, _)) in enumerate(zip(losses, found)):
            grad, *own_grads = self._grad(loss, [at, *own], scale)
            assert grad is not None  # allow_unused=False: autograd raises rather than return None
            norms.append(norm_of(grad))
            w = weights[k].to(grad.dtype)
            if direction is None or product is None:
                direction, product = grad * w, torch.empty_like(grad)
            else:
                direction.add_(torch.mul(grad, w, out=product))
            heads += [(p, g * weights[k].to(g.dtype)) for p, g in zip(own, own_grads) if g is not None]
        assert direction is not None
        stacked = torch.stack(norms)
        return stacked / scale if scale is not None else stacked, at, direction, heads

    def _norms(self, losses: Sequence[Tensor], shared: Tensor, scale: Tensor | None) -> Tensor:
        """n_i for each loss, on the unscaled gradients; float32."""
        if self.grad_source == "shared_rep":
            norms = torch.stack(
                [torch.linalg.vector_norm(self._grad(loss, [shared], scale)[0], dtype=torch.float32) for loss in losses]
            )
        elif self._linear is not None:
            if self._io is None:
                raise RuntimeError(
                    "GradNorm: the shared layer ran no forward with gradients since the last backward; "
                    "pass the layer the model actually uses (model.last_shared_layer)"
                )
            inputs, output = self._io
            self._io = None  # release the activations with the graph
            norm = LinearGradNorms(inputs, self._linear.bias is not None)
            per_loss = []
            for loss in losses:
                (output_grad,) = self._grad(loss, [output], scale)
                assert output_grad is not None  # allow_unused=False: autograd raises rather than return None
                per_loss.append(norm(output_grad))
            norms = torch.stack(per_loss)
        else:
            rows = []
            for loss in losses:
                grads = [g for g in self._grad(loss, self._layer_params, scale, allow_unused=True) if g is not None]
                per_tensor = torch._foreach_norm(grads) if grads else [torch.zeros((), device=loss.device)]
                rows.append(torch.linalg.vector_norm(torch.stack(per_tensor).float()))
            norms = torch.stack(rows)
        return norms / scale if scale is not None else norms

    # ------------------------------------------------------------------ the weight update

    def _reduce(self, norms: Tensor, losses: Tensor) -> tuple[Tensor, Tensor]:
        names = self.task_names
        local = {
            **{f"norm/{n}": norms[i] for i, n in enumerate(names)},
            **{f"loss/{n}": losses[i] for i, n in enumerate(names)},
        }
        mean = average_by_name(local)
        return (torch.stack([mean[f"norm/{n}"] for n in names]), torch.stack([mean[f"loss/{n}"] for n in names]))

    def _update(self, norms: Tensor, losses: Tensor) -> dict[str, Tensor]:
        """Stage w(t+1) (and L_i(0) at the first step) from this step's rank-averaged n_i and L_i; return metrics.

        Always from the committed state, so a later micro-batch of the same step restages it from the new means.
        """
        self._require_finite(norms, losses)
        initial = torch.where(self.initialized, self.initial_losses, losses)
        terms = gradnorm_terms(self.weights, norms, losses, initial, self.alpha)
        if self.optimizer == "adam":
            new, exp_avg, exp_avg_sq, step = adam_update(
                self.weights, terms.grad, self.exp_avg, self.exp_avg_sq, self.opt_step, self.lr, self.betas, self.eps
            )
            self._stage(exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, opt_step=step)
        else:
            new = self.weights - self.lr * terms.grad
        new = new.clamp_min(self.min_weight)
        new = new * (len(self.task_names) / new.sum())
        self._stage(weights=new, initial_losses=initial, initialized=torch.ones_like(self.initialized))

        share = terms.weighted_norms / terms.weighted_norms.sum()
        metrics = {"gradnorm/L_grad": terms.l_grad}
        for i, name in enumerate(self.task_names):
            metrics[tags.grad_norm(name)] = norms[i]
            metrics[f"gradnorm/norm_share/{name}"] = share[i]
            metrics[f"gradnorm/target/{name}"] = terms.target[i]
            metrics[f"gradnorm/loss_ratio/{name}"] = terms.loss_ratio[i]
        return metrics

    # ------------------------------------------------------------------ joint and per-task modes

    def backward(
        self,
        losses: dict[str, Tensor],
        shared: Tensor,
        ctx: Context = None,
    ) -> dict[str, Tensor]:
        self.check_losses(losses)
        scale = self._begin(JOINT, ctx, shared)
        ordered = [losses[name] for name in self.task_names]
        weights = self.weights.clone()  # the weights this step trains with (the update is only staged)
        measured = self._norms_and_direction(ordered, shared, scale, weights)
        own_norms = measured[0] if measured is not None else self._norms(ordered, shared, scale)
        norms, loss_values = self._reduce(own_norms, torch.stack([loss.detach().float() for loss in ordered]))
        metrics = self._update(self._mean("norms", norms), self._mean("losses", loss_values))
        if measured is not None:  # Σ_k w_k ∇L_k at the measured tensor and the heads, in ONE autograd call
            _, at, direction, heads = measured
            roots, grads = ([at, leaf_grads_root(heads)], [direction, None]) if heads else ([at], [direction])
            torch.autograd.backward(roots, grads)
        else:
            self.run_backward((weights * torch.stack(ordered)).sum(), ctx)
        self._end_joint()
        return {**{tags.weight(name): weights[i] for i, name in enumerate(self.task_names)}, **metrics}

    def backward_task(
        self,
        task: str,
        loss: Tensor,
        shared: Tensor,
        ctx: Context = None,
    ) -> dict[str, Tensor]:
        scale = self._begin(PER_TASK, ctx, shared)
        self._collect(task, norm=self._norms([loss], shared, scale)[0], loss=loss.detach().float())
        weight = self.weights[self._index[task]].clone()
        self.run_backward(weight * loss, ctx)
        return {tags.weight(task): weight}

    def _finish(self) -> dict[str, Tensor]:
        stats = [self._collected[name] for name in self.task_names]
        return self._update(
            *self._reduce(torch.stack([s["norm"] for s in stats]), torch.stack([s["loss"] for s in stats]))
        )
