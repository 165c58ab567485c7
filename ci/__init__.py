"""The judge and the gdn2-oracle command line, in floors: ``grading`` (bottom), ``running``, ``commands`` (top);
docs/DESIGN.md §3."""
