"""Datasets (MovieLens readers), leave-one-out splits and synthetic load-test workloads."""
