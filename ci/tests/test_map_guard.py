"""The mapping guard (ci/running/map_guard.py): compiled programs hold memory mappings until JAX's caches let them go;
past half the process's limit the guard clears the caches, which gives the mappings back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle.ci.running import map_guard

HELD = []  # the jitted functions, kept as a kernel's runner is: only JAX's caches hold their programs' mappings


def _compile_programs(n):
    """Compile ``n`` distinct small programs (one jitted function each, at its own shape); the mappings they hold."""
    before = map_guard.mappings()
    for i in range(n):
        HELD.append(jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * x, axis=0)))
        jax.block_until_ready(HELD[-1](np.ones((i + 2, 3), np.float32)))
    return map_guard.mappings() - before


def test_counts_and_limit_are_read_from_proc():
    held, most = map_guard.mappings(), map_guard.limit()
    assert held is not None and 0 < held < most, (held, most)


def test_relieve_gives_back_the_mappings_of_compiled_programs():
    assert _compile_programs(8) > 8  # each program maps its code and data
    held = map_guard.mappings()
    fraction = 0.5 * held / map_guard.limit()  # this process is above it
    assert map_guard.relieve(fraction, every=0) and map_guard.mappings() < held


def test_relieve_leaves_the_caches_below_the_fraction():
    _compile_programs(2)
    held = map_guard.mappings()
    # nothing cleared (a few maps may come, go)
    assert not map_guard.relieve(1.0, every=0) and map_guard.mappings() >= held - 8


def test_a_bad_fraction_names_the_argument():
    with pytest.raises(ValueError, match="fraction"):
        map_guard.relieve(0)


@pytest.mark.parametrize("every", [-1, 1.5])
def test_a_bad_count_of_programs_names_the_argument(every):
    with pytest.raises(ValueError, match="every"):
        map_guard.relieve(every=every)


def test_the_mappings_are_counted_again_only_after_every_programs(monkeypatch):
    """Between two counts ``every`` programs are built (JAX's backend-compile event): a process above the fraction is
    relieved at once, then not counted again until three more programs exist, then relieved again."""
    counted = []
    count = map_guard.mappings
    monkeypatch.setattr(map_guard, "mappings", lambda: counted.append(1) or 10 ** 9)  # always above the fraction
    map_guard.relieve(every=0)  # a count now, whatever came before in this process
    assert len(counted) == 1
    with monkeypatch.context() as m:
        m.setattr(map_guard, "mappings", count)
        _compile_programs(2)
    assert not map_guard.relieve(every=3) and len(counted) == 1  # two programs since: not counted
    with monkeypatch.context() as m:
        m.setattr(map_guard, "mappings", count)
        _compile_programs(1)
    assert map_guard.relieve(every=3) and len(counted) == 2  # the third: counted, and cleared
    for _ in range(map_guard.CALLS):  # no program built: counted again only after CALLS calls
        assert not map_guard.relieve(every=3)
    assert len(counted) == 2 and map_guard.relieve(every=3) and len(counted) == 3
