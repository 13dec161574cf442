"""`mtl-bench report`: tables, Δm and plots from finished runs."""
