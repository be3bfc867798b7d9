"""Sentence-transformers' padding-free arm: every text of a step in one flattened row with per-text positions,
and the best varlen attention transformers reaches here (FlashAttention 2 / 3, PyTorch's varlen kernel
registered in transformers' AttentionInterface, flex attention, or a dense block-diagonal mask on the CPU);
the kernel that ran and its agreement with the padded forward, for the record.
"""

from __future__ import annotations

#: the padding-free attentions tried for ST's flat arm, best first (transformers' attn_implementation names, or
#: ours): FlashAttention 2 / 3 read the packed sequences from position_ids / cu_seq_lens; torch_varlen is
#: PyTorch's own FlashAttention varlen kernel (torch.nn.attention.varlen, CUDA) registered in transformers'
#: AttentionInterface; flex_attention gets a block-diagonal BlockMask; sdpa a dense block-diagonal mask (the same
#: function with O(T^2) work: the CPU's data path only)
FLAT_ORDER = ("flash_attention_3", "flash_attention_2", "torch_varlen", "flex_attention", "sdpa_block_mask")


def flat_attentions(gpu: bool, prefer: list | None = None) -> tuple[list, dict]:
    """The padding-free attentions of FLAT_ORDER (or ``prefer``) that can run here, best first (the flat arm takes
    the first that also passes its probe, a forward and backward on the device) -> (names, what was tried:
    {name: "ok" or why not}); sdpa_block_mask when none."""
    import importlib.util

    import torch

    tried = {}
    for name in prefer or FLAT_ORDER:
        if name in ("flash_attention_2", "flash_attention_3"):
            mod = "flash_attn" if name.endswith("2") else "flash_attn_interface"
            if not gpu:
                tried[name] = "needs CUDA"
            elif importlib.util.find_spec(mod) is None:
                tried[name] = (f"not installed on the device image (no {mod} package; flash-attn ships no "
                               "manylinux wheel for this torch / CUDA: it must be built there, which the call's time "
                               "and offline machine rule out)")
            else:
                tried[name] = "ok"
        elif name == "torch_varlen":
            try:
                from torch.nn.attention.varlen import varlen_attn  # noqa: F401

                tried[name] = "ok" if gpu else \
                    "varlen kernel unavailable on CPU (torch.nn.attention.varlen is CUDA-only)"
            except ImportError as e:
                tried[name] = f"not in torch {torch.__version__}: {e}"
        elif name == "flex_attention":
            try:
                from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401

                tried[name] = "ok" if gpu else "not tried on CPU (torch.compile of flex attention: minutes)"
            except ImportError as e:
                tried[name] = f"not in torch {torch.__version__}: {e}"
        else:
            tried[name] = "ok"
    ok = [n for n, v in tried.items() if v == "ok"]
    return ok or ["sdpa_block_mask"], tried


