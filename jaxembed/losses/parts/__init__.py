"""The declarations of the losses and the loss-side features, one file each (``base``: what a declaration holds);
``jaxembed.losses.table`` registers them. Nothing here imports JAX."""
