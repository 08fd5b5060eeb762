"""Several service instances on one change log and one state.

* :mod:`~lakeprop.membership.slots`: a source table's ownership slot.
* :mod:`~lakeprop.membership.assignment`: what the cooperative-sticky assignor
  does with the slots when instances come and go (a model, for planning and the
  benchmarks; the live assignment is the group coordinator's).
* :mod:`~lakeprop.membership.group`: an instance's seat in the Kafka consumer
  group whose partitions are the slots, with per-slot epochs and a self-fence.
* :mod:`~lakeprop.membership.protocol`: joining under Kafka's classic or KIP-848
  group protocol, as a dynamic or a static member.
* :mod:`~lakeprop.membership.members`: who is in the group, for ``lakeprop members``.
"""
