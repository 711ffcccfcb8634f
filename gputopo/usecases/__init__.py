"""Use cases: one module per thing an operator does, each a typed request in and its versioned document out (or a GputopoError)."""
