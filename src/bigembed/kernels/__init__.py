"""How one batch is computed: the eager step, row Adagrad, whole-table updates, native kernels."""
