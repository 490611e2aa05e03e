"""Hogwild workers: the trainer-side pool, the worker loop, the guard, preload, caches, gates."""
