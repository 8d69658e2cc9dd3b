"""The fencing benchmark of issue 6 (not packaged): see bench/README.md."""
