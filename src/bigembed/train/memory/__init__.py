"""Partition memory: the partition store and I/O, the budget, bucket orders, edge buffers, costs."""
