"""``bigembed import``: edge lists -> an entity store and bucketed edge stores (see storage)."""
