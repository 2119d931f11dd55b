"""One file per architecture, named after the checkpoint's `model_type`."""
