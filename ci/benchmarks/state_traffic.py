"""State traffic per token: a replay kernel (checkpoint + ring) against a pool kernel on the same session (a script).

Both kernels run one gdn session of single-token calls through their drivers (``ci/running/drivers.py``), which count
the bytes of state storage each reads and writes as it runs (``ci.running.replay_backends.Traffic``): a pool token
reads and writes its slot; a replay token reads the checkpoint and the ring's valid entries and writes one entry, or
the checkpoint on a flush (every L tokens). Both are judged too, so no figure belongs to a wrong run.

    python -m gdn2_oracle.ci.benchmarks.state_traffic                         # small shapes, every ring
    python -m gdn2_oracle.ci.benchmarks.state_traffic --shape 16,32,128,128 --steps 64 --rings 16

``--shape H,HV,K,V``: key heads, value heads, head dims (Qwen3.5's GDN layers: 16,32,128,128). Storage: the pool
kernel's states in ``--pool-dtype``; the replay kernel's checkpoint in ``--checkpoint-dtype`` and its ``d``, ``k``
caches in ``--cache-dtype`` (vLLM's ReplaySSM default: float32 checkpoint, bf16 caches).
"""

from __future__ import annotations

import argparse

import numpy as np

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.serving import Session
from gdn2_oracle.ci.running.serving import driver, run_session
from gdn2_oracle.kernels.registry import FAMILY_SERVING_DEFAULTS
from gdn2_oracle.oracle import serving_recipes
from gdn2_oracle.oracle.serving import DecodeCall, SessionScript

POOL_KERNEL = FAMILY_SERVING_DEFAULTS[0]  # the gdn pool kernel


def session(H, HV, K, V, steps, seed=0):
    """One gdn sequence (slot 0 of 2) as ``steps`` single-token calls, float32 inputs."""
    xs = serving_recipes.tokens(1, steps, "float32", seed, h=H, k=K, v=V, hv=HV)
    beta = xs[4][..., :1]
    xs[4], xs[5] = np.repeat(beta, K, axis=-1), np.repeat(beta, V, axis=-1)
    xs[3] = np.repeat(xs[3][..., :1], K, axis=-1)
    calls = [DecodeCall(*(x[:, t:t + 1] for x in xs), state_indices=np.zeros(1, np.int64)) for t in range(steps)]
    pool = serving_recipes.round_to_bfloat16(np.random.default_rng(seed).standard_normal((2, HV, K, V)) * 0.1)
    return Session.from_script(SessionScript(f"traffic_{H}_{HV}_{K}_{V}", calls, pool, family="gdn"))


def measure(spec, sess):
    """``(grade, read bytes per token, written bytes per token)`` of kernel ``spec`` on ``sess``."""
    drv = driver(kernels.get(spec), sess.family)
    report = run_session(drv, sess)
    read, written = drv.traffic.per_token()
    return report.grade, read, written


def build_parser():
    """The script's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,2,32,32", help="H,HV,K,V (default 1,2,32,32)")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--rings", default="1,4,16,64", help="replay ring lengths L")
    parser.add_argument("--pool-dtype", default="float32")
    parser.add_argument("--checkpoint-dtype", default="float32")
    parser.add_argument("--cache-dtype", default="bfloat16")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    H, HV, K, V = (int(x) for x in args.shape.split(","))
    sess = session(H, HV, K, V, args.steps)
    pool = measure(f"{POOL_KERNEL}[state_dtype={args.pool_dtype!r}]", sess)
    print(f"shape H={H} HV={HV} K={K} V={V}, {args.steps} single-token calls; bytes of state per token")
    print(f"{'kernel':52} {'grade':10} {'read':>10} {'written':>10} {'total':>10} {'vs pool':>8}")
    print(f"{POOL_KERNEL + ' (pool, ' + args.pool_dtype + ')':52} {pool[0]:10} {pool[1]:10.0f} {pool[2]:10.0f} "
          f"{pool[1] + pool[2]:10.0f} {1.0:8.2f}")
    for L in (int(x) for x in args.rings.split(",")):
        spec = (f"replay-recurrent[capacity={L},state_dtype={args.checkpoint_dtype!r},"
                f"cache_dtype={args.cache_dtype!r}]")
        grade, read, written = measure(spec, sess)
        label = f"replay-recurrent L={L} ({args.checkpoint_dtype} checkpoint, {args.cache_dtype} caches)"
        print(f"{label:52} {grade:10} {read:10.0f} {written:10.0f} {read + written:10.0f} "
              f"{(read + written) / (pool[1] + pool[2]):8.2f}")


if __name__ == "__main__":
    main()
