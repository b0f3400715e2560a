"""The course's models for other programs: the small GPT as a transformers checkpoint or a GGUF
file, the offline chat model as a transformers checkpoint (``python -m coursekit.llm export``).

torch, transformers, gguf and the course's models (``coursekit.gpt``, which trains or loads
them) are imported when an export is written: importing ``coursekit.llm`` needs none of them."""
from __future__ import annotations

import json
from pathlib import Path

from coursekit.models import _quiet, course_cache_dir

# Imports inside functions: torch, transformers, gguf and coursekit.gpt are imported when a model is
# exported: the LLM lab imports coursekit.llm (and so this module) without them.


def export_offline_chat(folder=None):
    """Write the offline chat model as a transformers checkpoint (``LlamaForCausalLM``, its
    tokenizer with the chat template, a generation config that stops at ``<|end|>``) for
    ``transformers serve FOLDER`` or vLLM, and return the folder. Default:
    ``$COURSE_CACHE_DIR/assistant-export/<key>``; ``python -m coursekit.llm export --chat``."""
    from transformers import GenerationConfig

    from coursekit.gpt.assistant import load_or_train_chat

    model, tokenizer, info = load_or_train_chat(verbose=False)
    folder = Path(folder) if folder is not None else course_cache_dir() / "assistant-export" / info["key"]
    folder.mkdir(parents=True, exist_ok=True)
    # a server samples at the request's settings only when the model's default is to sample (a
    # greedy default makes every temperature give the same text), and adds no hidden top-k
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=None, top_p=None,
                                               max_new_tokens=48, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    with _quiet():
        model.save_pretrained(folder)  # with its generation_config.json
        tokenizer.save_pretrained(folder)
    return folder



def _gpt2_state(model):
    """The small GPT's weights under GPT-2's names in transformers. The modules are GPT-2's
    (pre-norm blocks, learned positions, tied embeddings); transformers' GPT-2 keeps its
    linear maps as Conv1D, whose weight is the transpose of nn.Linear's."""
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("lm_head"):
            continue  # tied to transformer.wte.weight
        t = tensor.detach().cpu().float()
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            t = t.t()
        state[name] = t.contiguous()
    return state


def _merges(tokenizer) -> list[str]:
    model = json.loads(tokenizer.to_str())["model"]
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def export_small_gpt(folder=None, fmt="hf", model=None, tokenizer=None, chat_template=None):
    """Write the course's small GPT (``load_or_train_small_gpt()`` unless ``model`` and
    ``tokenizer`` are given) for other programs, and return the path written.

    ``fmt="hf"``: a transformers checkpoint folder (``GPT2LMHeadModel``, exact GELU, the BPE
    tokenizer, a generation config that samples with no hidden top-k), which ``transformers
    serve FOLDER`` or vLLM can serve. ``fmt="gguf"``: one GGUF file (float32, llama.cpp's
    ``gpt2`` architecture) for llama.cpp, llama-cpp-python or Ollama; llama.cpp computes GELU
    with the tanh approximation, so its logits differ from the original in the fourth
    decimal or so. Its end-of-text token is the line break (articles are one per line), as
    llama.cpp needs one. ``chat_template`` (a Jinja template) is stored in the file, for
    programs that only speak chat. Default folder: ``$COURSE_CACHE_DIR/small-gpt-export/<key>``."""
    import torch

    if model is None or tokenizer is None:
        from coursekit.gpt import load_or_train_small_gpt

        model, tokenizer, info = load_or_train_small_gpt(verbose=False)
        key = info["key"]
    else:
        key = "custom"
    if fmt not in ("hf", "gguf"):
        raise ValueError(f"fmt={fmt!r}: use 'hf' or 'gguf'")
    if folder is None:
        folder = course_cache_dir() / "small-gpt-export" / key
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    backend = getattr(tokenizer, "backend", tokenizer)  # coursekit.gpt.BPETokenizer wraps a tokenizers.Tokenizer
    if fmt == "hf":
        from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

        config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                            n_head=c.n_head, n_inner=4 * c.n_embd, activation_function="gelu",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                            bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
        hf = GPT2LMHeadModel(config)
        missing, unexpected = hf.load_state_dict(_gpt2_state(model), strict=False)
        if unexpected or any(not k.startswith("lm_head") for k in missing):
            raise RuntimeError(f"weights do not match GPT-2's layout: missing {missing}, unexpected {unexpected}")
        hf.tie_weights()
        hf.eval()
        # sample by default, with nothing but the request's settings (no hidden top-k)
        hf.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=None, top_p=None,
                                                max_new_tokens=c.block_size)
        with _quiet():  # no progress bars
            hf.save_pretrained(folder)
            PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=c.block_size).save_pretrained(folder)
        return folder
    import gguf

    path = folder / "small-gpt-f32.gguf"
    vocab = backend.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "token ids must be 0..V-1"
    newline = backend.token_to_id("Ċ")  # "\n" in byte-level BPE's printable alphabet
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_name("course small GPT (AG News)")
    w.add_context_length(c.block_size)
    w.add_embedding_length(c.n_embd)
    w.add_feed_forward_length(4 * c.n_embd)
    w.add_block_count(c.n_layer)
    w.add_head_count(c.n_head)
    w.add_layer_norm_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges(_merges(backend))
    w.add_bos_token_id(newline)
    w.add_eos_token_id(newline)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    names = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
             "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias",
             "lm_head.weight": "output.weight"}
    parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        if name.startswith("transformer.h."):
            _, _, i, rest = name.split(".", 3)
            module, leaf = rest.rsplit(".", 1)
            target = f"blk.{i}.{parts[module]}.{leaf}"
        else:
            target = names[name]
        # nn.Linear keeps (out, in), the order llama.cpp expects from a PyTorch checkpoint
        w.add_tensor(target, tensor.detach().cpu().to(torch.float32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
