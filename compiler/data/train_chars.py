"""Trains the small character-level language model that the text generation demo runs (`/generate`), and exports it
with its KV cache as `chars.onnx`, its characters as `chars.json`.

The text is this repository's own prose: `chars.txt`, the README and docs/*.md joined and written in plain ASCII
(`--refresh-text` rewrites it from the current docs; training reads the shipped copy, so a run gives the same model
whatever the docs say since). The network is a tiny GPT in plain torch: learned character and position embeddings,
LAYERS pre-norm blocks of causal self-attention (HEADS heads) and a GELU MLP, a final LayerNorm and a linear head
over the characters. Training is seeded and runs on torch's CPU with a fixed thread count, STEPS steps of AdamW on
random windows of CONTEXT characters: `python -m compiler.data.train_chars` (about two minutes on two cores).

The export is a decoder with its cache in the form compiler/generate.py reads (as `real_zoo.export_with_cache`
writes one): inputs `input_ids` int64[1, seq], `attention_mask` int64[1, total] and `past_key_values.<layer>.<key|
value>` float32[1, HEADS, past, WIDTH / HEADS]; outputs `logits` float32[1, seq, characters] and `present.<layer>.<key|
value>` float32[1, HEADS, total, WIDTH / HEADS]. Compile it with `dims()`: past in 0..CONTEXT - 1, seq in 1..CONTEXT,
total = past + seq.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import onnx

DATA = Path(__file__).parent
MODEL_PATH = DATA / "chars.onnx"
VOCABULARY_PATH = DATA / "chars.json"
TEXT_PATH = DATA / "chars.txt"
REPOSITORY = DATA.parent.parent

SEED = 0
CONTEXT = 128
WIDTH = 64
HEADS = 4
LAYERS = 3
STEPS = 2000
BATCH_SIZE = 32
LEARNING_RATE = 6e-3
WARMUP = 100
THREADS = 2

# Characters of the docs outside printable ASCII, as the plain text that stands for them.
ASCII = {
    "§": "S",
    "±": "+-",
    "²": "^2",
    "³": "^3",
    "µ": "u",
    "·": ".",
    "½": "1/2",
    "×": "x",
    "÷": "/",
    "ᵀ": "^T",
    "–": "-",
    "—": "--",
    "…": "...",
    "→": "->",
    "−": "-",
    "√": "sqrt",
    "≤": "<=",
    "≥": ">=",
    "│": "|",
    "▼": "v",
}


def plain(text: str) -> str:
    """`text` in printable ASCII and newlines: the characters above spelt out, tabs as spaces, anything else dropped."""
    text = "".join(ASCII.get(character, character) for character in text.replace("\t", "    "))
    return "".join(character for character in text if character == "\n" or " " <= character <= "~")


def refresh_text(path: Path = TEXT_PATH) -> Path:
    """Rewrite the training text from README.md and docs/*.md (in name order) as they are now."""
    sources = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
    path.write_text("\n\n".join(plain(source.read_text(encoding="utf-8")).strip() for source in sources) + "\n")
    return path


def load_text(path: Path = TEXT_PATH) -> str:
    return path.read_text(encoding="ascii")


def vocabulary(text: str) -> list[str]:
    """The model's characters: every one the text holds, in code point order; a character's index is its token."""
    return sorted(set(text))


def encode(text: str, characters: list[str]) -> list[int]:
    """Token ids of `text`, leaving out characters the model does not know (the page does the same)."""
    index = {character: token for token, character in enumerate(characters)}
    return [index[character] for character in text if character in index]


def decode(tokens, characters: list[str]) -> str:
    return "".join(characters[int(token)] for token in tokens)


def dims(context: int = CONTEXT) -> dict:
    """The symbolic sizes to compile the export with: a cache of 0..context - 1 characters, 1..context new ones."""
    return {"past": (0, context - 1), "seq": (1, context), "total": "past+seq"}


def load_vocabulary(path: Path = VOCABULARY_PATH) -> dict:
    """chars.json: {"vocabulary": [characters by token], "context": the most characters one run attends to, ...}."""
    return json.loads(path.read_text())


# ---- the network ---------------------------------------------------------------------------------------------


def _network(vocabulary_size: int, context: int, width: int, heads: int, layers: int):
    import torch
    from torch import nn
    from torch.nn import functional

    depth = width // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.norm2 = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x, allowed, past_key, past_value):
            batch, seq, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
            q, k, v = (t.reshape(batch, seq, heads, depth).transpose(1, 2) for t in (q, k, v))
            keys = torch.cat([past_key, k], dim=2)
            values = torch.cat([past_value, v], dim=2)
            scores = (q @ keys.transpose(2, 3)) * (1.0 / math.sqrt(depth))
            scores = torch.where(allowed, scores, torch.full_like(scores, -1e9))
            attended = functional.softmax(scores, dim=-1) @ values
            x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
            x = x + self.down(functional.gelu(self.up(self.norm2(x))))
            return x, keys, values

    class CharGPT(nn.Module):
        """forward(ids [B, seq], mask [B, past + seq] of 1s and 0s, *past (key, value per layer) [B, heads, past,
        depth]) -> (logits [B, seq, vocabulary], *present [B, heads, past + seq, depth])."""

        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocabulary_size, width)
            self.positions = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocabulary_size)

        def forward(self, input_ids, attention_mask, *past):
            seq, cached = input_ids.shape[1], past[0].shape[2]
            positions = torch.arange(seq, device=input_ids.device) + cached
            x = self.tokens(input_ids) + self.positions(positions)
            keys_at = torch.arange(cached + seq, device=input_ids.device)
            causal = keys_at[None, :] <= positions[:, None]  # [seq, total]: a position sees itself and before
            allowed = causal[None, None] & (attention_mask[:, None, None, :] > 0)
            present = []
            for layer, block in enumerate(self.blocks):
                x, keys, values = block(x, allowed, past[2 * layer], past[2 * layer + 1])
                present += [keys, values]
            return (self.head(self.norm(x)), *present)

    return CharGPT()


def empty_cache(batch: int = 1, heads: int = HEADS, width: int = WIDTH, layers: int = LAYERS) -> list:
    import torch

    return [torch.zeros((batch, heads, 0, width // heads)) for _ in range(2 * layers)]


def train(text: str, steps: int = STEPS, verbose: bool = True):
    """AdamW with a warm-up and cosine decay on random windows of the text; seeded, on THREADS threads, so the same
    weights come out on every run on a machine. Gives (the network, the characters, the last steps' mean loss)."""
    import torch
    from torch.nn import functional

    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    characters = vocabulary(text)
    data = torch.tensor(encode(text, characters), dtype=torch.int64)
    network = _network(len(characters), CONTEXT, WIDTH, HEADS, LAYERS)
    decay = [p for name, p in network.named_parameters() if p.dim() >= 2 and "positions" not in name]
    other = [p for name, p in network.named_parameters() if not (p.dim() >= 2 and "positions" not in name)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}], lr=LEARNING_RATE
    )
    generator = torch.Generator().manual_seed(SEED)
    mask = torch.ones((BATCH_SIZE, CONTEXT), dtype=torch.int64)
    past = empty_cache(BATCH_SIZE)
    losses, started = [], time.perf_counter()
    network.train()
    for step in range(steps):
        rate = LEARNING_RATE * min(1.0, (step + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimizer.param_groups:
            group["lr"] = rate
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH_SIZE,), generator=generator)
        windows = torch.stack([data[start : start + CONTEXT + 1] for start in starts.tolist()])
        logits = network(windows[:, :-1], mask, *past)[0]
        loss = functional.cross_entropy(logits.reshape(-1, len(characters)), windows[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if verbose and ((step + 1) % 100 == 0 or step + 1 == steps):
            recent = float(np.mean(losses[-100:]))
            print(f"step {step + 1}/{steps}: loss {recent:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    network.eval()
    return network, characters, float(np.mean(losses[-100:]))


def sample(network, characters: list[str], prompt: str, count: int) -> str:
    """`count` characters after `prompt`, greedily, by rerunning the whole window in torch (no cache)."""
    import torch

    tokens = encode(prompt, characters)
    with torch.no_grad():
        for _ in range(count):
            window = torch.tensor([tokens[-CONTEXT:]])
            logits = network(window, torch.ones_like(window), *empty_cache())[0]
            tokens.append(int(logits[0, -1].argmax()))
    return decode(tokens[len(encode(prompt, characters)) :], characters)


def export(network, characters: list[str], path: Path = MODEL_PATH, vocabulary_path: Path = VOCABULARY_PATH) -> None:
    """The network as an ONNX decoder with its KV cache (the module docstring's contract), and its characters."""
    import torch

    names = [f"past_key_values.{layer}.{kind}" for layer in range(LAYERS) for kind in ("key", "value")]
    outputs = ["logits", *(f"present.{layer}.{kind}" for layer in range(LAYERS) for kind in ("key", "value"))]
    generator = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, len(characters), (1, 3), generator=generator)
    mask = torch.ones((1, 8), dtype=torch.int64)
    past = [torch.randn((1, HEADS, 5, WIDTH // HEADS), generator=generator) for _ in names]
    sequence = torch.export.Dim("seq", min=1, max=CONTEXT)
    cached = torch.export.Dim("past", min=0, max=CONTEXT - 1)
    total = torch.export.Dim("total", min=1, max=2 * CONTEXT - 1)
    dynamic = {"input_ids": {1: sequence}, "attention_mask": {1: total}, "past": tuple({2: cached} for _ in names)}
    with torch.no_grad():
        program = torch.onnx.export(
            network,
            (ids, mask, *past),
            input_names=["input_ids", "attention_mask", *names],
            output_names=outputs,
            dynamic_shapes=dynamic,
            dynamo=True,
            optimize=True,
        )
    model = program.model_proto
    model.producer_name = "tessel-train-chars"
    # the exporter's notes on where each node came from (stack traces, module paths): a third of the file otherwise
    del model.metadata_props[:]
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    about = {
        "vocabulary": characters,
        "context": CONTEXT,
        "width": WIDTH,
        "heads": HEADS,
        "layers": LAYERS,
        "text": TEXT_PATH.name,
    }
    vocabulary_path.write_text(json.dumps(about, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the character-level text model and write it as ONNX.")
    parser.add_argument("-o", "--output", type=Path, default=MODEL_PATH, help=f"where to write (default {MODEL_PATH})")
    parser.add_argument("--vocabulary", type=Path, default=None, help="where to write the characters (default: beside)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument(
        "--refresh-text", action="store_true", help=f"rewrite {TEXT_PATH.name} from README.md and docs/*.md first"
    )
    args = parser.parse_args(argv)
    if args.refresh_text:
        print(f"wrote {refresh_text()}")
    text = load_text()
    started = time.perf_counter()
    network, characters, loss = train(text, args.steps)
    seconds = time.perf_counter() - started
    vocabulary_path = args.vocabulary or args.output.with_suffix(".json")
    export(network, characters, args.output, vocabulary_path)
    print(f"trained {args.steps} steps in {seconds:.0f} s to a loss of {loss:.3f} over {len(characters)} characters")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes) and {vocabulary_path}")
    prompt = "The compiler "
    print(f"greedy sample: {prompt!r} -> {sample(network, characters, prompt, 80)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
