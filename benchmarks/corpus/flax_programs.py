"""Flax programs: a linen MLP and a batch-normalised CNN trained with optax, the same kind of
step in flax.nnx, and a transformer block's forward and its loss gradient with dropout.

Written as the flax documentation writes them: `nn.compact` modules, `TrainState`, integer
labels through `optax.softmax_cross_entropy_with_integer_labels`. Imports numpy at module
level; jax, flax and optax inside the builders.
"""

from __future__ import annotations

import numpy as np

from .program import Program, as_numpy, key_data, pick, trained


def _classification_batch(batch: int, shape: tuple[int, ...], classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch, *shape), dtype=np.float32)
    labels = rng.integers(0, classes, batch).astype(np.int32)
    return images, labels


def build_mlp_train(size: str):
    import jax
    import flax.linen as nn
    import optax

    batch, features, hidden, classes = pick(
        size, bench=(128, 784, (512, 512), 10), test=(8, 32, (16, 16), 10)
    )

    class MLP(nn.Module):
        hidden: tuple[int, ...]
        classes: int

        @nn.compact
        def __call__(self, x):
            for width in self.hidden:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(self.classes)(x)

    model = MLP(hidden, classes)
    optimizer = optax.adam(1e-3)

    def train_step(params, opt_state, images, labels):
        def loss_fn(params):
            logits = model.apply({"params": params}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    images, labels = _classification_batch(batch, (features,), classes)
    params = model.init(jax.random.key(0), images)["params"]
    warm_up = [_classification_batch(batch, (features,), classes, seed) for seed in (1, 2, 3)]
    state = trained(train_step, (params, optimizer.init(params)), warm_up)
    return train_step, (*state, images, labels)


def build_cnn_batchnorm_train(size: str):
    import jax
    import flax.linen as nn
    import optax
    from flax.training import train_state

    batch, side, channels, classes = pick(
        size, bench=(64, 28, (32, 64), 10), test=(4, 8, (4, 8), 10)
    )

    class CNN(nn.Module):
        channels: tuple[int, ...]
        classes: int

        @nn.compact
        def __call__(self, x, train: bool):
            for width in self.channels:
                x = nn.Conv(width, kernel_size=(3, 3), use_bias=False)(x)  # BatchNorm shifts
                x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
                x = nn.relu(x)
                x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            return nn.Dense(self.classes)(x)

    class TrainState(train_state.TrainState):
        batch_stats: dict

    model = CNN(channels, classes)
    images, labels = _classification_batch(batch, (side, side, 1), classes)
    variables = model.init(jax.random.key(0), images, train=False)
    state = TrainState.create(
        apply_fn=model.apply,
        params=variables["params"],
        batch_stats=variables["batch_stats"],
        tx=optax.sgd(0.05, momentum=0.9),
    )

    def train_step(state, images, labels):
        def loss_fn(params):
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats},
                images,
                train=True,
                mutable=["batch_stats"],
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state = state.apply_gradients(grads=grads)
        state = state.replace(batch_stats=updates["batch_stats"])
        return state, loss

    return train_step, as_numpy((state, images, labels))


