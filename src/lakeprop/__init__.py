"""lakeprop: change propagation for the lakehouse."""
