"""Probabilistic programs: numpyro log densities with their gradients (eight schools,
non-centred; a Bayesian logistic regression) and one blackjax HMC or NUTS transition per call
on a logistic-regression posterior.

The samplers are written as the blackjax documentation writes them: the data closed over by
the log density, `state = algorithm.init(position)` once, then `algorithm.step(key, state)`
under jit; the key crosses the call as uint32 key data. Imports numpy at module level; jax,
numpyro and blackjax inside the builders.
"""

from __future__ import annotations

import numpy as np

from .program import Program, as_numpy, key_data, pick

SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)


def build_eight_schools(size: str):
    import jax
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer.reparam import TransformReparam
    from numpyro.infer.util import initialize_model, potential_energy

    # One size: the data set is the one people run.
    y, sigma = pick(size, bench=(SCHOOLS_Y, SCHOOLS_SIGMA), test=(SCHOOLS_Y, SCHOOLS_SIGMA))

    def eight_schools(J, sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", J):
            with numpyro.handlers.reparam(config={"theta": TransformReparam()}):
                theta = numpyro.sample(
                    "theta",
                    dist.TransformedDistribution(
                        dist.Normal(0.0, 1.0), dist.transforms.AffineTransform(mu, tau)
                    ),
                )
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    J = len(y)

    def potential_and_grad(params, sigma, y):
        def potential(params):
            return potential_energy(eight_schools, (J, sigma), {"y": y}, params)

        return jax.value_and_grad(potential)(params)

    info = initialize_model(
        jax.random.key(0), eight_schools, model_args=(J, sigma), model_kwargs={"y": y}
    )
    return potential_and_grad, (as_numpy(info.param_info.z), sigma, y)


def _logistic_data(size: str, seed: int = 0):
    """Features and 0/1 labels drawn from a logistic model with random coefficients."""
    points, features = pick(size, bench=(256, 64), test=(16, 4))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((points, features), dtype=np.float32)
    true_w = (rng.standard_normal(features) / np.sqrt(features)).astype(np.float32)
    y = (rng.random(points) < 1.0 / (1.0 + np.exp(-(x @ true_w)))).astype(np.int32)
    return x, y


def build_logistic_regression(size: str):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer.util import log_density

    def logistic_regression(x, y=None):
        w = numpyro.sample("w", dist.Normal(jnp.zeros(x.shape[1]), 1.0).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)

    def log_joint_and_grad(params, x, y):
        def log_joint(params):
            return log_density(logistic_regression, (x,), {"y": y}, params)[0]

        return jax.value_and_grad(log_joint)(params)

    x, y = _logistic_data(size)
    params = {"w": np.full(x.shape[1], 0.1, np.float32), "b": np.float32(-0.2)}
    return log_joint_and_grad, (as_numpy(params), x, y)


def _posterior(size: str):
    """The logistic-regression log density (standard normal prior), its data closed over."""
    import jax
    import jax.numpy as jnp

    x, y = _logistic_data(size, seed=1)
    x, y = jnp.asarray(x), jnp.asarray(y, jnp.float32)

    def logdensity(w):
        logits = x @ w
        prior = jax.scipy.stats.norm.logpdf(w).sum()
        likelihood = y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits)
        return prior + likelihood.sum()

    return logdensity, x.shape[1]


def _sampler_step(make_algorithm):
    def build(size: str):
        import jax
        import jax.numpy as jnp

        logdensity, dimension = _posterior(size)
        algorithm = make_algorithm(logdensity, jnp.ones(dimension))
        state = algorithm.init(jnp.full(dimension, 0.1, jnp.float32))

        def step(key, state):
            return algorithm.step(jax.random.wrap_key_data(key), state)

        return step, (key_data(7), as_numpy(state))

    return build


def _hmc(logdensity, inverse_mass_matrix):
    import blackjax

    return blackjax.hmc(logdensity, step_size=0.02, inverse_mass_matrix=inverse_mass_matrix,
                        num_integration_steps=16)


def _nuts(logdensity, inverse_mass_matrix):
    import blackjax

    return blackjax.nuts(logdensity, step_size=0.05, inverse_mass_matrix=inverse_mass_matrix)


PROGRAMS = (
    Program(
        "numpyro_eight_schools_grad",
        "numpyro",
        "non-centred eight schools (TransformReparam): potential_energy and its gradient in "
        "the unconstrained space",
        build_eight_schools,
    ),
    Program(
        "numpyro_logistic_regression_grad",
        "numpyro",
        "Bayesian logistic regression, 256 points x 64 features: log_density and its gradient",
        build_logistic_regression,
    ),
    Program(
        "blackjax_hmc_step",
        "blackjax",
        "one blackjax.hmc transition (16 leapfrog steps, a fori_loop) on a logistic-regression "
        "posterior, 256 points x 64 features",
        _sampler_step(_hmc),
    ),
    Program(
        "blackjax_nuts_step",
        "blackjax",
        "one blackjax.nuts transition (tree doubling in while loops, up to 10 doublings) on "
        "the logistic-regression posterior",
        _sampler_step(_nuts),
    ),
)
