"""The report run as registered stages: the contract (:mod:`.base`), the registry
(:mod:`.registry`), one module per stage, and the run (:mod:`.runner`)."""
