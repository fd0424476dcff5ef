"""Byte-level GPT pre-training under a fixed budget. THE file the experiment loop edits.

Run: `python train.py` (no flags). The training budget comes from the protected harness:
prepare.step_budget() on a compute budget (train exactly that many steps), else
prepare.time_budget_s() (the service's seconds, default 300 s); env OVERNIGHT_SEED (default
42), OVERNIGHT_DEVICE (cuda / mps / cpu; default: best available), OMP_NUM_THREADS (CPU
threads; default: every core this process may use).
Data, tokenizer, the metric and the checkpoint live in prepare.py (protected); evaluate.py
(protected) scores the saved model again when the evaluation here crashed. Ends with a summary block
(`---` then `key: value` lines); val_bpb is the metric (lower is better).
"""

import time

T_START = time.time()

import gc  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from prepare import (  # noqa: E402
    MAX_SEQ_LEN,
    VOCAB_SIZE,
    data_source,
    evaluate_bpb,
    make_batches,
    save_checkpoint,
    step_budget,
    time_budget_s,
)

# ---------------------------------------------------------------------------------------------
# Hyper-parameters: one `NAME = literal` per line (an automated proposer edits these by regex).

DEPTH = 4  # transformer blocks
D_MODEL = 128  # residual stream width
N_HEADS = 4  # attention heads (head_dim = D_MODEL // N_HEADS)
MLP_RATIO = 4  # MLP hidden width = MLP_RATIO * D_MODEL
USE_SWIGLU = False  # SwiGLU MLP (2/3 width, same params) instead of ReLU^2
TIED_EMBEDDINGS = False  # share the input embedding matrix with the output head
SOFTCAP = 15.0  # logit soft-cap cap*tanh(logits/cap); 0 disables
ROPE_BASE = 10000.0  # RoPE base frequency
SEQ_LEN = 256  # training context length (evaluation always uses prepare.MAX_SEQ_LEN)
BATCH_SIZE = 16  # sequences per optimizer step
LR = 3e-3  # AdamW peak LR for matrices and head, at width 768; scaled by (D_MODEL/768)**-0.5
EMBED_LR = 0.1  # AdamW peak LR for the input embedding, same width scaling
USE_MUON = False  # Muon for the 2-D transformer matrices (AdamW keeps embeddings/head/scalars)
MUON_LR = 0.02  # Muon peak LR
MUON_MOMENTUM = 0.95  # Muon (Nesterov) momentum
ADAM_BETA1 = 0.9  # AdamW beta1
ADAM_BETA2 = 0.95  # AdamW beta2
WEIGHT_DECAY = 0.1  # decoupled weight decay, 2-D matrices only (not embeddings/norms/scalars)
WARMUP_FRAC = 0.01  # linear LR warm-up over this fraction of the budget
WARMDOWN_FRAC = 0.3  # linear LR decay over the last fraction of the budget
FINAL_LR_FRAC = 0.0  # LR at the end of the warm-down, as a fraction of the peak
GRAD_CLIP = 1.0  # max global gradient norm; 0 disables

