"""Norm: LayerNorm over the last dimension, with learned weight and bias."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


rows = 512
features = 1024


def get_inputs():
    return [torch.randn(rows, features)]


def get_init_inputs():
    return [features]
