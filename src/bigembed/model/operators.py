"""Relation operators: transforms applied to one side's embeddings before comparison.

A *standard* operator holds one set of parameters (one relation type, PBG's non-dynamic mode);
a *dynamic* operator holds one parameter row per relation type and is called with a tensor of
relation ids, one per embedding. Both are ``nn.Module`` so their parameters can be shared,
checkpointed and optimised like any PyTorch parameter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from bigembed.model.names import OPERATORS

#: Relation dropout: maps the parameter rows picked for a batch to their dropped-out copy.
ParamDropout = Callable[[Tensor], Tensor]


class Operator(nn.Module):
    """Base class. ``num_relations is None`` means standard mode (no relation axis)."""

    def __init__(self, dim: int, num_relations: int | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.num_relations = num_relations

    def _shape(self, *shape: int) -> tuple[int, ...]:
        return shape if self.num_relations is None else (self.num_relations, *shape)

    @staticmethod
    def _pick(param: Tensor, rel: Tensor | None) -> Tensor:
        """The parameter rows for ``rel`` (dynamic) or the parameter itself (standard).

        ``index_select``, not ``param[rel]``: its backward is an ``index_add_``, cheaper on CPU
        than the sorting ``index_put_`` that advanced indexing backpropagates through.
        """
        return param if rel is None else param.index_select(0, rel)

    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:  # pragma: no cover
        """``x`` transformed by the operator of each relation in ``rel``; ``drop`` (training
        with relation dropout, dynamic mode) is applied to each picked parameter block."""
        raise NotImplementedError

    def _picked(self, param: Tensor, rel: Tensor | None, drop: ParamDropout | None) -> Tensor:
        """:meth:`_pick`, then ``drop`` (relation dropout) on the rows picked."""
        rows = self._pick(param, rel)
        return rows if drop is None else drop(rows)

    def randomize_(self, scale: float, generator: torch.Generator) -> None:
        """Redraw every parameter from N(0, scale^2) instead of the identity the constructor
        sets (``relation_init_scale``): the operators ComplEx-N3 and LibKGE start from."""
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator).mul_(scale))

    def reg_embeddings_sum(self, x: Tensor) -> Tensor:
        """Σ of the cubed magnitudes the N3 regulariser penalises (complex operators: modulus)."""
        return _CubedAbsSum.apply(x)

    def reg_params(self, rel: Tensor | None = None) -> Tensor | None:
        """Magnitudes of the parameters the N3 regulariser penalises (None: there are none)."""
        return None

    def reg_params_sum(self, rel: Tensor | None = None) -> Tensor | None:
        """Σ of the cubed parameter magnitudes, once per edge of ``rel`` (dynamic mode) or once
        (standard mode); None when the operator has no penalised parameters.

        Dynamic mode counts each relation's rows ``bincount(rel)`` times instead of gathering a
        row per edge: the same value and gradient from ``num_relations`` rows, not ``B``.
        """
        mags = self.reg_params(None)  # dynamic mode: one row per relation type
        if mags is None or rel is None:
            return None if mags is None else mags.pow(3).sum()
        per_relation = mags.pow(3).flatten(1).sum(1)
        counts = torch.bincount(rel, minlength=per_relation.shape[0]).to(per_relation.dtype)
        return (per_relation * counts).sum()


class _CubedAbsSum(torch.autograd.Function):
    """Σ|x|³ with a one-pass backward (3·x·|x|) instead of autograd's chain of pow/abs/sign."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ax = x.abs()
        ctx.save_for_backward(x, ax)
        return (ax * ax * ax).sum()

    @staticmethod
    def backward(ctx, g: Tensor):
        x, ax = ctx.saved_tensors
        return x * ax * (3 * g)


class _ComplexCubedModulusSum(torch.autograd.Function):
    """Σ (a² + b²)^{3/2} over the complex halves [a | b] of x; gradient 3·[a | b]·√(a² + b²)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        a, b = torch.split(x, x.shape[-1] // 2, dim=-1)
        r2 = torch.addcmul(a * a, b, b)  # |z|^2
        r = r2.sqrt()
        ctx.save_for_backward(x, r)
        return torch.dot(r2.view(-1), r.view(-1))  # sum |z|^3 without another temporary

    @staticmethod
    def backward(ctx, g: Tensor):
        x, r = ctx.saved_tensors
        half = x.shape[-1] // 2
        # 3g folded into the half-size r first: one full-size pass instead of two.
        return (x.unflatten(-1, (2, half)) * (r * (3 * g)).unsqueeze(-2)).flatten(-2)


def _reduce_to(grad: Tensor, like: Tensor) -> Tensor:
    """Sum a broadcast gradient back to the parameter's shape (standard-mode operators)."""
    while grad.dim() > like.dim():
        grad = grad.sum(0)
    return grad


