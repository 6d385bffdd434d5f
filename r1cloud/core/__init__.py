"""The bottom layer: what every other layer may import, torch-free at import time — dtypes, model
families, the shapes of data rows, records read back from files, the estimator table, the budget,
accelerator names and paths as a user writes them."""
