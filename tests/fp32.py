"""Tolerances for comparing two float32 computations of the same quantity.

Two fp32 paths that do the same math (another kernel, batch shape, thread count or
reduction order) agree to a few ulps *relative to the values' magnitude*: float32's
machine epsilon is 1.19e-7, and a sum over n terms can lose about sqrt(n) of them.
A logprob near -14 then carries about 1e-5 of absolute noise, which is why a fixed
absolute tolerance with `rtol=0` flaked on a loaded machine. Every tolerance below is
relative first, with an absolute floor for values near zero, whose error follows the
magnitude of the inputs (logits of order 10) rather than of the result.
"""

# Same math, another kernel or order (trainer vs a plain forward, one rank vs two):
# 1e-5 relative is about 100 ulps.
SAME_MATH = {"rtol": 1e-5, "atol": 1e-5}

# An engine's sampled-token logprobs against an HF forward: the engine has its own
# fused kernels (RoPE, attention, RMSNorm), so the floor is 1e-4.
ENGINE_PARITY = {"rtol": 1e-5, "atol": 1e-4}
