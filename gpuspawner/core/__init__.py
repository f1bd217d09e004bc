"""The model (an offering and its parts) and the pure helpers it is built from: node classes, the scheduler's fit, CEL, windows, wording. Pure."""
