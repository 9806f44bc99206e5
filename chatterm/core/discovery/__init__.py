"""The GGUF models already on this machine, where Ollama, LM Studio, the
Hugging Face hub cache and models.toml's folders keep them.

Read-only: a store is listed in place (nothing is copied, moved or written
there) and of a GGUF only the header is read. `listing` lists every model
with its header facts (`gguf_facts`, read by llama.cpp's own GGUF reader
through `gguf_header`, cached by `facts_cache`) and whether it fits this
machine (`fit`), and says which store folders it scanned (`store_roots`);
`names` resolves the names `--model` and a models.toml `source` take
(`ollama:`, `lmstudio:`, `hf:`, a path), and `named_spec` makes a
`ModelSpec` for one. Each store's layout is in its module: `ollama`,
`lmstudio`, `hf_cache`, `folders`. docs/models.md is the user's account of it.
"""
