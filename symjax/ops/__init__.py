"""Kernels: the computations the model's layers call, apart from the layers themselves.

- ``attention``: explicit, fused (XLA / cuDNN), blocked (sliding windows) and relational attention.
- ``channels``: the ``[..., heads, head_dim]`` channel layout.
- ``dense``: a dense layer's x W + b, with the bias's gradient where the backend sums it fastest.
- ``projection``: the vocabulary projection α = softmax(z Eᵀ / τ), α E (direct, streamed, cuDNN).
- ``streamed``: vocabulary-sized softmaxes streamed over chunks and sharded over the 'vocab' mesh axis.
- ``readout``: logits h Eᵀ and the per-token loss and rank statistics, direct or streamed.
- ``scoring``: those statistics' weighted sums over a batch and the summary of a split.
"""
