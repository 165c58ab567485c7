"""The judge (docs/DESIGN.md §4): grades, tolerance, diagnosis, cases and references. NumPy and the oracle
only: no JAX, no argparse, nothing of ``ci.running`` or ``ci.commands``."""
