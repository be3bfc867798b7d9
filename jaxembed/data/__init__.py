"""Data: input formats and validation, dataset store, batch plans, Grain loader."""
