"""diffusers' SD3Transformer2DModel on the shapes of benches/mmdit.rs: forward and LoRA
forward+backward, first call and median of later calls.

python benches/torch_mmdit.py [--size preset|sd35-medium] [--batch 2] [--device cpu|cuda]
                              [--dtype f32|tf32|bf16] [--threads 2] [--iters 10]

LoRA rank 32 on the joint attention's projections (the crate's default targets) through peft (diffusers' `add_adapter`), as the
Rust bench; gradients of the adapters only.
"""

import argparse
import statistics
import time

import torch
from diffusers import SD3Transformer2DModel

SIZES = {
    "preset": dict(
        config=dict(
            sample_size=32, patch_size=2, in_channels=16, num_layers=4, attention_head_dim=64,
            num_attention_heads=4, joint_attention_dim=256, caption_projection_dim=256,
            pooled_projection_dim=128, out_channels=16, pos_embed_max_size=32,
            dual_attention_layers=(0, 1), qk_norm="rms_norm",
        ),
        latent=(16, 32, 32), text=(64, 256), pooled=128,
    ),
    "sd35-medium": dict(
        config=dict(
            sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
            num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
            pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
            dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
        ),
        latent=(16, 64, 64), text=(333, 4096), pooled=2048,
    ),
}


def timed(iters, f, sync):
    def once():
        t = time.perf_counter()
        f()
        sync()
        return time.perf_counter() - t

    first = once()
    return first * 1e3, statistics.median(once() for _ in range(iters)) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=SIZES, default="preset")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["f32", "tf32", "bf16"], default="f32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = args.dtype == "tf32"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    s = SIZES[args.size]
    model = SD3Transformer2DModel(**s["config"]).to(dev, dtype)
    b = args.batch
    x = dict(
        hidden_states=torch.randn(b, *s["latent"], device=dev, dtype=dtype),
        encoder_hidden_states=torch.randn(b, *s["text"], device=dev, dtype=dtype),
        pooled_projections=torch.randn(b, s["pooled"], device=dev, dtype=dtype),
        timestep=torch.full((b,), 464.88, device=dev),
        return_dict=False,
    )

    def fwd():
        with torch.no_grad():
            model(**x)

    f = timed(args.iters, fwd, sync)
    from peft import LoraConfig

    model.requires_grad_(False)
    targets = [f"attn.{m}" for m in ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj",
                                      "add_k_proj", "add_v_proj", "to_add_out"]]
    model.add_adapter(LoraConfig(r=32, lora_alpha=32, target_modules=targets))

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        out = model(**x)[0]
        out.float().pow(2).mean().backward()

    l = timed(args.iters, fwd_bwd, sync)
    n = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
    print(f"torch {torch.__version__} {args.size} batch {b} {args.device} {args.dtype}, "
          f"{args.iters} iterations, {n} parameters, peak {peak:.1f} GiB")
    print(f"forward                first {f[0]:9.1f} ms   median {f[1]:8.1f} ms")
    print(f"LoRA forward+backward  first {l[0]:9.1f} ms   median {l[1]:8.1f} ms")


if __name__ == "__main__":
    main()
