"""Target model folders made on this machine: a GGUF file turned into a Hugging Face folder
(`convert`), and the registry's known targets fetched through pip, checked and cached (`registry`)."""
