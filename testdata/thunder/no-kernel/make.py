"""Makes inference.trace, inputs.safetensors and expected.safetensors: an inference (no-grad)
trace in which Thunder 0.2.6's torch executor runs whole ops tracepass has no kernel for
(layer_norm, group_norm, instance_norm, max_pool1d/2d, scaled_dot_product_attention, mse_loss,
nll_loss, addcdiv, copysign), each with its decomposition printed below it, and PyTorch's
outputs (`out.i` for the i-th returned value). Run with the pinned venv:
`python testdata/thunder/no-kernel/make.py` from this folder."""
import torch
import torch.nn.functional as F
import thunder
from safetensors.torch import save_file

torch.manual_seed(0)


def f(x, w, b, y, q, k, v, t, img, tgt):
    return (
        F.layer_norm(x, (8,), w, b, 1e-5),
        F.rms_norm(x, (8,), w, 1e-6),
        F.group_norm(img, 2, None, None, 1e-5),
        F.instance_norm(img),
        F.max_pool1d(img.flatten(2), 2),
        F.max_pool2d(img, 2),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.mse_loss(x, y),
        F.cross_entropy(x, tgt),
        F.glu(x, -1),
        torch.addcdiv(x, y, t, value=0.5),
        torch.copysign(x, y),
    )


args = [
    torch.randn(4, 8), torch.randn(8), torch.randn(8), torch.randn(4, 8),
    torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4),
    torch.rand(4, 8) + 1, torch.randn(2, 4, 6, 6), torch.randint(0, 8, (4,)),
]
jf = thunder.jit(f)
outs = jf(*args)
trace = thunder.last_traces(jf)[-1]
open("inference.trace", "w").write(str(trace))
save_file({p.name: a.contiguous() for p, a in zip(trace.args, args)}, "inputs.safetensors")
save_file({f"out.{i}": o.contiguous() for i, o in enumerate(outs)}, "expected.safetensors")
