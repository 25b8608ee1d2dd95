"""nblib: the capture-corruption investigation suite's library (see README.md)."""
