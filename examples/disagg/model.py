"""A small decoder-only transformer whose attention keeps K and V in a paged cache.

The cache is vLLM's per-layer layout: one tensor per layer of shape
[2, num_blocks, block_size, kv_heads, head_dim], K at index 0 and V at index 1. A
request's block table lists the blocks that hold its positions in order: position p
is slot p % block_size of block table[p // block_size]. Decoding reads K and V back
through the block table, so the next token depends only on the cache's bytes and the
table. Copy a request's blocks byte for byte into another cache at other ids, hand
over the new table, and decoding goes on bit for bit as it would have.

Weights come from a seeded torch.Generator (on the CPU): nothing is downloaded.
Everything is float32 on one device: the CPU on one thread, or a CUDA GPU
(setup_device: no TF32, a fixed cuBLAS workspace), where the model and its cache
live when the cache's tensors are there. Two processes with the same config on the
same device compute the same bits.
"""

import dataclasses
import math
import os

import torch

# Intra-op threads change how matmuls split their sums, and so their last bits: one
# thread everywhere keeps a prefill engine, a decode engine and the reference equal.
torch.set_num_threads(1)


def setup_device(name):
    """The torch.device `name` names ("cpu", "cuda", "cuda:1"); a bare "cuda" is
    cuda:0. On a GPU, matmuls and convolutions stay exact float32 (no TF32) and cuBLAS
    keeps a fixed workspace, so the same op on the same shapes gives the same bits in
    every process. RuntimeError where torch has no CUDA."""
    device = torch.device(name)
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device {name!r}: cpu or cuda[:index]")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r}: torch {torch.__version__} finds no CUDA GPU")
    # Read when cuBLAS makes its first handle: before any matmul of this process.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda", 0 if device.index is None else device.index)


