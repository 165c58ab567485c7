"""The GDN-2 conformance suite: ``pytest --pyargs gdn2_oracle.property_tests --gdn2-kernel NAME``."""
