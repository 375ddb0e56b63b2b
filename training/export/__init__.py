"""Exporting a trained draft for serving: a checkpoint read, its layout chosen, the folder written whole, and exports loaded back."""
