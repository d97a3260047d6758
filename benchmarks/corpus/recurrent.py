"""Recurrent programs in flax linen: a GRU through `nn.RNN` and an LSTM through the lifted
`nn.scan`, each as a forward pass and as a loss gradient (a sequence classifier reading the
last hidden state).

Imports numpy at module level; jax, flax and optax inside the builders.
"""

from __future__ import annotations

import numpy as np

from .program import Program, as_numpy, pick


def _sequences(size: str):
    batch, length, features, hidden, classes = pick(
        size, bench=(64, 50, 64, 256, 10), test=(4, 5, 8, 16, 10)
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, length, features), dtype=np.float32)
    labels = rng.integers(0, classes, batch).astype(np.int32)
    return x, labels, hidden, classes


def _gru_classifier(size: str):
    import jax
    import flax.linen as nn

    x, labels, hidden, classes = _sequences(size)

    class GRUClassifier(nn.Module):
        hidden: int
        classes: int

        @nn.compact
        def __call__(self, x):
            outputs = nn.RNN(nn.GRUCell(self.hidden))(x)
            return nn.Dense(self.classes)(outputs[:, -1])

    model = GRUClassifier(hidden, classes)
    params = model.init(jax.random.key(0), x)["params"]
    return model, as_numpy(params), x, labels


def _lstm_classifier(size: str):
    import jax
    import flax.linen as nn

    x, labels, hidden, classes = _sequences(size)

    class LSTMClassifier(nn.Module):
        hidden: int
        classes: int

        @nn.compact
        def __call__(self, x):
            ScanLSTM = nn.scan(
                nn.OptimizedLSTMCell,
                variable_broadcast="params",
                split_rngs={"params": False},
                in_axes=1,
                out_axes=1,
            )
            cell = ScanLSTM(self.hidden)
            carry = cell.initialize_carry(jax.random.key(0), x[:, 0].shape)
            carry, outputs = cell(carry, x)
            return nn.Dense(self.classes)(outputs[:, -1])

    model = LSTMClassifier(hidden, classes)
    params = model.init(jax.random.key(0), x)["params"]
    return model, as_numpy(params), x, labels


def _forward(make):
    def build(size: str):
        model, params, x, _ = make(size)

        def forward(params, x):
            return model.apply({"params": params}, x)

        return forward, (params, x)

    return build


def _loss_grad(make):
    def build(size: str):
        import jax
        import optax

        model, params, x, labels = make(size)

        def loss_and_grad(params, x, labels):
            def loss_fn(params):
                logits = model.apply({"params": params}, x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

            return jax.value_and_grad(loss_fn)(params)

        return loss_and_grad, (params, x, labels)

    return build


PROGRAMS = (
    Program(
        "flax_gru_rnn_forward",
        "flax",
        "nn.RNN(nn.GRUCell(256)) over 50 steps of 64 features, batch 64, Dense head on the last "
        "output",
        _forward(_gru_classifier),
    ),
    Program(
        "flax_gru_rnn_grad",
        "flax",
        "the GRU classifier's cross-entropy and parameter gradient (backward through the scan)",
        _loss_grad(_gru_classifier),
    ),
    Program(
        "flax_lstm_scan_forward",
        "flax",
        "nn.scan(nn.OptimizedLSTMCell(256)) over 50 steps of 64 features, batch 64, Dense head",
        _forward(_lstm_classifier),
    ),
    Program(
        "flax_lstm_scan_grad",
        "flax",
        "the LSTM classifier's cross-entropy and parameter gradient",
        _loss_grad(_lstm_classifier),
    ),
)
