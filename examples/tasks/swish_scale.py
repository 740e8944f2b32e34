"""Elementwise chain: y = x * sigmoid(x) * scale (Swish followed by a scale)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) * self.scale


batch_size = 256
features = 4096
scale = 1.5


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [scale]
