"""A trained model answering queries: ``bigembed.load``, predict, similar, nearest neighbours."""