def cpu_varlen_reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
                         window_size=(-1, -1), enable_gqa=False):
    """torch.nn.attention.varlen.varlen_attn's function (its torch 2.13 signature) in plain torch, text by text:
    the CPU's stand-in, so that the dry run checks the flat arm's wiring through each architecture."""
    import torch

    out = torch.empty_like(query)
    causal = tuple(window_size) == (-1, 0)
    for i in range(len(cu_seq_q) - 1):
        a, b = int(cu_seq_q[i]), int(cu_seq_q[i + 1])
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))  # [heads, n, D]
        if k.shape[0] != q.shape[0]:
            k, v = (t.repeat_interleave(q.shape[0] // k.shape[0], dim=0) for t in (k, v))
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                    scale=scale).transpose(0, 1)
    return out


#: what each registered varlen attention ran: {name: {"kernel": the function, "calls": n, "cast": {"q": "float32
#: -> bfloat16", ...}}}: the padding-free arm's record of the kernel that computed it
VARLEN_RAN: dict = {}


def _compute_dtype(value):
    """The dtype the attention computes in: autocast's on the tensor's device while autocast is on, else
    ``value``'s (the projections' output dtype)."""
    import torch

    dev = value.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return value.dtype


def flex_compiled() -> bool:
    """Whether transformers' flex attention ran compiled (its singleton WrappedFlexAttention, made on the first
    call, holds a torch.compile'd flex_attention): uncompiled, flex materialises every score block and is no fair
    arm. False where this transformers has no such wrapper."""
    try:
        from transformers.integrations.flex_attention import WrappedFlexAttention
    except ImportError:
        return False
    return bool(getattr(getattr(WrappedFlexAttention, "_instance", None), "_is_flex_compiled", False))


def register_torch_varlen(kernel=None, name: str = "jaxembed_torch_varlen") -> str:
    """transformers' AttentionInterface entry ``name``: torch.nn.attention.varlen.varlen_attn (or ``kernel``, the
    same function) on the flattened row (batch 1) with the cu_seq_lens_q / max_length_q the forward call passes
    down, causal for decoders, grouped-query heads expanded where the kernel has no enable_gqa. No attention
    dropout (the kernel has none). q / k / v are cast to the compute dtype first (autocast's): the kernel takes
    float16 / bfloat16 only, and RoPE under autocast returns float32 q / k. VARLEN_RAN[name] counts the calls."""
    import inspect

    import torch
    from transformers import AttentionInterface

    if kernel is None:
        from torch.nn.attention.varlen import varlen_attn as kernel
    varlen_attn = kernel
    params = inspect.signature(varlen_attn).parameters

    ran = VARLEN_RAN[name] = {"kernel": f"{kernel.__module__}.{kernel.__name__}", "calls": 0, "cast": {}}

    def fn(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
        dtype = _compute_dtype(value)
        for role, t in (("q", query), ("k", key), ("v", value)):
            if t.dtype != dtype:  # RoPE under autocast leaves q / k in float32, which the kernel refuses
                ran["cast"][role] = f"{t.dtype} -> {dtype}".replace("torch.", "")
        q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))  # [T, heads, D]
        ran["calls"] += 1
        if k.shape[1] != q.shape[1] and "enable_gqa" not in params:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        causal = bool(module.is_causal if is_causal is None else is_causal)
        extra = {}
        if "enable_gqa" in params and k.shape[1] != q.shape[1]:
            extra["enable_gqa"] = True
        if "is_causal" in params:
            extra["is_causal"] = causal
        elif causal:
            extra["window_size"] = (-1, 0)
        if scaling is not None and "scale" in params:
            extra["scale"] = scaling
        cu, m = kw["cu_seq_lens_q"], int(kw["max_length_q"])
        out = varlen_attn(q, k, v, cu, cu, m, m, **extra)
        return out[None], None  # [1, T, heads, D]: what the model reshapes

    AttentionInterface.register(name, fn)
    return name


class Flat:
    """A Hugging Face model (ST's ``model[0].auto_model``) run padding-free: every text of a step in one row
    [1, T] with positions restarting per text, mean-pooled per text (index_add over the row), the loss on the
    pooled columns. ``impl``: flat_attentions's choice; ``varlen_kernel``: torch_varlen's kernel instead of
    torch's (``cpu_varlen_reference`` on the CPU)."""

    def __init__(self, auto, tokenizer, max_len: int, impl: str, device: str, varlen_kernel=None):
        import torch

        self.auto, self.tokenizer, self.max_len, self.impl, self.device = auto, tokenizer, max_len, impl, device
        self.causal = bool(getattr(self.auto.config, "is_decoder", False)) or \
            self.auto.config.model_type in ("qwen2", "qwen3", "llama", "mistral")
        self.hf_impl = {"torch_varlen": None, "sdpa_block_mask": "sdpa"}.get(impl, impl)
        if impl == "torch_varlen":
            self.hf_impl = register_torch_varlen(varlen_kernel, "jaxembed_varlen_reference" if varlen_kernel
                                                  else "jaxembed_torch_varlen")
        self.saved = getattr(self.auto.config, "_attn_implementation", "sdpa")
        self.torch = torch

    def _set(self, name):
        try:
            self.auto.set_attn_implementation(name)
        except Exception:  # noqa: BLE001 -- older transformers / a registered custom name: the config field
            self.auto.config._attn_implementation = name

    def __enter__(self):
        self._set(self.hf_impl)
        return self

    def __exit__(self, *exc):
        self._set(self.saved)
        return False

    def features(self, columns: list[list[str]]) -> dict:
        """The flattened row of ``columns`` (lists of texts): input_ids / position_ids [1, T], the text of each
        token, cu_seq_lens, lengths, the column sizes."""
        torch = self.torch
        tok = self.tokenizer
        ids, sizes = [], []
        for texts in columns:
            enc = tok(list(texts), truncation=True, max_length=self.max_len, padding=False)
            ids += enc["input_ids"]
            sizes.append(len(texts))
        lengths = torch.tensor([len(x) for x in ids])
        flat = torch.tensor([t for x in ids for t in x], dtype=torch.long)
        pos = torch.cat([torch.arange(n) for n in lengths.tolist()])
        seg = torch.repeat_interleave(torch.arange(len(ids)), lengths)
        cu = torch.zeros(len(ids) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lengths, 0)
        f = {"input_ids": flat[None], "position_ids": pos[None], "seg": seg, "lengths": lengths, "cu": cu,
             "max_len": int(lengths.max()), "sizes": sizes}
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in f.items()}

    def embed(self, f: dict) -> list:
        """Mean-pooled embeddings per column (float32)."""
        torch = self.torch
        kw = {"input_ids": f["input_ids"], "position_ids": f["position_ids"]}
        if "token_type_ids" in __import__("inspect").signature(self.auto.forward).parameters:
            kw["token_type_ids"] = torch.zeros_like(f["input_ids"])
        seg = f["seg"]
        if self.impl in ("flash_attention_2", "flash_attention_3", "torch_varlen"):
            kw.update(cu_seq_lens_q=f["cu"], cu_seq_lens_k=f["cu"], max_length_q=f["max_len"],
                      max_length_k=f["max_len"])
        elif self.impl == "flex_attention":
            from torch.nn.attention.flex_attention import create_block_mask

            causal = self.causal

            def mask_mod(b, h, q, k):
                same = seg[q] == seg[k]
                return same & (k <= q) if causal else same

            T = seg.shape[0]
            kw["attention_mask"] = create_block_mask(mask_mod, 1, None, T, T, device=seg.device)
        else:  # sdpa with a dense block-diagonal (causal) mask [1, 1, T, T]
            m = seg[:, None] == seg[None, :]
            if self.causal:
                m = m & torch.ones_like(m).tril()
            kw["attention_mask"] = m[None, None]
        h = self.auto(**kw).last_hidden_state[0].float()  # [T, hidden]
        pooled = torch.zeros(len(f["lengths"]), h.shape[-1], device=h.device).index_add_(0, seg, h)
        pooled = pooled / f["lengths"][:, None].to(h.dtype)
        return list(pooled.split(f["sizes"]))


