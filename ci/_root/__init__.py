"""gdn2_oracle: exact references, a golden corpus, a conformance suite and validation-gated benchmarks
for Gated DeltaNet-2 kernels.

Subpackages (the repository's top-level folders, docs/DESIGN.md §3): ``gdn2_oracle.oracle`` (exact
NumPy / mpmath references), ``gdn2_oracle.kernels`` (the JAX / Pallas kernels under test),
``gdn2_oracle.golden`` (the golden corpus), ``gdn2_oracle.ci`` (tolerance model, harness, CLI) and
``gdn2_oracle.property_tests`` (the conformance suite and its pytest plugin). Nothing is imported
here: ``import gdn2_oracle.oracle`` never loads JAX.

(This file is the package's root ``__init__``; it lives in ci/_root/ so that the repository's top
level keeps only the subpackages' folders. pyproject.toml maps it.)
"""


def __getattr__(name):
    """``__version__``, read from the installed distribution's metadata on first use (importing
    ``importlib.metadata`` here would slow every start of the console script, whose signal handlers wait for it)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gdn2-oracle")
    except PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "unknown"
