"""The native C++ kernels: the build, one ctypes mirror of their ABI, the step and the eval."""
