"""Moving checkpoints between bigembed and other systems (PyTorch-BigGraph)."""
