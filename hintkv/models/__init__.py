"""hintkv.models: the tensor side — a llama-family decoder over a paged KV cache, its loaders, tokenizer.

    config.py          ModelConfig (llama / qwen2 shapes, rope_scaling), from_hf_dict / to_hf_dict
    attention.py       AttentionMetadata + paged_attention: the one place attention happens
    rope.py            rotate-half RoPE with default / linear / llama3 scaling
    llama.py           LlamaForCausalLM: forward(ids, positions, meta, kv_caches), compute_logits,
                       load_state_dict_hf (fused qkv and gate_up), prepare(quantization), compile()
    greedy_head.py     a greedy step's tokens without the logits: int8-screened LM head, exact float argmax
    linear.py          how every GEMM runs: dense | mkl (CPU float32: gemv_cpu.py's C++ for <= 12 rows, else
                       MKL-packed) | w8a8 (torch._int_mm)
    gemv_cpu.py        few-row float32 GEMMs in C++ (decode steps): W read where it lies, prefetched
    compile.py         the step's element-wise regions, eager in place or torch.compile'd (eager fallback)
    loader.py          load_model(spec, dtype, device, seed, quantization) -> LoadedModel
    gguf_loader.py     llama.cpp GGUF: dequantize, undo Q/K permutation, BPE tokenizer from metadata
    hf_loader.py       Hugging Face checkpoint dirs (sharded safetensors, tokenizer.json, chat template)
    presets.py         dummy:<preset> shapes (tiny, smollm2-135m, llama3-8b), preset_hf_config
    tokenizer.py       Tokenizer (encode/decode/apply_chat_template), IncrementalDetokenizer
    chat_template.py   sandboxed Jinja rendering; Hermes-style tools for tool-unaware templates
"""
