"""diffusers' SD3Transformer2DModel on the CPU, the configuration of benches/mmdit.rs.

python benches/torch_mmdit.py [--threads 2] [--iters 10]
"""

import argparse
import statistics
import time

import torch
from diffusers import SD3Transformer2DModel

CONFIG = dict(
    sample_size=32,
    patch_size=2,
    in_channels=16,
    num_layers=4,
    attention_head_dim=64,
    num_attention_heads=4,
    joint_attention_dim=256,
    caption_projection_dim=256,
    pooled_projection_dim=128,
    out_channels=16,
    pos_embed_max_size=32,
    dual_attention_layers=(0, 1),
    qk_norm="rms_norm",
)


def timed(iters, f):
    f()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, statistics.mean(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = SD3Transformer2DModel(**CONFIG)
    x = dict(
        hidden_states=torch.randn(2, 16, 32, 32),
        encoder_hidden_states=torch.randn(2, 64, 256),
        pooled_projections=torch.randn(2, 128),
        timestep=torch.tensor([1000.0, 464.88]),
        return_dict=False,
    )

    def fwd():
        with torch.no_grad():
            model(**x)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        out = model(**x)[0]
        out.pow(2).mean().backward()

    f = timed(args.iters, fwd)
    b = timed(args.iters, fwd_bwd)
    n = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} CPU, {args.threads} threads, {args.iters} iterations, {n} parameters")
    print(f"forward           median {f[0]:8.1f} ms   mean {f[1]:8.1f} ms")
    print(f"forward+backward  median {b[0]:8.1f} ms   mean {b[1]:8.1f} ms")


if __name__ == "__main__":
    main()
