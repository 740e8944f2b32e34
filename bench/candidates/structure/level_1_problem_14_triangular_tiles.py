"""An honest structure-exploiting candidate for KernelBench level1/14 (C = triu(A @ B) with A and B
upper triangular, N = 4096), backend torch: the product is built from 512 x 512 blocks, and only the
block products that can be non-zero are computed. Block C_ij (i <= j) is the sum over i <= k <= j of
A_ik B_kj, so for each k one GEMM updates the block rows 0..k and block columns k..n-1 at once:
C[:(k+1)T, kT:] += A[:(k+1)T, kT:(k+1)T] @ B[kT:(k+1)T, kT:]. That is 120 of the dense product's 512
block products (about 23% of the reference algorithm's work), in 8 GEMM calls, all in fp32 (the
precision track's TF32 setting applies). The sums run over k in another order than one dense GEMM's,
an honest reordering of fp32 sums.
"""

import torch
import torch.nn as nn

BLOCK = 512


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        n = A.shape[0]
        C = torch.zeros_like(A)
        for start in range(0, n, BLOCK):
            end = min(start + BLOCK, n)
            # rows of the blocks 0..k, columns from block k on: every (i <= k <= j) product at once
            C[:end, start:].addmm_(A[:end, start:end], B[start:end, start:])
        return torch.triu(C)
