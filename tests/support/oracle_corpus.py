"""Real programs whose cache, written twice by fresh processes, is the oracle corpus.

Run by tests/e2e/test_oracle.py as ``python oracle_corpus.py`` with JAX_COMPILATION_CACHE_DIR set,
8 host devices and every compile cached. Each block is what users write: flax linen and nnx
training steps with optax, a small transformer, a scan RNN, remat, per-example gradients,
sharding with donation and shard_map, low-precision dtypes and PRNG key types, custom_vjp,
host callbacks, LAPACK, equinox, a diffrax ODE solve, eager ops.
"""

import functools

import diffrax
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

key = jax.random.key(0)


# flax linen + optax
class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(16)(x))
        return nn.Dense(4)(x)


mlp = MLP()
x = jnp.ones((8, 8))
params = mlp.init(jax.random.key(1), x)
tx = optax.adam(1e-3)
opt_state = tx.init(params)


@jax.jit
def linen_step(params, opt_state, x):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean(mlp.apply(p, x) ** 2))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


for _ in range(2):
    params, opt_state, loss = linen_step(params, opt_state, x)


# flax nnx + optax
class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x):
        return self.lin(x)


model = Tiny(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)


@nnx.jit
def nnx_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return loss


nnx_step(model, optimizer, x)


# a small transformer block (attention + MLP), bf16 activations
def attention(q, k, v):
    w = jax.nn.softmax(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]), axis=-1)
    return w @ v


@jax.jit
def transformer(w, h):
    q, k, v = (h @ w[i] for i in range(3))
    h = h + attention(q, k, v)
    return h + jax.nn.gelu(h @ w[3]).astype(jnp.bfloat16).astype(h.dtype)


transformer(jnp.ones((4, 16, 16)), jnp.ones((2, 8, 16)))


# a scan RNN with remat and its gradient
@jax.jit
def rnn_loss(w, xs):
    @jax.checkpoint
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h

    _, hs = jax.lax.scan(cell, jnp.zeros(8), xs)
    return jnp.sum(hs**2)


jax.grad(rnn_loss)(jnp.eye(8), jnp.ones((5, 8)))


# per-example gradients via vmap
per_example = jax.jit(jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.sin(w * x))), in_axes=(None, 0)))
per_example(jnp.ones(3), jnp.ones((4, 3)))

# 8-device sharding with donation, and shard_map
mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
sharded = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", "model")))


@functools.partial(jax.jit, donate_argnums=0)
def donate(a):
    return a * 2 + 1


donate(sharded)


@jax.jit
def smap(a):
    f = jax.shard_map(
        lambda b: jax.lax.psum(b, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
    return f(a)


smap(jnp.arange(32.0).reshape(8, 4))


# dtypes and PRNG key types
@jax.jit
def mixed(a, b, c):
    return (a.astype(jnp.float32) + b.astype(jnp.float32)).sum() + c.sum()


mixed(jnp.ones(4, jnp.bfloat16), jnp.ones(4, jnp.float16), jnp.ones(4, jnp.int8))
jax.jit(lambda k: jax.random.normal(k, (3,)))(jax.random.key(2))
jax.jit(lambda k: jax.random.uniform(k, (3,)))(jax.random.PRNGKey(3))
jax.jit(lambda k: jax.random.bits(k, (2,)))(jax.random.key(4, impl="rbg"))


# custom_vjp
@jax.custom_vjp
def clip_grad(x):
    return x


clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))
jax.jit(jax.grad(lambda x: jnp.sum(clip_grad(x) * 10)))(jnp.ones(3))


# host callbacks: JAX never stores these modules
@jax.jit
def with_callbacks(a):
    jax.debug.print("a={a}", a=a.sum())
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(a.shape, a.dtype), a)


with_callbacks(jnp.ones(3))

# LAPACK through jnp.linalg
spd = jnp.eye(4) * 2 + 0.1
jax.jit(lambda m: (jnp.linalg.cholesky(m), jnp.linalg.eigh(m)[0], jnp.linalg.solve(m, m[0])))(spd)

# equinox
eqx_model = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.key(5))
eqx.filter_jit(lambda m, v: m(v))(eqx_model, jnp.ones(4))


# a diffrax ODE solve
@jax.jit
def solve(y0):
    term = diffrax.ODETerm(lambda t, y, args: -y)
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0, t1=1.0, dt0=0.1, y0=y0)
    return sol.ys


solve(jnp.ones(2))

# eager ops
(jnp.arange(10.0) * 3).sum().block_until_ready()
jnp.concatenate([jnp.ones(3), jnp.zeros(2)]).block_until_ready()
print("result: done")