# ---------------------------------------------------------------------------------------------
# Model


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rope_tables(seq_len, head_dim, base=ROPE_BASE):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos()[None, None], freqs.sin()[None, None]  # (1, 1, T, head_dim/2)


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.head_dim = N_HEADS, D_MODEL // N_HEADS
        self.c_q = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.c_k = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.c_v = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.c_proj = nn.Linear(D_MODEL, D_MODEL, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.c_k(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.c_v(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k = rms_norm(q).to(v.dtype), rms_norm(k).to(v.dtype)  # QK-norm after RoPE
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        hidden = MLP_RATIO * D_MODEL
        if USE_SWIGLU:
            hidden = (2 * hidden // 3 + 63) // 64 * 64
            self.c_fc = nn.Linear(D_MODEL, 2 * hidden, bias=False)
        else:
            self.c_fc = nn.Linear(D_MODEL, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, D_MODEL, bias=False)

    def forward(self, x):
        h = self.c_fc(x)
        if USE_SWIGLU:
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.relu(h).square()
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(rms_norm(x), cos, sin)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB_SIZE, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.lm_head = None if TIED_EMBEDDINGS else nn.Linear(D_MODEL, VOCAB_SIZE, bias=False)
        cos, sin = rope_tables(max(SEQ_LEN, MAX_SEQ_LEN), D_MODEL // N_HEADS)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        for block in self.blocks:
            for name, p in block.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.zero_()  # residual-branch outputs start at zero
                else:
                    bound = (3.0 / p.size(1)) ** 0.5
                    p.uniform_(-bound, bound)
        if self.lm_head is None:
            self.wte.weight.normal_(0.0, 0.02)
        else:
            self.wte.weight.normal_(0.0, 1.0)
            self.lm_head.weight.zero_()

    def head_weight(self):
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, idx):
        T = idx.size(1)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        x = rms_norm(self.wte(idx))
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = F.linear(rms_norm(x), self.head_weight()).float()
        if SOFTCAP > 0:
            logits = SOFTCAP * torch.tanh(logits / SOFTCAP)
        return logits

    def flops_per_token(self):
        """6 * matmul params (everything but the embedding lookup, plus the head) + attention."""
        n = sum(p.numel() for p in self.blocks.parameters()) + self.head_weight().numel()
        return 6 * n + 12 * DEPTH * N_HEADS * (D_MODEL // N_HEADS) * SEQ_LEN


# ---------------------------------------------------------------------------------------------
# Optimizers


@torch.no_grad()
def newton_schulz(G, steps=5):
    """Approximately orthogonalise G (quintic Newton-Schulz iteration, as in Muon)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.bfloat16() if G.is_cuda else G.float()
    transposed = X.size(-2) > X.size(-1)
    if transposed:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    if transposed:
        X = X.mT
    return X.to(G.dtype)


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-Schulz, for 2-D weight matrices only."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.0, ns_steps=5):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      ns_steps=ns_steps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mom)
                update = newton_schulz(p.grad.lerp(buf, mom), group["ns_steps"])  # Nesterov
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr * max(1.0, p.size(-2) / p.size(-1)) ** 0.5)


def build_optimizers(model):
    scale = (D_MODEL / 768) ** -0.5  # width scaling of the AdamW learning rates
    matrices = [p for p in model.blocks.parameters() if p.ndim == 2]
    scalars = [p for p in model.blocks.parameters() if p.ndim < 2]  # norms/gains/biases, if any
    groups = [dict(params=scalars, lr=LR * scale, weight_decay=0.0)]
    if model.lm_head is None:  # tied: the embedding is also the head (no decay on embeddings)
        groups.append(dict(params=[model.wte.weight], lr=LR * scale, weight_decay=0.0))
    else:
        groups.append(dict(params=[model.wte.weight], lr=EMBED_LR * scale, weight_decay=0.0))
        groups.append(dict(params=[model.lm_head.weight], lr=LR * scale,
                           weight_decay=WEIGHT_DECAY))
    if not USE_MUON:
        groups.insert(0, dict(params=matrices, lr=LR * scale, weight_decay=WEIGHT_DECAY))
    adamw = torch.optim.AdamW([g for g in groups if g["params"]],
                              betas=(ADAM_BETA1, ADAM_BETA2), eps=1e-10)
    optimizers = [adamw]
    if USE_MUON:
        optimizers.insert(0, Muon(matrices, lr=MUON_LR, momentum=MUON_MOMENTUM,
                                  weight_decay=WEIGHT_DECAY))
    for opt in optimizers:
        for g in opt.param_groups:
            g["initial_lr"] = g["lr"]
    return optimizers  # optimizers[0].param_groups[0]: the transformer matrices


def lr_multiplier(progress):
    """Warm-up, constant, linear warm-down; progress = fraction of the budget done."""
    if progress < WARMUP_FRAC:
        return progress / WARMUP_FRAC
    if progress > 1 - WARMDOWN_FRAC:
        frac = (1 - progress) / WARMDOWN_FRAC
        return frac + (1 - frac) * FINAL_LR_FRAC
    return 1.0


# ---------------------------------------------------------------------------------------------
# Device and reporting helpers

PEAK_BF16_FLOPS = [  # dense bf16 tensor-core peak by GPU name (first match wins)
    (r"GH200|H200", 989.5e12),
    (r"H100.*PCIe", 756e12),
    (r"H100", 989.5e12),
    (r"B200", 2250e12),
    (r"A100", 312e12),
    (r"L40S", 362.05e12),
    (r"RTX 4090", 165.2e12),
    (r"RTX 3090", 71e12),
    (r"\bA10\b", 125e12),
    (r"\bL4\b", 121e12),
]


def pick_device():
    if os.environ.get("OVERNIGHT_DEVICE"):
        return torch.device(os.environ["OVERNIGHT_DEVICE"])
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def peak_flops(device):
    if device.type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(device)
    return next((f for pat, f in PEAK_BF16_FLOPS if re.search(pat, name)), float("nan"))


def peak_memory_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


# ---------------------------------------------------------------------------------------------
# Training


def main():
    tokens_per_step = BATCH_SIZE * SEQ_LEN
    budget_steps = step_budget(tokens_per_step)  # None: a time budget
    budget_s = time_budget_s() if budget_steps is None else float("inf")
    seed = int(os.environ.get("OVERNIGHT_SEED", "42"))
    device = pick_device()
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    elif device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        asked = os.environ.get("OMP_NUM_THREADS", "")  # one thread beats two on a busy machine
        torch.set_num_threads(int(asked) if asked.isdigit() and int(asked) > 0 else cores or 1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    untimed_steps = 10 if device.type == "cuda" else 3  # compile / warm-up, not on the clock

    model = GPT().to(device)
    optimizers = build_optimizers(model)
    train_model = torch.compile(model) if device.type == "cuda" else model
    num_params = sum(p.numel() for p in model.parameters())
    batches = make_batches("train", BATCH_SIZE, SEQ_LEN, device, seed)
    print(f"device {device} | data {data_source()} | params {num_params / 1e6:.2f}M | "
          f"tokens/step {tokens_per_step} | budget "
          f"{f'{budget_s:g}s' if budget_steps is None else f'{budget_steps} steps'}", flush=True)

    step, training_time, smooth_loss = 0, 0.0, 0.0
    last_print_t, last_print_step = time.time(), 0
    x, y = next(batches)
    while True:
        done_frac = training_time / budget_s if budget_steps is None else step / budget_steps
        mult = lr_multiplier(min(done_frac, 1.0))
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["initial_lr"] * mult
        t0 = time.time()
        with autocast:
            logits = train_model(x)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB_SIZE), y.view(-1))
        loss.backward()
        x, y = next(batches)  # overlaps with the device finishing the backward pass
        if GRAD_CLIP > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        loss_f = loss.item()  # also synchronises the device, so dt is real
        dt = time.time() - t0
        if not math.isfinite(loss_f) or loss_f > 100:
            print("FAIL", flush=True)
            sys.exit(1)
        if step >= untimed_steps:
            training_time += dt
        step += 1
        if step == 1:
            gc.collect()
            gc.freeze()
            gc.disable()  # avoid GC pauses in the loop
        smooth_loss = 0.9 * smooth_loss + 0.1 * loss_f
        done = (step >= budget_steps if budget_steps is not None
                else step > untimed_steps and training_time >= budget_s)
        now = time.time()
        if now - last_print_t >= 2.0 or done or step == 1:
            tok_s = (step - last_print_step) * tokens_per_step / max(now - last_print_t, 1e-9)
            lr_now = optimizers[0].param_groups[0]["lr"]
            print(f"step {step} | loss {smooth_loss / (1 - 0.9**step):.4f} | lr {lr_now:.1e} | "
                  f"tok/s {tok_s:.0f} | elapsed {training_time:.1f}s", flush=True)
            last_print_t, last_print_step = now, step
        if done:
            break

    timed_tokens = max(step - untimed_steps, 0) * tokens_per_step
    mfu = 100 * model.flops_per_token() * timed_tokens / max(training_time, 1e-9) / \
        peak_flops(device)
    # saved before evaluating: a crash in the evaluation then loses no training (evaluate.py)
    save_checkpoint(model, {"training_seconds": round(training_time, 1),
                            "peak_memory_mb": round(peak_memory_mb(device), 1),
                            "mfu_percent": round(mfu, 2),
                            "total_tokens_M": round(step * tokens_per_step / 1e6, 3),
                            "num_steps": step, "num_params_M": round(num_params / 1e6, 2),
                            "depth": DEPTH})
    val_bpb = evaluate_bpb(model, device)
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_time:.1f}")
    print(f"total_seconds:    {time.time() - T_START:.1f}")
    print(f"peak_memory_mb:   {peak_memory_mb(device):.1f}")
    print(f"mfu_percent:      {mfu:.2f}")
    print(f"total_tokens_M:   {step * tokens_per_step / 1e6:.3f}")
    print(f"num_steps:        {step}")
    print(f"num_params_M:     {num_params / 1e6:.2f}")
    print(f"depth:            {DEPTH}")


if __name__ == "__main__":
    main()
