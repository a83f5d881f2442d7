"""One module per model family; each exports ``SPECS: list[ModelSpec]``."""