class _ComplexMultiply(torch.autograd.Function):
    """[a | b] * (re + i·im) written straight into one output buffer.

    The obvious ``cat((a*re - b*im, a*im + b*re))`` allocates four temporaries and a
    concatenation forward and as many backward; this runs in a handful of fused passes.
    """

    @staticmethod
    def forward(ctx, x: Tensor, re: Tensor, im: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        out = torch.empty_like(x)
        torch.mul(a, re, out=out[..., :half])
        out[..., :half].addcmul_(b, im, value=-1.0)
        torch.mul(a, im, out=out[..., half:])
        out[..., half:].addcmul_(b, re)
        ctx.save_for_backward(x, re, im)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        x, re, im = ctx.saved_tensors
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        gr, gi = g[..., :half], g[..., half:]
        grad_x = grad_re = grad_im = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.empty_like(x)
            torch.mul(gr, re, out=grad_x[..., :half])
            grad_x[..., :half].addcmul_(gi, im)
            torch.mul(gi, re, out=grad_x[..., half:])
            grad_x[..., half:].addcmul_(gr, im, value=-1.0)
        if ctx.needs_input_grad[1]:
            grad_re = _reduce_to(gr * a + gi * b, re)
        if ctx.needs_input_grad[2]:
            grad_im = _reduce_to(gi * a - gr * b, im)
        return grad_x, grad_re, grad_im


class IdentityOperator(Operator):
    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:
        return x


class TranslationOperator(Operator):
    def __init__(self, dim: int, num_relations: int | None = None) -> None:
        super().__init__(dim, num_relations)
        self.translation = nn.Parameter(torch.zeros(self._shape(dim)))

    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:
        return x + self._picked(self.translation, rel, drop)

    def reg_params(self, rel: Tensor | None = None) -> Tensor | None:
        return self._pick(self.translation, rel).abs()


class DiagonalOperator(Operator):
    def __init__(self, dim: int, num_relations: int | None = None) -> None:
        super().__init__(dim, num_relations)
        self.diagonal = nn.Parameter(torch.ones(self._shape(dim)))

    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:
        return x * self._picked(self.diagonal, rel, drop)

    def reg_params(self, rel: Tensor | None = None) -> Tensor | None:
        return self._pick(self.diagonal, rel).abs()


class LinearOperator(Operator):
    def __init__(self, dim: int, num_relations: int | None = None) -> None:
        super().__init__(dim, num_relations)
        eye = torch.eye(dim)
        if num_relations is not None:
            eye = eye.expand(num_relations, dim, dim).clone()
        self.linear_transformation = nn.Parameter(eye)

    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:
        if rel is None:
            return x @ self.linear_transformation.t()
        mats = self.linear_transformation[rel]  # (..., D, D)
        if drop is not None:
            mats = drop(mats)
        return torch.matmul(mats, x.unsqueeze(-1)).squeeze(-1)


class AffineOperator(LinearOperator):
    def __init__(self, dim: int, num_relations: int | None = None) -> None:
        super().__init__(dim, num_relations)
        self.translation = nn.Parameter(torch.zeros(self._shape(dim)))

    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:
        return super().forward(x, rel, drop) + self._picked(self.translation, rel, drop)


class ComplexDiagonalOperator(Operator):
    """ComplEx: the two halves of a vector are the real and imaginary parts."""

    def __init__(self, dim: int, num_relations: int | None = None) -> None:
        if dim % 2:
            raise ValueError(f"complex_diagonal needs an even dimension, got {dim}")
        super().__init__(dim, num_relations)
        self.real = nn.Parameter(torch.ones(self._shape(dim // 2)))
        self.imag = nn.Parameter(torch.zeros(self._shape(dim // 2)))

    def forward(
        self, x: Tensor, rel: Tensor | None = None, drop: ParamDropout | None = None
    ) -> Tensor:
        re, im = self._picked(self.real, rel, drop), self._picked(self.imag, rel, drop)
        return _ComplexMultiply.apply(x, re, im)

    def reg_embeddings_sum(self, x: Tensor) -> Tensor:
        return _ComplexCubedModulusSum.apply(x)

    def reg_params(self, rel: Tensor | None = None) -> Tensor | None:
        re, im = self._pick(self.real, rel), self._pick(self.imag, rel)
        return (re.pow(2) + im.pow(2)).sqrt()


def make_operator(
    name: str,
    dim: int,
    num_relations: int | None = None,
    init_scale: float | None = None,
    generator: torch.Generator | None = None,
) -> Operator:
    """Instantiate the operator called ``name`` (a name of
    :data:`bigembed.model.names.OPERATORS`): the identity transform (PBG's initialization), or
    with ``init_scale`` random parameters drawn from ``generator`` (:meth:`Operator.randomize_`).
    """
    op = OPERATORS.get(name)(dim, num_relations)
    if init_scale is not None:
        op.randomize_(init_scale, generator if generator is not None else torch.Generator())
    return op
