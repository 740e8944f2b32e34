"""cutegen: turn a PyTorch reference program into a faster, verified CuTe GPU kernel.

Importing the package does nothing beyond defining names; torch and every SDK are imported by the
modules that need them, when they are used.
"""

__version__ = "0.1.0"
