"""``headscope bench``: what capturing attention costs, path by path (:mod:`.harness`)."""
