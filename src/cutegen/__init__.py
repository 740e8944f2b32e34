"""cutegen: turn a PyTorch reference program into a faster, verified CuTe GPU kernel.

Importing the package does nothing beyond defining names; torch and every SDK are imported by the
modules that need them, when they are used. ARCHITECTURE.md shows the modules' floors, which may import
which, and the way a candidate travels; EVALUATION.md says how a candidate is judged.
"""

__version__ = "0.1.0"
