"""Layers with hand-written backward passes built from TFLite builtin ops only.

Why this module exists
----------------------
A train step written with ``tf.GradientTape`` converts to TFLite ops that need the
Flex (TF Select) delegate -- ``ReluGrad``, ``Conv2DBackpropFilter``,
``SparseSoftmaxCrossEntropyWithLogits`` -- and no pip wheel for boards ships those
kernels. Every layer here therefore computes its own gradients with ops that convert
to TFLite *builtins*: ``FULLY_CONNECTED``, ``BATCH_MATMUL``, ``STRIDED_SLICE``,
``CONCATENATION``, ``PAD``, ``RESHAPE``, ``SELECT_V2``, ``EQUAL``, ``GREATER``,
``MAX_POOL_2D``, ``RESIZE_NEAREST_NEIGHBOR``, ``SUM``, ``SOFTMAX``, ``ONE_HOT``.

Performance choices (measured in ``bench/train_throughput.py``, see docs/results.md)
------------------------------------------------------------------------------------
* Every shape that depends on the batch uses ``-1`` in a constant reshape, never
  ``tf.shape(x)``: the interpreter then knows every intermediate shape at
  ``allocate_tensors`` time and XNNPACK can take the ops; a value-dependent shape
  would make tensors dynamic and push ops onto slow reference kernels.
* A convolution is an explicit im2col (static strided slices and concatenations)
  followed by one matrix product. The patch matrix is computed once in the forward
  pass and reused for the filter gradient, so the filter gradient is a single
  matmul instead of a separate backprop-filter kernel. A single-channel input keeps
  its patches as ``[N, taps, H*W]`` instead (:func:`_taps`). The input gradient sums
  the width taps in one product and the height taps by ``k`` pads and adds
  (:meth:`Conv2D._input_gradient`); it never builds the patch matrix of ``dz``.
* Weights are read once per step (``Variable.read_value``) and written once
  (``assign(w + delta)``): ``assign_sub`` would read the variable a second time,
  a full copy of every tensor per step. The learning rate is folded into the small
  output-gradient tensor before the weight-gradient product, so the large tensors
  see one ``ADD`` and no ``MUL``.
* Dense weights are stored ``[out, in]``, the native ``FULLY_CONNECTED`` layout,
  so the forward pass needs no transpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from models.quiet_tf import tf  # TensorFlow is imported when a layer first builds its graph

Tensor = Any  # tf.Tensor; tensorflow ships no usable static types


@dataclass(frozen=True)
class ParamSpec:
    """One trainable tensor of a layer: its name, shape and initial scale."""

    name: str
    shape: tuple[int, ...]
    init: str  # "glorot" or "zeros"
    fan_in: int = 1
    fan_out: int = 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def initial_value(self, rng: np.random.Generator) -> np.ndarray:
        """Glorot-uniform for weights (Keras' default), zeros for biases."""
        if self.init == "zeros":
            return np.zeros(self.shape, np.float32)
        limit = np.sqrt(6.0 / (self.fan_in + self.fan_out))
        return rng.uniform(-limit, limit, self.shape).astype(np.float32)


def positive_mask(x: Tensor) -> Tensor:
    """1.0 where ``x > 0`` else 0.0, with ops XNNPACK runs (``ceil(min(relu(x), 1))``).

    Exact: for ``x > 0`` the minimum lies in ``(0, 1]`` and rounds up to 1; for
    ``x <= 0`` it is 0. ``tf.where``/``SELECT_V2`` would fall back to a reference kernel.
    """
    return tf.math.ceil(tf.minimum(tf.nn.relu(x), 1.0))


@dataclass
class Backward:
    """What a layer's backward pass returns.

    ``grads`` holds ``scale`` times each parameter gradient (``None`` for a kernel
    whose update is deferred); ``factors`` holds that deferred update as two
    low-rank factors ``(u_t, v)`` with ``scale * dL/dW = u_t @ v``.
    """

    grad_in: Tensor | None
    grads: list[Tensor | None]
    factors: tuple[Tensor, Tensor] | None = None


class Layer:
    """A layer: parameters, optional state buffers, forward and backward passes."""

    def params(self, prefix: str) -> list[ParamSpec]:
        return []

    def buffers(self, prefix: str) -> list[ParamSpec]:
        """Non-trainable state (zeros initially); not part of the flat weights.

        The last ``/``-separated part of each name is the key under which
        ``forward`` and ``backward`` find the buffer in their ``state``.
        """
        return []

    def mirrors(self, prefix: str) -> list[tuple[ParamSpec, int]]:
        """Transposed copies of parameters, as ``(spec, index into params)``.

        A mirror always equals the transpose of its parameter: every signature
        that writes the parameter writes the mirror too. Like buffers, mirrors
        reach ``forward``/``backward`` in ``state`` under their name's last part.
        """
        return []

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        raise NotImplementedError

    def forward(self, x: Tensor, weights: list[Tensor], state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError

    def backward(
        self,
        grad_out: Tensor,
        cache: dict[str, Tensor],
        weights: list[Tensor],
        state: dict[str, Tensor],
        scale: Tensor,
        need_input_grad: bool,
        defer: bool = False,
    ) -> Backward:
        """Input gradient and ``scale`` times each parameter gradient.

        ``scale`` is folded into the smallest tensor of each product (``-lr`` in a
        train step, ``1`` when gradients are wanted), see the module docstring.
        """
        raise NotImplementedError


class Dense(Layer):
    """Fully connected layer ``z = x @ W^T + b`` with ``W`` stored ``[out, in]``.

    With ``deferred_rank = R > 0`` the layer can defer its SGD updates: one step's
    update ``-lr * dz^T x`` has rank ``B`` (the batch), so up to ``R`` rows of
    pending updates are kept as factors ``U^T`` (``[out, R]``) and ``V``
    (``[R, in]``), and the effective weight is ``W_eff = W + U^T V``. Forward and
    backward use ``W_eff`` through two thin products, so training is exactly SGD,
    while the large ``W`` is written only when the factors are folded in
    (``flush``). For the 3136x2048 layer of the FEMNIST CNN this removes a 26 MB
    add and a 26 MB variable write from every step.

    With ``mirror=True`` the model also keeps ``W^T`` (``kernel_t``) and computes the
    input gradient as ``(W^T dz^T)^T``, so XNNPACK streams the mirror instead of
    repacking ``W`` on every step (docs/models.md, "The kernel mirror").
    """

    def __init__(self, n_in: int, n_out: int, relu: bool, deferred_rank: int = 0, mirror: bool = False) -> None:
        self.n_in, self.n_out, self.relu, self.deferred_rank = n_in, n_out, relu, deferred_rank
        self.mirror = mirror

    def params(self, prefix: str) -> list[ParamSpec]:
        return [
            ParamSpec(f"{prefix}/kernel", (self.n_out, self.n_in), "glorot", self.n_in, self.n_out),
            ParamSpec(f"{prefix}/bias", (self.n_out,), "zeros"),
        ]

    def buffers(self, prefix: str) -> list[ParamSpec]:
        if not self.deferred_rank:
            return []
        return [
            ParamSpec(f"{prefix}/pending_out", (self.n_out, self.deferred_rank), "zeros"),
            ParamSpec(f"{prefix}/pending_in", (self.deferred_rank, self.n_in), "zeros"),
        ]

    def mirrors(self, prefix: str) -> list[tuple[ParamSpec, int]]:
        if not self.mirror:
            return []
        return [(ParamSpec(f"{prefix}/kernel_t", (self.n_in, self.n_out), "glorot", self.n_in, self.n_out), 0)]

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (self.n_out,)

    def effective_kernel(self, kernel: Tensor, state: dict[str, Tensor]) -> Tensor:
        """``W + U^T V`` (only needed to read or fold in the weights)."""
        if "pending_out" not in state:
            return kernel
        return kernel + tf.matmul(state["pending_out"], state["pending_in"])

    def forward(self, x: Tensor, weights: list[Tensor], state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        kernel, bias = weights
        # z^T = W @ x^T as a rank-3 BATCH_MATMUL: XNNPACK streams W as the left
        # operand without repacking it, on every thread. The obvious x @ W^T would
        # convert to FULLY_CONNECTED, whose kernel for non-constant weights is a
        # single-threaded Eigen path that repacks W each step (docs/models.md, "What made
        # it fast").
        x3 = tf.reshape(x, [1, -1, self.n_in])
        z_t = tf.matmul(kernel, x3, transpose_b=True)
        if "pending_out" in state:
            pending_out, pending_in = state["pending_out"], state["pending_in"]
            z_t = z_t + tf.matmul(pending_out, tf.matmul(pending_in, x3, transpose_b=True))
        z = tf.transpose(tf.reshape(z_t, [self.n_out, -1])) + bias
        if self.relu:
            return tf.nn.relu(z), {"x": x, "active": positive_mask(z)}
        return z, {"x": x}

    def backward(
        self,
        grad_out: Tensor,
        cache: dict[str, Tensor],
        weights: list[Tensor],
        state: dict[str, Tensor],
        scale: Tensor,
        need_input_grad: bool,
        defer: bool = False,
    ) -> Backward:
        kernel, _ = weights
        dz = grad_out * cache["active"] if self.relu else grad_out
        scaled = dz * scale
        grad_bias = tf.reduce_sum(scaled, axis=0)
        grad_in = None
        if need_input_grad:
            if "kernel_t" in state:
                # dx^T = W^T dz^T with the mirror as the streamed left operand: XNNPACK
                # would otherwise repack all of W for dz @ W on every step.
                dx_t = tf.matmul(state["kernel_t"], tf.reshape(dz, [1, -1, self.n_out]), transpose_b=True)
                grad_in = tf.transpose(tf.reshape(dx_t, [self.n_in, -1]))
            else:
                grad_in = tf.matmul(dz, kernel)
            if "pending_out" in state:
                pending_out, pending_in = state["pending_out"], state["pending_in"]
                grad_in = grad_in + tf.matmul(tf.matmul(dz, pending_out), pending_in)
        if defer and self.deferred_rank:
            return Backward(grad_in, [None, grad_bias], (tf.transpose(scaled), cache["x"]))
        grad_kernel = tf.matmul(scaled, cache["x"], transpose_a=True)
        return Backward(grad_in, [grad_kernel, grad_bias])


def _im2col(x_padded: Tensor, k: int, height: int, width: int) -> Tensor:
    """Patches of a padded NHWC tensor: ``[N, H, W, k*k*C]``, tap-major.

    The tap order (kh, kw, c) matches a ``[k, k, C, out]`` kernel reshaped to
    ``[k*k*C, out]``. Built in two passes of ``k``-way concatenations (the ``k``
    horizontal shifts, then the ``k`` vertical shifts of that): XNNPACK runs a
    concatenation of a few inputs on all threads, while a single ``k*k``-way one
    fell back to TFLite's single-threaded kernel (docs/models.md, "What made it fast").
    """
    rows = tf.concat([x_padded[:, :, j : j + width, :] for j in range(k)], axis=-1)
    return tf.concat([rows[:, i : i + height, :, :] for i in range(k)], axis=-1)


def _taps(x_padded: Tensor, k: int, height: int, width: int) -> Tensor:
    """Patches of a padded single-channel NHWC tensor as ``[N, k*k, H*W]``, tap-major.

    For one input channel the ``[N, H, W, k*k]`` layout of :func:`_im2col` is built by
    concatenations of one-float-wide slices, which XNNPACK copies element by element.
    With the taps on their own axis every copy moves whole image rows instead, faster
    even with the transpose (docs/models.md, "The MNIST CNN at batch 32"), and the
    filter gradient can use the patches as the streamed left operand of a per-sample
    product without any transpose.
    """
    x3 = tf.reshape(x_padded, [-1, height + k - 1, width + k - 1])
    # concatenation of reshaped slices, not tf.stack: PACK has no XNNPACK kernel, and a
    # partition boundary there made the FEMNIST CNN copy its 26 MB kernel every step
    rows = tf.concat([tf.reshape(x3[:, :, j : j + width], [-1, 1, height + k - 1, width]) for j in range(k)], axis=1)
    taps = tf.concat([rows[:, :, i : i + height, :] for i in range(k)], axis=1)  # [N, k*k, H, W]: (i, j)
    return tf.reshape(taps, [-1, k * k, height * width])


def _pool_phase_order(taps: Tensor, height: int, width: int) -> Tensor:
    """Reorder the positions of ``[N, taps, H*W]`` patches as ``(a, b, h', w')``.

    Position ``(2h' + a, 2w' + b)`` moves to phase ``(a, b)``, so a convolution computed
    from these patches comes out as ``[N, 4, H*W/4, out]``: the 2x2 pooling window of
    output ``(h', w')`` is the phase axis. Pooling is then a max over that axis and its
    backward pass a broadcast over it, with no upsampling (see ``Conv2D``).
    """
    n_taps = taps.shape[1]
    grid = tf.reshape(taps, [-1, height // 2, 2, width // 2, 2])  # [N*taps, h', a, w', b]
    phases = tf.transpose(grid, [0, 2, 4, 1, 3])  # [N*taps, a, b, h', w']
    return tf.reshape(phases, [-1, n_taps, height * width])


def _from_pool_phase_order(t: Tensor, height: int, width: int, channels: int) -> Tensor:
    """The inverse of :func:`_pool_phase_order` for ``[N, 4, H*W/4, C]`` activations."""
    grid = tf.reshape(t, [-1, 2, 2, height // 2, width // 2, channels])  # [N, a, b, h', w', C]
    return tf.reshape(tf.transpose(grid, [0, 3, 1, 4, 2, 5]), [-1, height, width, channels])


def _upsample2(t: Tensor) -> Tensor:
    """Nearest-neighbour 2x upsampling of NHWC by two 2-way concatenations and
    reshapes (``RESIZE_NEAREST_NEIGHBOR`` has no XNNPACK kernel)."""
    _, h, w, c = t.shape
    wide = tf.reshape(tf.concat([t, t], axis=-1), [-1, h, 2 * w, c])
    return tf.reshape(tf.concat([wide, wide], axis=2), [-1, 2 * h, 2 * w, c])


class Conv2D(Layer):
    """Stride-1 'same' convolution with an odd square kernel, optionally followed by
    2×2 max pooling, then the bias and an optional ReLU.

    The kernel is stored as ``[k*k*C_in, C_out]`` (the im2col matrix layout); the
    manifest reports that shape. ``forward`` is ``act(pool(im2col(pad(x)) @ K) + b)``.
    With ``pool=True`` this is the textbook conv(+b, ReLU) → max-pool, reordered: a
    per-channel bias and a monotonic ReLU both commute with a max, so applying them
    after the pool does a quarter of their work on a quarter of the memory.

    Pooling backward: the pooled tensor, upsampled by nearest neighbour, is compared
    with the convolution's output; the gradient flows to every position equal to its
    window's max. Ties inside a window happen only at exactly equal values.
    """

    def __init__(self, height: int, width: int, c_in: int, c_out: int, k: int, relu: bool, pool: bool = False) -> None:
        if k % 2 != 1:
            raise ValueError(f"Conv2D needs an odd kernel size, got {k}")
        if pool and (height % 2 or width % 2):
            raise ValueError(f"2x2 pooling needs even height and width, got {height}x{width}")
        self.h, self.w, self.c_in, self.c_out, self.k, self.relu = height, width, c_in, c_out, k, relu
        self.pool = pool
        # A single-channel input's patches are small ([N, k*k, H*W]), so reordering them
        # into pooling phases is cheap, and it spares the two upsamplings of the
        # full-resolution pooling backward pass (docs/models.md, "The MNIST CNN at batch
        # 32"). For wider inputs the patch matrix is k*k*C_in wide, and reordering it
        # would cost more than the upsamplings.
        self._phase_pooling = pool and c_in == 1

    def params(self, prefix: str) -> list[ParamSpec]:
        taps = self.k * self.k * self.c_in
        return [
            ParamSpec(f"{prefix}/kernel", (taps, self.c_out), "glorot", taps, self.k * self.k * self.c_out),
            ParamSpec(f"{prefix}/bias", (self.c_out,), "zeros"),
        ]

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.pool:
            return (self.h // 2, self.w // 2, self.c_out)
        return (self.h, self.w, self.c_out)

    def _pad(self, x: Tensor) -> Tensor:
        p = self.k // 2
        return tf.pad(x, [[0, 0], [p, p], [p, p], [0, 0]])

    def forward(self, x: Tensor, weights: list[Tensor], state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        kernel, bias = weights
        cache: dict[str, Tensor] = {}
        if self._phase_pooling:
            # patches in pooling-phase order: z is [N, 4, H*W/4, out], pooled over axis 1
            taps = _pool_phase_order(_taps(self._pad(x), self.k, self.h, self.w), self.h, self.w)
            cache["taps"] = taps
            cols = tf.reshape(tf.transpose(taps, [0, 2, 1]), [-1, 4, self.h * self.w // 4, self.k * self.k])
        elif self.c_in == 1:
            taps = _taps(self._pad(x), self.k, self.h, self.w)
            cache["taps"] = taps
            cols = tf.reshape(tf.transpose(taps, [0, 2, 1]), [-1, self.h, self.w, self.k * self.k])
        else:
            cols = _im2col(self._pad(x), self.k, self.h, self.w)
            cache["cols"] = cols
        z = tf.matmul(cols, kernel)  # [N, H, W, taps] @ [taps, out]: no reshape copy
        if self.pool:
            cache["conv"] = z
            if self._phase_pooling:
                z = tf.nn.max_pool2d(z, [4, 1], [4, 1], "VALID")  # [N, 1, H*W/4, out]
                cache["pooled"] = z
                z = tf.reshape(z, [-1, self.h // 2, self.w // 2, self.c_out])
            else:
                z = tf.nn.max_pool2d(z, 2, 2, "VALID")
                cache["pooled"] = z
        z = z + bias
        if self.relu:
            cache["active"] = positive_mask(z)
            z = tf.nn.relu(z)
        return z, cache

    def _input_gradient(self, dz: Tensor, kernel: Tensor) -> Tensor:
        """``dL/dx`` of the 'same' convolution from ``dz`` (``[N, H, W, C_out]``).

        ``dx[a, b] = sum_{i,j} dz[a+p-i, b+p-j] @ K[i, j]^T``. The ``j`` (width) sum is
        folded into one product: the ``k`` width-shifted copies of ``dz`` side by side
        (``[N, H, W, k*C_out]``) times a ``[k*C_out, k*C_in]`` rearrangement of ``K``
        gives, for every row tap ``i``, its contribution before the height shift; the
        ``k`` height shifts are then ``k`` pads and adds. The full col2im of
        ``dz @ K^T`` (a ``k*k*C_in``-wide product scattered back by ``k*k`` pads and
        adds of whole canvases) was slower: its adds streamed ``k*k`` canvases instead
        of ``k`` (docs/models.md, "The MNIST CNN at batch 32").
        """
        k, c_in, c_out, p = self.k, self.c_in, self.c_out, self.k // 2
        dz_wide = tf.pad(dz, [[0, 0], [0, 0], [p, p], [0, 0]])
        # width tap j reads dz at column b + p - j, i.e. dz_wide at b + 2p - j
        shifted = tf.concat([dz_wide[:, :, k - 1 - j : k - 1 - j + self.w, :] for j in range(k)], axis=-1)
        # by_row[(j, o), (i, c)] = K[i, j, c, o]; rank 4 so the converter emits BATCH_MATMUL
        by_row = tf.transpose(tf.reshape(kernel, [k, k, c_in, c_out]), [1, 3, 0, 2])
        per_row = tf.matmul(shifted, tf.reshape(by_row, [1, 1, k * c_out, k * c_in]))  # [N, H, W, (i, c)]
        grad_in: Tensor | None = None
        for i in range(k):
            # row tap i sends per_row[a'] to dx[a' - p + i]: shift by i - p, clipped to H
            shift = i - p
            lo, hi = max(0, -shift), self.h - max(0, shift)
            part = per_row[:, lo:hi, :, i * c_in : (i + 1) * c_in]
            part = tf.pad(part, [[0, 0], [max(0, shift), max(0, -shift)], [0, 0], [0, 0]])
            grad_in = part if grad_in is None else grad_in + part
        return grad_in

    def backward(
        self,
        grad_out: Tensor,
        cache: dict[str, Tensor],
        weights: list[Tensor],
        state: dict[str, Tensor],
        scale: Tensor,
        need_input_grad: bool,
        defer: bool = False,
    ) -> Backward:
        kernel, _ = weights
        dz = grad_out * cache["active"] if self.relu else grad_out
        grad_bias = tf.reduce_sum(tf.reshape(dz, [-1, self.c_out]), axis=0) * scale
        if self.pool:
            # gap = upsample(pooled) - conv >= 0, and == 0 exactly at each window's
            # maxima, so relu(1 - ceil(gap)) is 1 there and 0 elsewhere: three ops
            # (the relu fuses into the subtraction) on the full-resolution tensors.
            # In phase order the upsampling is a broadcast over the phase axis.
            if self._phase_pooling:
                gap = cache["pooled"] - cache["conv"]
                dz = tf.reshape(dz, [-1, 1, self.h * self.w // 4, self.c_out])
            else:
                gap = _upsample2(cache["pooled"]) - cache["conv"]
                dz = _upsample2(dz)
            dz = dz * tf.nn.relu(1.0 - tf.math.ceil(gap))
        # One [taps, H*W] @ [H*W, out] product per sample, summed over the batch. As
        # one [taps, N*H*W] @ [N*H*W, out] product the whole patch matrix is
        # transposed at once and each output tile streams all of dz from L3; per
        # sample both stay in L2 (faster for the MNIST CNN at batch 32, no change for
        # the FEMNIST CNN: docs/models.md, "The MNIST CNN at batch 32" and "Tried and
        # rejected"). Single-channel patches are already [N, taps, H*W]. The scale
        # multiplies the small [taps, out] result.
        dz_per_sample = tf.reshape(dz, [-1, self.h * self.w, self.c_out])
        if "taps" in cache:
            per_sample = tf.matmul(cache["taps"], dz_per_sample)
        else:
            cols = tf.reshape(cache["cols"], [-1, self.h * self.w, self.k * self.k * self.c_in])
            per_sample = tf.matmul(cols, dz_per_sample, transpose_a=True)
        grad_kernel = tf.reduce_sum(per_sample, axis=0) * scale
        grad_in = None
        if need_input_grad:  # (the zoo's phase-pooled layers come first and need none)
            if self._phase_pooling:
                dz = _from_pool_phase_order(dz, self.h, self.w, self.c_out)
            grad_in = self._input_gradient(dz, kernel)
        return Backward(grad_in, [grad_kernel, grad_bias])


class Reshape(Layer):
    """Reshape the per-sample shape (the batch dimension stays ``-1``)."""

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        if int(np.prod(in_shape)) != int(np.prod(out_shape)):
            raise ValueError(f"cannot reshape {in_shape} to {out_shape}")
        self.in_shape, self.out_shape = in_shape, out_shape

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return self.out_shape

    def forward(self, x: Tensor, weights: list[Tensor], state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        return tf.reshape(x, [-1, *self.out_shape]), {}

    def backward(
        self,
        grad_out: Tensor,
        cache: dict[str, Tensor],
        weights: list[Tensor],
        state: dict[str, Tensor],
        scale: Tensor,
        need_input_grad: bool,
        defer: bool = False,
    ) -> Backward:
        return Backward(tf.reshape(grad_out, [-1, *self.in_shape]), [])


def softmax_cross_entropy(logits: Tensor, labels: Tensor, n_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Mean softmax cross-entropy, its gradient w.r.t. the logits, and the correct count.

    ``loss = mean_i(logsumexp(z_i) - z_i[y_i])``; ``dloss/dz = (softmax(z) - onehot(y)) / n``.
    """
    one_hot = tf.one_hot(labels, n_classes, dtype=tf.float32)
    n = tf.cast(tf.shape(labels)[0], tf.float32)
    loss = -tf.reduce_sum(tf.nn.log_softmax(logits) * one_hot) / n
    grad = (tf.nn.softmax(logits) - one_hot) / n
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), labels), tf.float32))
    return loss, grad, correct