def build_nnx_train(size: str):
    import optax
    from flax import nnx

    batch, features, hidden, classes = pick(size, bench=(128, 784, 512, 10), test=(8, 32, 16, 10))

    class Model(nnx.Module):
        def __init__(self, features: int, hidden: int, classes: int, rngs: nnx.Rngs):
            self.linear1 = nnx.Linear(features, hidden, use_bias=False, rngs=rngs)  # norm shifts
            self.norm = nnx.BatchNorm(hidden, rngs=rngs)
            self.linear2 = nnx.Linear(hidden, hidden, rngs=rngs)
            self.out = nnx.Linear(hidden, classes, rngs=rngs)

        def __call__(self, x):
            x = nnx.relu(self.norm(self.linear1(x)))
            x = nnx.relu(self.linear2(x))
            return self.out(x)

    model = Model(features, hidden, classes, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def train_step(state, images, labels):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits = model(images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        _, state = nnx.split((model, optimizer))
        return state, loss

    images, labels = _classification_batch(batch, (features,), classes)
    warm_up = [_classification_batch(batch, (features,), classes, seed) for seed in (1, 2, 3)]
    (state,) = trained(train_step, (state,), warm_up)
    return train_step, (state, images, labels)


def _transformer(size: str, dropout: float):
    """A pre-norm transformer block with causal self-attention, and a batch of embeddings."""
    import jax
    import jax.numpy as jnp
    import flax.linen as nn

    batch, length, width, heads, mlp_width = pick(
        size, bench=(32, 128, 256, 4, 1024), test=(2, 8, 16, 2, 32)
    )

    class Block(nn.Module):
        heads: int
        mlp_width: int
        dropout: float

        @nn.compact
        def __call__(self, x, deterministic: bool):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
            y = nn.LayerNorm()(x)
            y = nn.MultiHeadDotProductAttention(
                num_heads=self.heads, dropout_rate=self.dropout, deterministic=deterministic
            )(y, y, mask=mask)
            x = x + nn.Dropout(self.dropout)(y, deterministic=deterministic)
            y = nn.LayerNorm()(x)
            y = nn.gelu(nn.Dense(self.mlp_width)(y))
            y = nn.Dense(x.shape[-1])(y)
            return x + nn.Dropout(self.dropout)(y, deterministic=deterministic)

    block = Block(heads, mlp_width, dropout)
    x = np.random.default_rng(0).standard_normal((batch, length, width), dtype=np.float32)
    params = block.init(jax.random.key(0), x, deterministic=True)["params"]
    return block, as_numpy(params), x


def build_transformer_forward(size: str):
    block, params, x = _transformer(size, dropout=0.1)

    def forward(params, x):
        return block.apply({"params": params}, x, deterministic=True)

    return forward, (params, x)


def build_transformer_grad_dropout(size: str):
    import jax

    block, params, x = _transformer(size, dropout=0.1)
    target = np.random.default_rng(1).standard_normal(x.shape, dtype=np.float32)

    def loss_and_grad(params, x, target, dropout_key):
        def loss_fn(params):
            y = block.apply(
                {"params": params},
                x,
                deterministic=False,
                rngs={"dropout": jax.random.wrap_key_data(dropout_key)},
            )
            return ((y - target) ** 2).mean()

        return jax.value_and_grad(loss_fn)(params)

    return loss_and_grad, (params, x, target, key_data(42))


PROGRAMS = (
    Program(
        "flax_mlp_train_adam",
        "flax",
        "linen MLP 784-512-512-10, batch 128: cross-entropy (integer labels), grad, adam update "
        "(the fourth step)",
        build_mlp_train,
    ),
    Program(
        "flax_cnn_batchnorm_train",
        "flax",
        "linen CNN (2x conv3x3+BatchNorm+relu+avg_pool, 32/64 channels) on 28x28, batch 64: "
        "TrainState step with mutable batch_stats, sgd momentum",
        build_cnn_batchnorm_train,
    ),
    Program(
        "flax_nnx_train_adam",
        "flax.nnx",
        "nnx Linear+BatchNorm+Linear+Linear 784-512-512-10, batch 128: merge, "
        "nnx.value_and_grad, nnx.Optimizer(adam) update, split (the fourth step)",
        build_nnx_train,
    ),
    Program(
        "flax_transformer_forward",
        "flax",
        "pre-norm transformer block (causal MultiHeadDotProductAttention 4 heads, LayerNorm, "
        "gelu MLP 1024), batch 32 x 128 tokens x 256",
        build_transformer_forward,
    ),
    Program(
        "flax_transformer_grad_dropout",
        "flax",
        "the transformer block's mean-squared loss and parameter gradient, dropout 0.1 "
        "(key passed as uint32 key data)",
        build_transformer_grad_dropout,
    ),
)
