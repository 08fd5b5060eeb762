"""The benchmark suite: lakeprop and its baseline side by side, in one process."""
