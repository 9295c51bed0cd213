"""Checkpoints: footprint math, catalog of step folders, strip to BF16 safetensors, upload, save."""