@dataclasses.dataclass(frozen=True)
class Config:
    # "tiny": Model below; "llama": transformers' LlamaForCausalLM (hf_model.py) built
    # from the same numbers (its rotary base is Llama's default, 10000, as rope_base's).
    family: str = "tiny"
    vocab: int = 512
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    kv_heads: int = 2  # grouped-query attention: two query heads share each K/V head
    mlp_hidden: int = 384
    block_size: int = 16  # positions per cache block
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 20261201

    @property
    def head_dim(self):
        return self.d_model // self.heads

    def blocks_for(self, positions):
        """Blocks that hold `positions` positions."""
        return -(-positions // self.block_size)

    def layer_shape(self, num_blocks):
        """Shape of one layer's cache tensor."""
        return (2, num_blocks, self.block_size, self.kv_heads, self.head_dim)

    def layer_bytes(self, num_blocks):
        """Bytes of one layer's cache tensor (float32)."""
        return math.prod(self.layer_shape(num_blocks)) * 4


# The models an engine can serve (--model): the example's own, small enough for a CPU
# in CI, and on a GPU a Llama of about 0.9 B parameters whose K/V per token (128 KiB
# in float32) makes the transfer a real part of the time to first token.
PRESETS = {
    "tiny": Config(),
    "llama": Config(family="llama", vocab=32000, layers=16, d_model=2048, heads=16,
                    kv_heads=8, mlp_hidden=5632),
}


def make_model(config, cache):
    """The model `config.family` names, computing into `cache` (a PagedKvCache)."""
    if config.family == "tiny":
        return Model(config, cache)
    if config.family == "llama":
        from hf_model import HfModel

        return HfModel(config, cache)
    raise ValueError(f"no model family {config.family!r}: tiny or llama")


class PagedKvCache:
    """One cache tensor per layer, each a view over memory the caller owns.

    `buffers` has one entry per layer: a writable buffer (a bytearray, an mmap, a
    HostBuffer's `data`) at least config.layer_bytes(num_blocks) long, or a float32
    torch tensor of config.layer_shape(num_blocks) (a CUDA tensor: the cache is on
    that GPU), all on one device; nothing is copied, so whoever else maps that memory
    sees every write at once. The caller keeps the buffers alive at least as long as
    this cache.
    """

    def __init__(self, config, num_blocks, buffers):
        if len(buffers) != config.layers:
            raise ValueError(f"{len(buffers)} buffers for {config.layers} layers")
        self.config = config
        self.num_blocks = num_blocks
        count = math.prod(config.layer_shape(num_blocks))
        self.layers = [self._layer(b, count) for b in buffers]
        self.device = self.layers[0].device
        if any(layer.device != self.device for layer in self.layers):
            raise ValueError("the layers lie on different devices")

    def _layer(self, buffer, count):
        shape = self.config.layer_shape(self.num_blocks)
        if isinstance(buffer, torch.Tensor):
            if (buffer.dtype != torch.float32 or tuple(buffer.shape) != shape
                    or not buffer.is_contiguous()):
                raise ValueError(f"a layer tensor must be contiguous float32 {shape}, not "
                                 f"{buffer.dtype} {tuple(buffer.shape)}")
            return buffer
        return torch.frombuffer(buffer, dtype=torch.float32, count=count).view(shape)

    def copy_blocks(self, source_blocks, target, target_blocks):
        """Copies the K and V of `source_blocks` in every layer into `target` (another
        PagedKvCache of the same config) at `target_blocks`."""
        if len(source_blocks) != len(target_blocks):
            raise ValueError("source and target block lists differ in length")
        src = torch.tensor(source_blocks, dtype=torch.long, device=self.device)
        dst = torch.tensor(target_blocks, dtype=torch.long, device=target.device)
        for mine, theirs in zip(self.layers, target.layers):
            theirs[:, dst] = mine[:, src]


def block_slots(cache, block_table, positions):
    """(block ids, offsets) in `cache` of `positions` (a tensor on its device) under
    `block_table`."""
    size = cache.config.block_size
    table = torch.tensor(block_table, dtype=torch.long, device=cache.device)
    return table[positions // size], positions % size


def prompt_slots(cache, tokens, block_table):
    """(positions, block ids, offsets) of a prompt of `tokens` under `block_table`;
    ValueError for an empty prompt or a table that cannot hold it."""
    n = len(tokens)
    if n == 0:
        raise ValueError("empty prompt")
    check_table(cache, block_table, n)
    positions = torch.arange(n, device=cache.device)
    return (positions, *block_slots(cache, block_table, positions))


def check_table(cache, block_table, positions):
    """ValueError unless `block_table` holds `positions` positions of `cache`."""
    if len(block_table) < cache.config.blocks_for(positions):
        raise ValueError(f"{len(block_table)} blocks cannot hold {positions} positions")
    if any(not 0 <= b < cache.num_blocks for b in block_table):
        raise ValueError(f"a block id outside 0..{cache.num_blocks - 1}")


class Model:
    """The transformer: token embedding, then per layer RMSNorm, attention with rotary
    positions (grouped-query), RMSNorm, SwiGLU MLP, each around a residual; a final
    RMSNorm and the LM head. Stateless between calls: all a request carries from one
    call to the next is in the cache. Safe to call from several threads on disjoint
    blocks. Weights and compute are on the cache's device; the weights are drawn on
    the CPU and moved there, so they are the same on every device."""

    def __init__(self, config, cache):
        self.config = config
        self.cache = cache
        self.device = device = cache.device
        gen = torch.Generator().manual_seed(config.seed)
        d, hd = config.d_model, config.head_dim

        def weight(rows, cols):
            return (torch.randn(rows, cols, generator=gen) / math.sqrt(rows)).to(device)

        def vector(n):
            return (1 + 0.1 * torch.randn(n, generator=gen)).to(device)

        self.embed = torch.randn(config.vocab, d, generator=gen).to(device)
        self.blocks = []
        for _ in range(config.layers):
            self.blocks.append({
                "attn_norm": vector(d),
                "wq": weight(d, config.heads * hd),
                "wk": weight(d, config.kv_heads * hd),
                "wv": weight(d, config.kv_heads * hd),
                "wo": weight(config.heads * hd, d),
                "mlp_norm": vector(d),
                "w_gate": weight(d, config.mlp_hidden),
                "w_up": weight(d, config.mlp_hidden),
                "w_down": weight(config.mlp_hidden, d),
            })
        self.final_norm = vector(d)
        self.lm_head = weight(d, config.vocab)
        half = hd // 2
        self.inv_freq = (1.0 / config.rope_base
                         ** (torch.arange(half, dtype=torch.float32) / half)).to(device)

    def _norm(self, x, weight):
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.norm_eps)
        return x * scale * weight

    def _rotate(self, x, positions):
        """Rotary positions on [n, heads, head_dim]: each half-pair turned by its angle."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def _attend(self, q, k, v, causal):
        """q [n, heads, hd] over k, v [m, kv_heads, hd]; query i sees keys up to
        m - n + i when `causal`. Returns [n, d_model]."""
        group = self.config.heads // self.config.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.config.head_dim)
        if causal:
            n, m = q.shape[0], k.shape[0]
            future = torch.ones(n, m, dtype=torch.bool, device=q.device).triu(m - n + 1)
            scores = scores.masked_fill(future, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        return out.reshape(q.shape[0], -1)

    def _qkv(self, block, h, positions):
        n, hd = h.shape[0], self.config.head_dim
        q = (h @ block["wq"]).view(n, self.config.heads, hd)
        k = (h @ block["wk"]).view(n, self.config.kv_heads, hd)
        v = (h @ block["wv"]).view(n, self.config.kv_heads, hd)
        return self._rotate(q, positions), self._rotate(k, positions), v

    def _mlp(self, block, x):
        h = self._norm(x, block["mlp_norm"])
        gate = torch.nn.functional.silu(h @ block["w_gate"])
        return x + (gate * (h @ block["w_up"])) @ block["w_down"]

    def _logits(self, x):
        return (self._norm(x, self.final_norm) @ self.lm_head)[-1]

    @torch.no_grad()
    def prefill(self, tokens, block_table, on_layer=None):
        """Runs the prompt `tokens`, writes every layer's K and V for positions
        0..len-1 into the blocks of `block_table`, and returns the logits of the last
        position ([vocab]). `on_layer(l)` is called once layer l's K and V are in the
        cache, before layer l + 1 starts: the place for a layer-by-layer transfer."""
        positions, blocks, offsets = prompt_slots(self.cache, tokens, block_table)
        x = self.embed[torch.tensor(tokens, dtype=torch.long, device=self.device)]
        for index, block in enumerate(self.blocks):
            q, k, v = self._qkv(block, self._norm(x, block["attn_norm"]), positions)
            layer = self.cache.layers[index]
            layer[0, blocks, offsets] = k
            layer[1, blocks, offsets] = v
            if on_layer is not None:
                on_layer(index)
            x = x + self._attend(q, k, v, causal=True) @ block["wo"]
            x = self._mlp(block, x)
        return self._logits(x)

    @torch.no_grad()
    def decode_step(self, token, position, block_table):
        """Feeds `token` at `position` (the cache holds positions 0..position-1 of this
        request), appends its K and V, and returns the logits of the next token."""
        check_table(self.cache, block_table, position + 1)
        used = torch.tensor(block_table[:self.config.blocks_for(position + 1)],
                            dtype=torch.long, device=self.device)
        positions = torch.tensor([position], device=self.device)
        blocks, offsets = block_slots(self.cache, block_table, positions)
        x = self.embed[torch.tensor([token], dtype=torch.long, device=self.device)]
        for index, block in enumerate(self.blocks):
            q, k, v = self._qkv(block, self._norm(x, block["attn_norm"]), positions)
            layer = self.cache.layers[index]
            layer[0, blocks, offsets] = k
            layer[1, blocks, offsets] = v
            # Every key and value comes back from the cache, the new one included: the
            # result is a function of the cache's bytes alone.
            shape = (-1, self.config.kv_heads, self.config.head_dim)
            keys = layer[0, used].reshape(shape)[:position + 1]
            values = layer[1, used].reshape(shape)[:position + 1]
            x = x + self._attend(q, keys, values, causal=False) @ block["wo"]
            x = self._mlp(block, x)
        return self._logits(x)


def greedy_decode(model, first_token, prompt_len, block_table, max_new):
    """`max_new` tokens, `first_token` (the prefill's) first, then greedy steps; the
    last token is never fed back, so the table needs prompt_len + max_new - 1
    positions."""
    tokens = [first_token]
    for step in range(max_new - 1):
        logits = model.decode_step(tokens[-1], prompt_len + step, block_table)
        tokens.append(int(logits.argmax()))
    return tokens


def positions_needed(prompt_len, max_new):
    """Cache positions a request of `prompt_len` tokens generating `max_new` fills."""
    return prompt_len + max(max_new, 1) - 1
