"""What a served model takes on each GPU at a tensor-parallel size, before anything loads: the
weights per GPU, the serving engine's memory budget, the KV cache left and the tokens it holds.
Pure (:mod:`gputopo.capacity.estimate`), from a :class:`gputopo.model.footprint.ModelFootprint`."""
