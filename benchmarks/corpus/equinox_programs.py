"""Equinox programs: an `eqx.nn.MLP` trained with optax, a small `eqx.nn.Conv2d` network's
forward and an `eqx.nn.GRUCell` scanned over a sequence, each vmapped over the batch as the
equinox documentation does.

A model crosses the call boundary as its arrays (`eqx.partition(model, eqx.is_array)`), the
rest closed over: the form `jax.jit` (and so `xfuse.jit`) takes. Imports numpy at module
level; jax, equinox and optax inside the builders.
"""

from __future__ import annotations

import numpy as np

from .program import Program, as_numpy, pick, trained


def build_mlp_train(size: str):
    import jax
    import equinox as eqx
    import optax

    batch, features, width, depth, classes = pick(
        size, bench=(128, 784, 512, 2, 10), test=(8, 32, 16, 2, 10)
    )
    model = eqx.nn.MLP(features, classes, width, depth, activation=jax.nn.relu,
                       key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    optimizer = optax.adam(1e-3)

    def loss_fn(model, x, y):
        logits = jax.vmap(model)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train_step(params, opt_state, x, y):
        model = eqx.combine(params, static)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return eqx.filter(model, eqx.is_array), opt_state, loss

    def batch_of(seed: int):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((batch, features), dtype=np.float32)
        return x, rng.integers(0, classes, batch).astype(np.int32)

    warm_up = [batch_of(seed) for seed in (1, 2, 3)]
    state = trained(train_step, (params, optimizer.init(params)), warm_up)
    return train_step, (*state, *batch_of(0))


def build_conv_forward(size: str):
    import jax
    import equinox as eqx

    batch, side, channels, classes = pick(
        size, bench=(64, 32, (32, 64), 10), test=(4, 8, (4, 8), 10)
    )
    keys = jax.random.split(jax.random.key(0), 4)
    flat = channels[1] * (side // 4) ** 2
    model = eqx.nn.Sequential([
        eqx.nn.Conv2d(3, channels[0], kernel_size=3, padding=1, key=keys[0]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.MaxPool2d(kernel_size=2, stride=2),
        eqx.nn.Conv2d(channels[0], channels[1], kernel_size=3, padding=1, key=keys[1]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.MaxPool2d(kernel_size=2, stride=2),
        eqx.nn.Lambda(lambda x: x.reshape(-1)),
        eqx.nn.Linear(flat, 128, key=keys[2]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Linear(128, classes, key=keys[3]),
        eqx.nn.Lambda(jax.nn.log_softmax),
    ])
    params, static = eqx.partition(model, eqx.is_array)

    def forward(params, images):
        model = eqx.combine(params, static)
        return jax.vmap(model)(images)

    images = np.random.default_rng(0).standard_normal((batch, 3, side, side), dtype=np.float32)
    return forward, (as_numpy(params), images)


def build_gru_scan_forward(size: str):
    import jax
    import equinox as eqx

    batch, length, features, hidden = pick(size, bench=(64, 50, 64, 256), test=(4, 5, 8, 16))

    class Encoder(eqx.Module):
        cell: eqx.nn.GRUCell
        head: eqx.nn.Linear

        def __init__(self, key):
            cell_key, head_key = jax.random.split(key)
            self.cell = eqx.nn.GRUCell(features, hidden, key=cell_key)
            self.head = eqx.nn.Linear(hidden, 1, key=head_key)

        def __call__(self, sequence):
            def step(state, x):
                return self.cell(x, state), None

            final, _ = jax.lax.scan(step, jax.numpy.zeros(hidden), sequence)
            return self.head(final)

    params, static = eqx.partition(Encoder(jax.random.key(0)), eqx.is_array)

    def forward(params, sequences):
        model = eqx.combine(params, static)
        return jax.vmap(model)(sequences)

    rng = np.random.default_rng(0)
    sequences = rng.standard_normal((batch, length, features), dtype=np.float32)
    return forward, (as_numpy(params), sequences)


PROGRAMS = (
    Program(
        "equinox_mlp_train_adam",
        "equinox",
        "eqx.nn.MLP 784-512-512-10 (relu), batch 128: partition/combine, "
        "filter_value_and_grad of cross-entropy, adam update (the fourth step)",
        build_mlp_train,
    ),
    Program(
        "equinox_conv_forward",
        "equinox",
        "eqx.nn.Sequential of 2x (Conv2d 3x3 + relu + MaxPool2d), Linear 128, Linear 10, "
        "log_softmax on 3x32x32 images, vmapped over batch 64",
        build_conv_forward,
    ),
    Program(
        "equinox_gru_scan_forward",
        "equinox",
        "eqx.nn.GRUCell 64->256 scanned over 50 steps (lax.scan), Linear head, vmapped over "
        "batch 64",
        build_gru_scan_forward,
    ),
)
