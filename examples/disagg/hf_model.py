"""A transformers model (LlamaForCausalLM) serving from model.PagedKvCache, with the
same interface as model.Model: prefill(tokens, block_table, on_layer) and
decode_step(token, position, block_table).

The model is built from a LlamaConfig made of model.Config's numbers, its weights drawn
by transformers' own initialisation from torch's generator seeded with config.seed on
the cache's device: nothing is downloaded, and every process with the same config on
the same device holds the same weights. Attention is transformers' eager one.

The KV cache is vLLM's per-layer paged layout (model.py). transformers attends over its
own contiguous cache (a DynamicCache), so:
- prefill runs the prompt into a fresh DynamicCache; a forward hook on each decoder
  layer copies that layer's K and V into the paged blocks as soon as the layer has
  run, then calls on_layer(l), before layer l + 1 starts;
- decode_step gathers every layer's K and V of positions 0..position-1 from the paged
  blocks into a DynamicCache, feeds one token, and writes its new K and V back into the
  paged blocks. The next token is a function of the paged cache's bytes alone, as with
  model.Model: blocks copied byte for byte elsewhere decode on bit for bit.
"""

import threading

import torch
import transformers

from model import block_slots, check_table, prompt_slots


def _layer_kv(cache, index):
    """(keys, values) of layer `index` of a DynamicCache, each [1, kv_heads, seq, hd]:
    transformers 5 keeps them in cache.layers, 4 in key_cache/value_cache."""
    if hasattr(cache, "layers"):
        layer = cache.layers[index]
        return layer.keys, layer.values
    return cache.key_cache[index], cache.value_cache[index]


class HfModel:
    def __init__(self, config, cache):
        if config.d_model % config.heads or config.heads % config.kv_heads:
            raise ValueError(f"{config}: heads must divide d_model, kv_heads heads")
        self.config = config
        self.cache = cache
        self.device = cache.device
        hf_config = transformers.LlamaConfig(
            vocab_size=config.vocab, hidden_size=config.d_model,
            intermediate_size=config.mlp_hidden, num_hidden_layers=config.layers,
            num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
            head_dim=config.head_dim, rms_norm_eps=config.norm_eps,
            max_position_embeddings=8192, tie_word_embeddings=False,
            attn_implementation="eager")
        torch.manual_seed(config.seed)
        with torch.device(self.device):
            self.hf = transformers.LlamaForCausalLM(hf_config)
        self.hf.eval()
        # The prefill each thread runs now, if any: the hooks serve only that one.
        self._local = threading.local()
        for index, layer in enumerate(self.hf.model.layers):
            layer.register_forward_hook(self._hook(index))

    def _hook(self, index):
        def after_layer(_module, _inputs, _output):
            run = getattr(self._local, "prefill", None)
            if run is None:
                return
            hf_cache, blocks, offsets, on_layer = run
            keys, values = _layer_kv(hf_cache, index)
            layer = self.cache.layers[index]
            layer[0, blocks, offsets] = keys[0].transpose(0, 1)
            layer[1, blocks, offsets] = values[0].transpose(0, 1)
            if on_layer is not None:
                on_layer(index)

        return after_layer

    @torch.no_grad()
    def prefill(self, tokens, block_table, on_layer=None):
        """As model.Model.prefill: the prompt's K and V of every layer into the blocks
        of `block_table`, on_layer(l) once layer l's are there; the last position's
        logits ([vocab])."""
        positions, blocks, offsets = prompt_slots(self.cache, tokens, block_table)
        hf_cache = transformers.DynamicCache()
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        self._local.prefill = (hf_cache, blocks, offsets, on_layer)
        try:
            out = self.hf(input_ids=ids, position_ids=positions[None],
                          past_key_values=hf_cache, use_cache=True)
        finally:
            self._local.prefill = None
        return out.logits[0, -1]

    @torch.no_grad()
    def decode_step(self, token, position, block_table):
        """As model.Model.decode_step: feeds `token` at `position` over the K and V of
        positions 0..position-1 read from the paged cache, appends its own there, and
        returns the next token's logits."""
        check_table(self.cache, block_table, position + 1)
        c = self.config
        used = torch.tensor(block_table[:c.blocks_for(position)], dtype=torch.long,
                            device=self.device)
        hf_cache = transformers.DynamicCache()
        for index, layer in enumerate(self.cache.layers):
            shape = (-1, c.kv_heads, c.head_dim)
            keys = layer[0, used].reshape(shape)[:position]
            values = layer[1, used].reshape(shape)[:position]
            hf_cache.update(keys.transpose(0, 1)[None], values.transpose(0, 1)[None], index)
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        where = torch.tensor([position], device=self.device)
        out = self.hf(input_ids=ids, position_ids=where[None], past_key_values=hf_cache,
                      use_cache=True)
        blocks, offsets = block_slots(self.cache, block_table, where)
        for index, layer in enumerate(self.cache.layers):
            keys, values = _layer_kv(hf_cache, index)
            layer[0, blocks, offsets] = keys[0, :, position:position + 1].transpose(0, 1)
            layer[1, blocks, offsets] = values[0, :, position:position + 1].transpose(0, 1)
        return out.logits[0, -1]
