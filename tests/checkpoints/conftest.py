"""Real torch checkpoints for the checkpoint tests: a tiny transformer-shaped model + AdamW."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d // 2, bias=False)
        self.wv = nn.Linear(d, d // 2, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = nn.RMSNorm(d)
        self.w1 = nn.Linear(d, 3 * d, bias=False)
        self.w2 = nn.Linear(3 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        x = x + self.wo(self.wq(h) * torch.cat([self.wk(h), self.wv(h)], -1))
        return x + self.w2(torch.relu(self.w1(self.ffn_norm(x))))


class TinyLM(nn.Module):
    """Embedding, N blocks, norm, output: the parameter names of a llama-style model."""

    def __init__(self, vocab: int = 96, d: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def trained(seed: int = 0, **kw: int) -> tuple[TinyLM, torch.optim.Optimizer]:
    """A model after one AdamW step (so the optimizer holds exp_avg / exp_avg_sq)."""
    torch.manual_seed(seed)
    model = TinyLM(**kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 96, (2, 8))
    model(tokens).float().pow(2).mean().backward()
    opt.step()
    return model, opt


def state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def save_dcp(path: Path, model: nn.Module, opt: torch.optim.Optimizer | None = None) -> Path:
    """dcp.async_save of {"model", "optim"} to ``path`` (single process, no process group)."""
    import torch.distributed.checkpoint as dcp

    sd = state(model, opt) if opt is not None else {"model": model.state_dict()}
    fut = dcp.async_save(sd, checkpoint_id=str(path))
    fut.result()
    return path


@pytest.fixture(scope="session")
def tiny_full_dcp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A DCP step dir with model + AdamW state, and the model's source state dict."""
    root = tmp_path_factory.mktemp("dcp")
    model, opt = trained()
    save_dcp(root / "step-10", model, opt)
    return root / "step-10", {k: v.detach().clone() for k, v in model.state_dict().items()}
