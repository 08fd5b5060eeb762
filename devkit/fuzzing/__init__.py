"""The operation fuzzer: random sequences of real Delta operations, every consumer on
both paths, every target compared with its model (:mod:`.runner`)."""
