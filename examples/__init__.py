"""Example code that configs refer to by import path (configs/custom_dataset.yaml)."""
