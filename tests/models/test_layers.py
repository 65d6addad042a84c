"""Each convolution layout's hand-written backward pass, eagerly against tf.GradientTape
of the textbook conv(+b, ReLU) -> 2x2 max-pool, including the paths no zoo model takes
(the input gradient of a single-channel, phase-pooled layer)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from models.layers import Conv2D


@pytest.mark.parametrize(
    ("c_in", "k", "pool"),
    [(1, 3, True), (1, 5, True), (3, 3, True), (3, 5, False), (1, 3, False)],
)
def test_conv_backward_matches_gradient_tape(c_in: int, k: int, pool: bool) -> None:
    # Prepare: float64 so the comparison is tight; random values make pooling ties absent
    rng = np.random.default_rng(c_in * 10 + k)
    c_out, size = 4, 8
    x = tf.constant(rng.normal(size=(2, size, size, c_in)))
    kernel = tf.constant(rng.normal(size=(k * k * c_in, c_out)))
    bias = tf.constant(rng.normal(0, 0.5, size=(c_out,)))
    layer = Conv2D(size, size, c_in, c_out, k, relu=True, pool=pool)
    out_size = size // 2 if pool else size
    upstream = tf.constant(rng.normal(size=(2, out_size, out_size, c_out)))

    # Execute: the layer's forward and backward passes, and the textbook reference
    got_out, cache = layer.forward(x, [kernel, bias], {})
    result = layer.backward(upstream, cache, [kernel, bias], {}, tf.constant(1.0, tf.float64), need_input_grad=True)
    with tf.GradientTape() as tape:
        tape.watch([x, kernel, bias])
        z = tf.nn.relu(tf.nn.conv2d(x, tf.reshape(kernel, [k, k, c_in, c_out]), 1, "SAME") + bias)
        want_out = tf.nn.max_pool2d(z, 2, 2, "VALID") if pool else z
        loss = tf.reduce_sum(want_out * upstream)
    want_dx, want_dk, want_db = tape.gradient(loss, [x, kernel, bias])

    # Verify
    np.testing.assert_allclose(got_out.numpy(), want_out.numpy(), rtol=1e-10, atol=1e-10)
    got_dk, got_db = result.grads
    assert result.grad_in is not None and got_dk is not None and got_db is not None
    np.testing.assert_allclose(result.grad_in.numpy(), want_dx.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_dk.numpy(), want_dk.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_db.numpy(), want_db.numpy(), rtol=1e-10, atol=1e-10)
