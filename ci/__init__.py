"""The gates: tolerance model, validation harness, validation-gated benchmark and CLI."""
