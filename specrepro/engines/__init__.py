"""How a target pass runs and how fast: the runners (HF, lean, static-shape), their kernels, the one cost
measurement, machine facts, and `tune`, which measures them on this machine and picks the fastest exact one."""
