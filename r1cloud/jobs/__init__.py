"""Jobs: the store of what ran where, and the backends that start, watch and stop them."""