def kernel_ran(flat: Flat) -> dict:
    """The attention kernel that computed the padding-free arm: the varlen function and its calls (with the
    casts to the compute dtype), flex attention and whether it ran compiled, or the model's own attention."""
    if flat.impl == "torch_varlen":
        return dict(VARLEN_RAN.get(flat.hf_impl, {}), cast=dict(VARLEN_RAN.get(flat.hf_impl, {}).get("cast", {})))
    if flat.impl == "flex_attention":
        return {"kernel": "torch.nn.attention.flex_attention", "compiled": flex_compiled()}
    if flat.impl == "sdpa_block_mask":
        return {"kernel": "torch.nn.functional.scaled_dot_product_attention (dense block-diagonal mask)"}
    return {"kernel": flat.impl}


def flat_agreement(flat: Flat, columns: list, n: int = 8) -> dict:
    """The flat path's embeddings against the same model's padded forward (its default attention, each column
    padded to its longest text, mean pooling over the mask) on the first ``n`` texts of each column, dropout off,
    bf16 autocast on a GPU: the smallest cosine (the arm computes the same function; bf16: > 0.99)."""
    import torch

    cols = [list(t)[:n] for t in columns]
    auto = flat.auto
    was = auto.training
    auto.eval()
    gpu = str(flat.device).startswith("cuda")  # bf16 there, as the arm runs (the flash kernels take no float32)
    try:
        with torch.no_grad(), torch.autocast("cuda" if gpu else "cpu", dtype=torch.bfloat16, enabled=gpu):
            ref = []
            for c in cols:
                t = flat.tokenizer(c, truncation=True, max_length=flat.max_len, padding=True, return_tensors="pt")
                t = {k: v.to(flat.device) for k, v in t.items() if k in ("input_ids", "attention_mask")}
                h, m = auto(**t).last_hidden_state.float(), t["attention_mask"][..., None].float()
                ref.append((h * m).sum(1) / m.sum(1))
            with flat:
                got = flat.embed(flat.features(cols))
        cos = torch.nn.functional.cosine_similarity(torch.cat(ref), torch.cat(got), dim=-1)
        return {"attention": flat.impl + (" (reference kernel)" if "reference" in str(flat.hf_impl) else ""),
                "texts": int(cos.numel()), "min_cosine": float(cos.min())}
    finally:
        auto.train(was)
