"""Datasets: readers (built-in MovieLens, files a researcher brings: readers.py), the normalized tables,
leave-one-out splits."""
