"""How a target pass runs and how fast: the runner contract (`runners.Runner`, `as_runner`) and the runners
(HF, lean with its native C++ pass, static-shape, frozen-compiled, batched), their kernels, and machine facts."""
