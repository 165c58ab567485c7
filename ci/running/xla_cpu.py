"""How the judging commands compile on a CPU: XLA's quick-compiling CPU settings, unless the user chose otherwise.

A judging command (``validate``, ``domain``, ``hunt``) compiles dozens of small programs once each and runs each a
few times, so on a CPU its cold time was mostly XLA's compiler. Backend optimization level 0 with the CPU fusion
emitters off (XLA's elemental emitter) compiles a family kernel's forward and VJP in 0.4 s instead of 2.9-4.5 s
(docs/performance.md), and moves its results by float32 rounding only (gdn- and kda-factorized, o, final state and
six gradients: at most 5.4e-6 of each result's largest value, far inside the judge's tolerances); level 0 with and
without the emitters gave bit-identical results. The LLVM module of a program is compiled whole instead of split in
parts for parallel code generation: on a machine whose cores are busy the parts only add work (12 programs of our
family kernels compiled in 3.8-4.5 s instead of 4.8-5.1 s, the host's two cores loaded), an executable holds half
the memory mappings (86 instead of 178 for a family kernel's forward and VJP; ``map_guard.py``), and the results are
bit-identical (o, final state and every gradient of gdn-, kda-factorized, factorized and pairwise, measured). The
verdict is about the kernel's math, which these settings do not change; the settings touch XLA's CPU backend only (a
GPU's or TPU's programs compile as before).

``bench`` times programs, so it compiles as the user's JAX does; so does every command with env
``GDN2_XLA_CPU=default``. A flag the user's ``XLA_FLAGS`` already sets is left as the user set it. The settings
are applied to a fresh process only (the console script's child, before JAX starts its backends): XLA reads
``XLA_FLAGS`` once, and an in-process run must not change its caller's environment.
"""

from __future__ import annotations

import os

ENV = "GDN2_XLA_CPU"
MODES = ("quick-compile", "default")
FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
         "--xla_cpu_parallel_codegen_split_count=1")
JUDGING = ("validate", "domain", "hunt")


def mode():
    """Env ``GDN2_XLA_CPU``: ``quick-compile`` (the default) or ``default`` (as the user's JAX compiles); a
    ValueError naming the variable for another value."""
    value = os.environ.get(ENV, "").strip() or MODES[0]
    if value not in MODES:
        raise ValueError(f"{ENV}: expected one of {MODES}, got {value!r}")
    return value


def flags_to_add(xla_flags, command):
    """The flags of :data:`FLAGS` a run of ``command`` adds to ``xla_flags`` (the user's ``XLA_FLAGS``): none for a
    command that does not judge, or with ``GDN2_XLA_CPU=default``; never one whose name the user set."""
    if command not in JUDGING or mode() == "default":
        return []
    named = {part.split("=", 1)[0] for part in (xla_flags or "").split()}
    return [flag for flag in FLAGS if flag.split("=", 1)[0] not in named]


def apply(command):
    """In a fresh process, before JAX starts: add :func:`flags_to_add` to env ``XLA_FLAGS``; return what was added."""
    added = flags_to_add(os.environ.get("XLA_FLAGS", ""), command)
    if added:
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "").strip(), *added]).strip()
    return added


def in_force():
    """``XLA_FLAGS`` as the process has it (recorded in every report's environment)."""
    return os.environ.get("XLA_FLAGS", "").strip()
