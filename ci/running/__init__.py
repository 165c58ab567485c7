"""Putting a kernel to work: the harness (run, VJP), device meshes, the compilation cache, multi-host
references and the TPU cost model. Uses ``ci.grading``; never ``ci.commands``."""
