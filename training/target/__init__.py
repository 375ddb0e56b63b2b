"""The target model as the draft sees it: its config, its head, its layer numbering per engine, and small targets made on the spot."""
