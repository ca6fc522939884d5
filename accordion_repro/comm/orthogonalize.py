"""Batched orthonormalisation of the columns of P (facts section 3: after P's all-reduce)."""

from __future__ import annotations

import torch

# A column whose norm is below this is left at (near) zero instead of dividing by zero:
# an all-zero layer gradient then decompresses to zero, not NaN.
_TINY = 1e-30


def orthonormalize_(batch: torch.Tensor) -> torch.Tensor:
    """Make the columns of each (n, r) matrix of a (b, n, r) batch orthonormal, in place.

    Rank 1 is a normalisation. Higher ranks use Householder QR (LAPACK), which stays
    orthonormal where classical Gram-Schmidt loses orthogonality on nearly dependent columns;
    the signs QR picks do not matter because Q = M^T P carries them into the product P Q^T.
    """
    if batch.shape[-1] == 1:
        norms = torch.linalg.vector_norm(batch, dim=1, keepdim=True)
        return batch.div_(norms.clamp_min_(_TINY))
    q, _ = torch.linalg.qr(batch, mode="reduced")
    return batch.copy_(q)
