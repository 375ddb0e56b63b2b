"""The row layer under mix/ and traffic/: the mix row and its files, readers of local and Hub sources, the row formats, shingles and token counts."""
