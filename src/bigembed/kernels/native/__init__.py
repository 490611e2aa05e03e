"""The native C++ kernels: build and load, the one ctypes mirror of their ABI, a run's choice of
kernel, the step and the eval."""
