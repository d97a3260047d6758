"""Optimiser and solver programs: several optax steps scanned with `lax.scan` (global-norm
clipping chained with adamw on a warmup-cosine schedule) on a small MLP, and a diffrax neural
ODE solved with Tsit5 and an adaptive step-size controller.

Imports numpy at module level; jax, optax, equinox and diffrax inside the builders.
"""

from __future__ import annotations

import numpy as np

from .program import Program, as_numpy, pick


def build_scanned_adamw(size: str):
    import jax
    import jax.numpy as jnp
    import optax

    steps, batch, features, hidden, outputs = pick(
        size, bench=(20, 128, 64, 256, 10), test=(3, 8, 8, 16, 4)
    )
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=1e-3, warmup_steps=max(1, steps // 4), decay_steps=steps
    )
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=schedule, weight_decay=1e-4),
    )

    def mlp(params, x):
        for layer in params[:-1]:
            x = jax.nn.gelu(x @ layer["w"] + layer["b"])
        return x @ params[-1]["w"] + params[-1]["b"]

    def loss_fn(params, x, y):
        return jnp.mean((mlp(params, x) - y) ** 2)

    def train(params, opt_state, xs, ys):
        def step(carry, batch):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), (xs, ys))
        return params, opt_state, losses

    rng = np.random.default_rng(0)
    widths = (features, hidden, hidden, outputs)
    params = [
        {
            "w": (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32),
            "b": np.zeros(n, np.float32),
        }
        for m, n in zip(widths[:-1], widths[1:])
    ]
    xs = rng.standard_normal((steps, batch, features), dtype=np.float32)
    ys = rng.standard_normal((steps, batch, outputs), dtype=np.float32)
    return train, (params, as_numpy(optimizer.init(params)), xs, ys)


def build_neural_ode(size: str):
    import jax
    import jax.numpy as jnp
    import diffrax
    import equinox as eqx

    batch, state_size, width, points = pick(size, bench=(128, 16, 64, 10), test=(4, 2, 8, 3))

    class VectorField(eqx.Module):
        mlp: eqx.nn.MLP

        def __init__(self, key):
            self.mlp = eqx.nn.MLP(state_size, state_size, width, depth=2,
                                  activation=jax.nn.softplus, final_activation=jnp.tanh, key=key)

        def __call__(self, t, y, args):
            return self.mlp(y)

    params, static = eqx.partition(VectorField(jax.random.key(0)), eqx.is_array)
    ts = np.linspace(0.0, 1.0, points, dtype=np.float32)

    def solve(params, y0s, ts):
        field = eqx.combine(params, static)

        def one(y0):
            solution = diffrax.diffeqsolve(
                diffrax.ODETerm(field),
                diffrax.Tsit5(),
                t0=ts[0],
                t1=ts[-1],
                dt0=0.1,
                y0=y0,
                stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
                saveat=diffrax.SaveAt(ts=ts),
            )
            return solution.ys

        return jax.vmap(one)(y0s)

    y0s = np.random.default_rng(0).standard_normal((batch, state_size), dtype=np.float32)
    return solve, (as_numpy(params), y0s, ts)


PROGRAMS = (
    Program(
        "optax_scan_adamw_clip_cosine",
        "optax",
        "20 steps in lax.scan of an MLP 64-256-256-10 (gelu), batch 128: "
        "chain(clip_by_global_norm, adamw) on a warmup_cosine_decay schedule",
        build_scanned_adamw,
    ),
    Program(
        "diffrax_neural_ode_tsit5",
        "diffrax",
        "neural ODE (eqx.nn.MLP 16-64-64-16 vector field), Tsit5 with a PID controller over "
        "t in [0, 1], 10 saved times, vmapped over 128 initial states",
        build_neural_ode,
    ),
)
