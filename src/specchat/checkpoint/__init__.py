"""Model assembly: a model built from its checkpoint (the skeleton on the meta device, its tensors
read one at a time by the names the model gives them), its decoder layers' layout in one buffer and
the layer file that holds them. Below models/, plan/ and offload/, which build on it."""
