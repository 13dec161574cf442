"""Reading finished runs back: metrics.json and TensorBoard scalars."""
